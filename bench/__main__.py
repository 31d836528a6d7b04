"""clusterddp benchmarks: ``python -m bench`` (or ``make bench``). Every figure is a ratio against a baseline
measured in the same run; whole commands are timed with hyperfine, in-process work with timeit. Nothing here
asserts a time. Results go to bench/RESULTS.md.

    python -m bench                 # everything that this machine allows
    python -m bench --only 1,2,3    # some items
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PY = sys.executable
TORCHX = BENCH / ".venv-torchx" / "bin" / "torchx"
CLUSTER_CONF = Path(os.environ.get("CLUSTERDDP_CLUSTER_DIR", "/tmp/clusterddp-cluster")) / "slurm.conf"

Row = Tuple[str, str, str, str]  # item, what, result, target


def hyperfine(commands: Dict[str, str], runs: int, warmup: int = 1, cwd: Optional[Path] = None,
              env: Optional[dict] = None, prepare: Optional[str] = None,
              no_shell: bool = False) -> Dict[str, Tuple[float, float]]:
    """name -> (mean s, stddev s), measured by hyperfine (``no_shell``: commands started without a shell, -N;
    the shell's own start-up otherwise adds its noise to each)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        argv = ["hyperfine", "--style", "none", "--warmup", str(warmup), "--runs", str(runs), "--export-json",
                out.name] + (["--prepare", prepare] if prepare else []) + (["-N"] if no_shell else [])
        for name, cmd in commands.items():
            argv += ["--command-name", name, cmd]
        subprocess.run(argv, check=True, cwd=cwd, env=env, stdout=subprocess.DEVNULL)
        data = json.load(open(out.name))
    return {r["command"]: (r["mean"], r["stddev"]) for r in data["results"]}


def fmt(mean: float, std: float) -> str:
    return f"{mean * 1000:.0f} ± {std * 1000:.0f} ms"


def item1_cli(rows: List[Row], work: Path) -> None:
    (work / "train.py").write_text("print('hi')\n")
    cmds = {
        "floor: python -c 'import click, jinja2'": f"{PY} -c 'import click, jinja2'",
        "clusterddp submit --dry-run": f"{PY} -m clusterddp submit --dry-run --nodes 2 --gpus 8 train.py",
        "clusterddp render": f"{PY} -m clusterddp render --nodes 2 --gpus 8 train.py",
        "submitit: same job's sbatch text": (
            f"{PY} -c \"import submitit.slurm.slurm as s; s._make_sbatch_string(command='python train.py', "
            "folder='x', nodes=2, ntasks_per_node=8, gpus_per_node=8)\""),
    }
    if TORCHX.exists():
        cmds["torchx run --dryrun -s slurm dist.ddp -j 2x8"] = \
            f"{TORCHX} run --dryrun -s slurm dist.ddp -j 2x8 --script train.py"
    res = hyperfine(cmds, runs=100, warmup=5, cwd=work, no_shell=True)
    floor = res["floor: python -c 'import click, jinja2'"][0]
    dry = res["clusterddp submit --dry-run"][0]
    for name, (mean, std) in res.items():
        target = ""
        if name.startswith("clusterddp"):
            target = "<= 1.2x floor"
        rows.append(("1", name, f"{fmt(mean, std)} = {mean / floor:.2f}x floor", target))
    if "torchx run --dryrun -s slurm dist.ddp -j 2x8" in res:
        tx = res["torchx run --dryrun -s slurm dist.ddp -j 2x8"][0]
        rows.append(("1", "torchx dry-run / clusterddp dry-run", f"{tx / dry:.2f}x", ">= 3x"))
    else:
        rows.append(("1", "torchx dry-run", "skipped: bench/.venv-torchx missing (make bench creates it)", ""))
    out = subprocess.run([PY, "-X", "importtime", "-c", "import clusterddp.cli"], capture_output=True, text=True,
                         cwd=ROOT).stderr
    costs = []
    for line in out.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|\s+(.*)", line)
        if m:
            costs.append((int(m.group(2)), m.group(3).strip()))
    top = sorted(costs, reverse=True)[:5]
    rows.append(("1", "import clusterddp.cli: top 5 cumulative import costs",
                 "; ".join(f"{name} {us / 1000:.1f} ms" for us, name in top), "no torch, no submitit"))
    imported = subprocess.run([PY, "-c", "import sys, clusterddp.cli; print('torch' in sys.modules, "
                               "'submitit' in sys.modules)"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    rows.append(("1", "torch / submitit imported by the CLI", imported, "False False"))


def item2_render(rows: List[Row]) -> None:
    sys.path.insert(0, str(ROOT))
    from clusterddp import JobSpec
    from clusterddp.backends.slurm.script import render

    specs = [JobSpec("train.py", nodes=1 + i % 64, gpus_per_node=i % 9, job_name=f"job{i}",
                     launcher=("torchrun", "srun", "spawn")[i % 3], time=f"{1 + i % 48}:00:00",
                     env=(("RUN", str(i)),), args=("--seed", str(i))) for i in range(1000)]
    render(specs[0])  # template compilation is a one-off cost
    best = min(timeit.repeat(lambda: [render(s) for s in specs], number=1, repeat=5))
    rows.append(("2", "render 1,000 different job specs, one process", f"{best:.3f} s", "< 1 s"))
    small, big = JobSpec("t.py", nodes=2, gpus_per_node=8), JobSpec("t.py", nodes=4096, gpus_per_node=8)
    t_small = min(timeit.repeat(lambda: render(small), number=200, repeat=5)) / 200
    t_big = min(timeit.repeat(lambda: render(big), number=200, repeat=5)) / 200
    rows.append(("2", "render a 4,096-node spec / a 2-node spec",
                 f"{t_big * 1e6:.0f} us / {t_small * 1e6:.0f} us = {t_big / t_small:.2f}x", "~1x"))


def item3_hostlist(rows: List[Row], work: Path) -> None:
    from clusterddp.hostlist import expand, first

    cases = {"node[1-65536]": 65536, "a[1-1000]b[1-1000]": 1_000_000}
    for text, n in cases.items():
        t = min(timeit.repeat(lambda text=text: expand(text), number=1, repeat=3))
        assert len(expand(text)) == n
        rows.append(("3", f"expand {text} ({n:,} names), clusterddp.hostlist", f"{t * 1000:.0f} ms", ""))
    if shutil.which("scontrol") and CLUSTER_CONF.exists():
        env = dict(os.environ, SLURM_CONF=str(CLUSTER_CONF))
        res = hyperfine({f"scontrol {t}": f"scontrol show hostnames '{t}' > /dev/null" for t in cases}, runs=3,
                        cwd=work, env=env)
        res_py = hyperfine({f"python {t}": f"{PY} -c \"from clusterddp.hostlist import expand; "
                            f"print(chr(10).join(expand('{t}')))\" > /dev/null" for t in cases}, runs=3, cwd=ROOT)
        for t in cases:
            ours, theirs = res_py[f"python {t}"][0], res[f"scontrol {t}"][0]
            rows.append(("3", f"{t}: scontrol show hostnames / python -m-style expand (whole command)",
                         f"{theirs * 1000:.0f} ms / {ours * 1000:.0f} ms = {theirs / ours:.2f}x", ""))
    else:
        rows.append(("3", "scontrol show hostnames", "skipped: no Slurm configuration (tests/slurm/cluster.sh up)",
                     ""))
    short = "node[1-4]"
    long_ = ",".join(f"g{i}n[1-65536]" for i in range(20000))  # 1.3 billion names, 300k characters
    t_short = min(timeit.repeat(lambda: first(short), number=2000, repeat=5)) / 2000
    t_long = min(timeit.repeat(lambda: first(long_), number=2000, repeat=5)) / 2000
    rows.append(("3", "first host: 20,000-group list (1.3e9 names) / 4-name list",
                 f"{t_long * 1e6:.1f} us / {t_short * 1e6:.1f} us = {t_long / t_short:.2f}x", "O(1): ~1x"))


def item4_startup(rows: List[Row], work: Path) -> None:
    script = BENCH / "first_allreduce.py"
    agent = (f"{PY} -m torch.distributed.run --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d "
             f"--rdzv-endpoint=127.0.0.1:29731 --rdzv-id=bench {script}")
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    res = hyperfine({
        "bare torchrun x2": f"bash -c '{agent} > /dev/null 2>&1 & {agent} > /dev/null 2>&1; wait'",
        "clusterddp submit --local": (f"{PY} -m clusterddp submit --local --nodes 2 --procs-per-node 2 "
                                      f"--output-dir {work}/runs {script} > /dev/null 2>&1"),
    }, runs=10, warmup=1, cwd=work, env=env)
    bare, ours = res["bare torchrun x2"], res["clusterddp submit --local"]
    rows.append(("4", "start-up to first all-reduce, 2 nodes x 2 ranks, CPU: local backend / bare torchrun",
                 f"{fmt(*ours)} / {fmt(*bare)} = {ours[0] / bare[0]:.2f}x", "<= 1.1x"))


def item5_cluster(rows: List[Row], work: Path) -> None:
    if not (shutil.which("sbatch") and CLUSTER_CONF.exists()):
        rows.append(("5", "submit to all ranks joined, test cluster", "skipped: no test cluster "
                     "(sudo tests/slurm/cluster.sh up)", ""))
        return
    env = dict(os.environ, SLURM_CONF=str(CLUSTER_CONF))
    shutil.copy(BENCH / "first_allreduce.py", work / "job.py")
    hand = {
        "torchrun": ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=2 --output=hand-%j.out\n"
                     'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
                     "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))\n"
                     "srun torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d "
                     '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" job.py\n'),
        "srun": ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2 --gpus-per-node=2 --output=hand-%j.out\n"
                 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
                 "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))\n"
                 "srun bash -c 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS exec python3 job.py'\n"),
    }
    for launcher, text in hand.items():
        (work / f"hand-{launcher}.sh").write_text(text)
        subprocess.run([PY, "-m", "clusterddp", "render", "--launcher", launcher, "--nodes", "2", "--gpus", "2",
                        "--no-requeue", "job.py", "-o", f"ours-{launcher}.sh"], cwd=work, check=True, env=env,
                       capture_output=True)
        # Timed: from sbatch until rank 0 has seen every rank in an all-reduce (it then creates the marker file).
        # `sbatch --wait` polls too coarsely (it read 10.0 s for everything here).
        marker = work / "joined"
        env["BENCH_MARKER"] = str(marker)
        wait_marker = f"while [ ! -e {marker} ]; do sleep 0.02; done"
        res = hyperfine({"hand": f"sbatch --parsable hand-{launcher}.sh > /dev/null && {wait_marker}",
                         "clusterddp": f"sbatch --parsable ours-{launcher}.sh > /dev/null && {wait_marker}"},
                        runs=6, warmup=1, cwd=work, env=env,
                        prepare=f"rm -f {marker}; while [ -n \"$(squeue -h)\" ]; do sleep 0.1; done")
        rows.append(("5", f"submit to all ranks joined, 2x2, {launcher}: clusterddp / hand-written",
                     f"{fmt(*res['clusterddp'])} / {fmt(*res['hand'])} = {res['clusterddp'][0] / res['hand'][0]:.2f}x",
                     "<= 1.1x"))


def _throughput(argv: List[str], env: dict, cwd: Path) -> float:
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=900)
    m = re.search(r"throughput ([0-9.]+) images/s", out.stdout)
    if not m:
        raise RuntimeError(f"no throughput in output of {argv}: {out.stdout[-500:]} {out.stderr[-1500:]}")
    return float(m.group(1))


def on_off(on: dict, off: dict, work: Path) -> Tuple[List[float], List[float]]:
    """examples/train_ddp.py's images/s, 2 ranks under torchrun, six times with ``on`` and six with ``off``
    interleaved, each first in turn (the first of a pair ran slower here); a fresh checkpoint directory each time
    (a second run would resume, not train)."""
    runs: Dict[str, List[float]] = {"on": [], "off": []}
    for i in range(6):
        for name in (("on", "off") if i % 2 == 0 else ("off", "on")):
            shutil.rmtree(work / "ck-on-off", ignore_errors=True)
            argv = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                    str(ROOT / "examples" / "train_ddp.py"), "--images", "8", "--epochs", "2", "--ckpt-dir",
                    str(work / "ck-on-off"), "--log-every", "1000"]
            runs[name].append(_throughput(argv, on if name == "on" else off, work))
    return runs["on"], runs["off"]


def item6_7_training(rows: List[Row], work: Path, which: set) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    knobs = ["--images", "8", "--epochs", "2"]

    def torchrun(n: int, script: str, extra: List[str]) -> List[str]:
        return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", script, *knobs, *extra]

    def ours_cmd() -> List[str]:  # a fresh checkpoint directory each time: a second run would resume, not train
        shutil.rmtree(work / "ck", ignore_errors=True)
        return torchrun(2, str(ROOT / "examples" / "train_ddp.py"), ["--ckpt-dir", str(work / "ck"),
                                                                     "--log-every", "1000"])
    if "6" in which:
        ours, raw = [], []
        for _ in range(5):  # interleaved, median of five
            ours.append(_throughput(ours_cmd(), env, work))
            raw.append(_throughput(torchrun(2, str(BENCH / "train_raw.py"), []), env, work))
        o, r = statistics.median(ours), statistics.median(raw)
        rows.append(("6", "train_ddp.py images/s, 2 ranks CPU: clusterddp.runtime / raw torch.distributed",
                     f"{o:.1f} / {r:.1f} = {o / r:.3f}", ">= 0.98"))
    if "7" in which:
        one, two = [], []
        for _ in range(5):
            shutil.rmtree(work / "ck1", ignore_errors=True)
            one.append(_throughput(torchrun(1, str(ROOT / "examples" / "train_ddp.py"),
                                            ["--ckpt-dir", str(work / "ck1"), "--log-every", "1000"]), env, work))
            two.append(_throughput(ours_cmd(), env, work))
        a, b = statistics.median(one), statistics.median(two)
        rows.append(("7", "scaling: 2 ranks x 1 thread vs 1 rank x 1 thread (efficiency = b / 2a)",
                     f"{b:.1f} vs {a:.1f} images/s = {b / (2 * a):.2f}", ">= 0.85 (2 cores: 1.0 max)"))


def item9_control_overhead(rows: List[Row], work: Path) -> None:
    """Step-time cost of the control plane (stack responder + hang watchdog) on examples/train_ddp.py."""
    base = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    idle = dict(base, CLUSTERDDP_HANG_TIMEOUT="0")  # no run directory, no watchdog: the thread has nothing to do
    idle.pop("CLUSTERDDP_RUN_DIR", None)
    (work / "run").mkdir(exist_ok=True)
    on = dict(base, CLUSTERDDP_HANG_TIMEOUT="900", CLUSTERDDP_RUN_DIR=str(work / "run"))

    with_it, without = on_off(on, idle, work)
    a, b = statistics.median(with_it), statistics.median(without)
    rows.append(("9", "train_ddp.py images/s, 2 ranks CPU: responder + watchdog on / off",
                 f"{a:.1f} / {b:.1f} = {a / b:.3f} (spread of single runs: {min(with_it + without):.1f}-"
                 f"{max(with_it + without):.1f})", "overhead < 1%"))
    cost = subprocess.run([PY, str(BENCH / "control_cost.py"), "10"], capture_output=True, text=True, check=True,
                          env=dict(base, PYTHONPATH=str(ROOT)), cwd=work, timeout=300).stdout.strip()
    rows.append(("9", "the control plane in-process, one rank beating as fast as it can for 10 s", cost,
                 "overhead < 1%"))


def item12_checkpoints(rows: List[Row], work: Path) -> None:
    """Step time with a checkpoint every 10 steps (about 400 MB each), background and written at save() against
    none: 1 rank (a core left for the writing thread, as on a GPU node whose CPU waits for the GPU) and 2 ranks
    (every core busy)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    env.pop("CLUSTERDDP_RUN_DIR", None)
    for ranks in (1, 2):
        times: Dict[str, List[float]] = {"none": [], "sync": [], "background": []}
        size, final = 0.0, []
        for i in range(3):  # interleaved, each mode first in turn; medians
            for mode in (["none", "sync", "background"] * 2)[i:i + 3]:
                shutil.rmtree(work / "ck", ignore_errors=True)
                out = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                                      str(BENCH / "checkpoint_cost.py"), mode, "30", "10", str(work / "ck")],
                                     capture_output=True, text=True, check=True, env=env, cwd=work,
                                     timeout=600).stdout
                result = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
                times[mode].append(result["step_s"])
                size = max(size, result["mb_per_checkpoint"])
                if mode == "background":
                    final.append(result["final_wait_s"])
        none, sync, background = (statistics.median(times[m]) for m in ("none", "sync", "background"))
        spread = min(t for ts in times.values() for t in ts), max(t for ts in times.values() for t in ts)
        rows.append(("12", f"step time, {ranks} rank(s) on 2 CPU cores, a {size:.0f} MB checkpoint every 10 steps: "
                     "background / none", f"{background * 1000:.0f} / {none * 1000:.0f} ms = {background / none:.3f} "
                     f"(then once per run, the last write: {statistics.median(final):.2f} s)", "within 5%"))
        rows.append(("12", f"the same, {ranks} rank(s), written before save() returns / none (runs' spread: "
                     f"{spread[0] * 1000:.0f}-{spread[1] * 1000:.0f} ms)",
                     f"{sync * 1000:.0f} / {none * 1000:.0f} ms = {sync / none:.3f}", ""))


def item10_stacks(rows: List[Row], work: Path) -> None:
    """Time from `clusterddp stacks` to the printed roll call of a hung 4-rank local job."""
    out = work / "hang-runs"
    job = subprocess.Popen([PY, "-m", "clusterddp", "submit", "--local", "--nodes", "2", "--procs-per-node", "2",
                            "--launcher", "srun", "--hang-timeout", "0", "--output-dir", str(out),
                            str(ROOT / "tests" / "scripts" / "hang.py"), "--", "--where", "before-allreduce"],
                           cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        import time

        deadline = time.monotonic() + 120
        run_dir: Optional[Path] = None
        while time.monotonic() < deadline:
            found = list(out.glob("hang-local-*/stacks/ranks"))
            if found and len(list(found[0].glob("rank-*.json"))) == 4:
                run_dir = found[0].parent.parent
                break
            time.sleep(0.5)
        if run_dir is None:
            raise RuntimeError("the hung job never started its 4 ranks")
        time.sleep(3)
        res = hyperfine({"stacks": f"{PY} -m clusterddp stacks {run_dir}", "floor": f"{PY} -m clusterddp --help"},
                        runs=10, cwd=work)
    finally:
        os.killpg(job.pid, 15)
        job.wait(timeout=60)
    rows.append(("10", "clusterddp stacks on a hung 4-rank job, to the printed roll call / clusterddp --help",
                 f"{fmt(*res['stacks'])} / {fmt(*res['floor'])} = {res['stacks'][0] / res['floor'][0]:.1f}x",
                 "< 30 s (ranks poll every 1 s)"))


def item11_ssh(rows: List[Row], work: Path) -> None:
    """`clusterddp status` of a remote cluster: over the shared SSH connection vs with a fresh login each time."""
    if os.geteuid() != 0 or not CLUSTER_CONF.is_file() or not Path("/run/netns/cddp-login").exists():
        rows.append(("11", "status over SSH, shared connection / fresh login", "skipped: needs root and the test "
                     "cluster (sudo tests/slurm/cluster.sh up)", ""))
        return
    sys.path.insert(0, str(ROOT))
    from tests import login_node

    config = login_node.start(work / "ssh")
    try:
        proj = work / "proj"
        proj.mkdir()
        (proj / "t.py").write_text("print('hi')\n")
        (proj / "clusterddp.toml").write_text(login_node.cluster_table("tc", "cddp-login", config, work / "home"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CLUSTERDDP_"))}
        env["XDG_STATE_HOME"] = str(work / "state")
        submit = subprocess.run([PY, "-m", "clusterddp", "submit", "--cluster", "tc", "--gpus", "0", "--no-check",
                                 "--sbatch-arg=--hold", "t.py"], cwd=proj, env=env, capture_output=True, text=True,
                                check=True)
        job = submit.stdout.strip()
        status = f"{PY} -m clusterddp status --cluster tc {job}"
        close = f"{PY} -c \"from clusterddp import clusters, remote; remote.close(clusters.by_name('tc'))\""
        shared = hyperfine({"shared": status}, runs=20, cwd=proj, env=env)["shared"]
        fresh = hyperfine({"fresh": status}, runs=20, cwd=proj, env=env, prepare=close)["fresh"]
        floor = hyperfine({"floor": f"{PY} -m clusterddp --help"}, runs=20, cwd=proj, env=env)["floor"]
        subprocess.run([PY, "-m", "clusterddp", "cancel", "--cluster", "tc", job], cwd=proj, env=env,
                       capture_output=True)
    finally:
        login_node.stop()
    rows.append(("11", "clusterddp status over SSH of a pending job (squeue + scontrol there): shared connection / "
                 "fresh login each time",
                 f"{fmt(*shared)} / {fmt(*fresh)} = {shared[0] / fresh[0]:.2f}x (clusterddp --help alone: "
                 f"{fmt(*floor)}; a login here is a local ed25519 key, no 2FA, no network latency)", "well under 1x"))


def item13_self_healing(rows: List[Row], work: Path) -> None:
    if not (shutil.which("sbatch") and CLUSTER_CONF.exists() and shutil.which("ip")):
        rows.append(("13", "a lost node, kill to training again", "skipped: no test cluster "
                     "(sudo tests/slurm/cluster.sh up)", ""))
        return
    from .self_healing import rows as healing

    os.environ["SLURM_CONF"] = str(CLUSTER_CONF)
    rows.extend(healing(work))


def item14_drill(rows: List[Row], work: Path) -> None:
    from .drill_cost import rows as drill

    rows.extend(drill(work))


def item15_sweep_calls(rows: List[Row], work: Path) -> None:
    if not (shutil.which("sbatch") and CLUSTER_CONF.exists()):
        rows.append(("15", "a sweep's Slurm commands", "skipped: no test cluster (sudo tests/slurm/cluster.sh up)", ""))
        return
    from .sweep_calls import rows as calls

    os.environ["SLURM_CONF"] = str(CLUSTER_CONF)
    rows.extend(calls(work))


def item16_observatory(rows: List[Row], work: Path) -> None:
    """Issue 42: step telemetry on / off; one `top` refresh over 64 ranks (bench/observatory.py)."""
    from .observatory import telemetry_cost, top_cost

    top_cost(rows, work)
    telemetry_cost(rows, work, ROOT, on_off)


def item17_peer_overhead(rows: List[Row], work: Path) -> None:
    """Issue 55: a step's cost with peer heal on and off, no fault (bench/peer_overhead.py)."""
    from .peer_overhead import rows as overhead

    rows.extend(overhead(work))


def item18_inplace_floor(rows: List[Row], work: Path) -> None:
    """Issue 55: design (a)'s floor (survivors stay, warm standbys) against the job's own start (inplace_floor.py)."""
    from .inplace_floor import rows as floor

    rows.extend(floor(work))


def item8_gpu(rows: List[Row]) -> None:
    rows.append(("8", "GPU: dp_vs_ddp.py and train_ddp.py on a GPU",
                 "skipped: no GPU on this machine", ""))


def machine() -> str:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        import torch

        tv = torch.__version__
    except ImportError:
        tv = "not installed"
    return (f"{platform.node()}: {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, Python "
            f"{platform.python_version()}, torch {tv}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18",
                   help="comma-separated item numbers")
    p.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone (--only: the "
                   "items go after the earlier runs as a section of their own)")
    args = p.parse_args()
    which = set(args.only.split(","))
    if not shutil.which("hyperfine") and which & {"1", "3", "4", "5", "10", "11"}:
        print("bench: hyperfine is needed (Debian: apt-get install hyperfine; make bench installs it)",
              file=sys.stderr)
        return 2
    rows: List[Row] = []
    steps: List[Tuple[str, Callable[[], None]]] = []
    with tempfile.TemporaryDirectory(prefix="clusterddp-bench-") as tmp:
        work = Path(tmp)
        steps = [("1", lambda: item1_cli(rows, work)), ("2", lambda: item2_render(rows)),
                 ("3", lambda: item3_hostlist(rows, work)), ("4", lambda: item4_startup(rows, work)),
                 ("5", lambda: item5_cluster(rows, work)), ("8", lambda: item8_gpu(rows)),
                 ("9", lambda: item9_control_overhead(rows, work)), ("10", lambda: item10_stacks(rows, work)),
                 ("11", lambda: item11_ssh(rows, work)), ("12", lambda: item12_checkpoints(rows, work)),
                 ("13", lambda: item13_self_healing(rows, work)), ("14", lambda: item14_drill(rows, work)),
                 ("15", lambda: item15_sweep_calls(rows, work)), ("16", lambda: item16_observatory(rows, work)),
                 ("17", lambda: item17_peer_overhead(rows, work)), ("18", lambda: item18_inplace_floor(rows, work))]
        steps.append(("6,7", lambda: item6_7_training(rows, work, which)))
        for number, run in steps:
            if set(number.split(",")) & which:
                print(f"bench: item {number} ...", file=sys.stderr, flush=True)
                try:
                    run()
                except (subprocess.CalledProcessError, RuntimeError, OSError) as exc:
                    rows.append((number, "failed", f"{type(exc).__name__}: {str(exc)[:200]}", ""))
    rows.sort(key=lambda r: int(r[0]))
    table = ["| # | what | result | target |", "|---|---|---|---|"]
    table += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    text = "\n".join(table)
    print(text)
    everything = which == set(p.get_default("only").split(","))
    if not args.no_write and everything:
        (BENCH / "RESULTS.md").write_text(
            f"# Benchmark results\n\n{datetime.date.today().isoformat()}, `python -m bench`, on {machine()}.\n"
            "Ratios compare commands measured in the same run (hyperfine for whole commands, timeit in-process); "
            "absolute times on these shared machines drift.\n\n" + text + "\n")
    elif not args.no_write:  # some items: a section of their own after the earlier runs (never over them)
        with open(BENCH / "RESULTS.md", "a", encoding="utf-8") as fh:
            fh.write(f"\n## Later run: items {args.only}\n\n{datetime.date.today().isoformat()}, `python -m bench "
                     f"--only {args.only}`, on {machine()}.\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
