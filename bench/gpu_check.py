"""``make gpu-check``: the NCCL path end to end on a machine with CUDA GPUs (a script, not a test).

1. the local backend, one node x all GPUs, on examples/train_ddp.py (bf16 AMP on); the observatory on that run
   (top --json with the GPU's numbers, the all-reduce wait, report);
2. device selection when every rank sees only its own GPU (the --gpus-per-task mask, CUDA_VISIBLE_DEVICES=i);
3. should_stop() and heartbeats inside torch.cuda.set_sync_debug_mode("error"): nothing synchronises the stream;
4. a hung rank found by clusterddp stacks on an NCCL job;
5. images/s of clusterddp.runtime against raw DDP (bench/train_raw.py), interleaved, in the same run;
6. the desk check's GPU-only items (bench/gpu_desk.py): sparse gradients and device_ids=None in wrap(), the CUDA
   random state per device across GPU layouts, the watchdog before torch's timeout at NCCL set-up, the dump
   directory of --local runs, --gpus 0 on an unmasked node, native bf16, distinct GPUs per rank;
7. --warm-start (issue 55) on CUDA: ranks forked from a warm server, under srun's and torchrun's lines, against
   cold starts of the same script (what a default-on for GPU jobs waits for).
Only the GPUs the environment gives (CUDA_VISIBLE_DEVICES) are used. Writes bench/RESULTS-gpu.md; exit code 1 when
a check failed, 2 without a GPU.

What the first GPU run must answer (the desk check's "possible" items that no CPU test can settle; issue 28):
- P1  the gloo control channel across nodes where the hostname resolves to 127.0.1.1 (multi-node: not here);
- P2  the watchdog's flight-recorder dump from the control thread: bounded in time, on the rank's own device;
- P3  which flight recorder `_dump_fr_trace` dumps in a CUDA build (gloo's or NCCL's), TORCH_FR_* names;
- P4  bf16 AMP on pre-Ampere GPUs (row "native bf16": train_ddp.py still turns AMP on where it is emulated);
- P5  should_stop()'s per-step gloo all-reduce at 64+ ranks (multi-node: not here);
- P7  TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 and the gloo side channel (needs torchcomms);
- P8  dp_vs_ddp's parent holding CUDA contexts on EXCLUSIVE_PROCESS GPUs;
- P10 whether images/s here is CPU-bound (row 5's ratio);
- P11 GPU sharing (shard/MPS) where ranks see one and the same GPU (row "distinct GPUs");
- P13 --gpu-request gpus-per-task and NCCL's intra-node P2P (compare with gpus-per-node);
- P14 the gloo mesh at ~1k ranks (file descriptors, the rendezvous window);
- P15 eager NCCL init (init_process_group(device_id=...)) and the gloo channel's eager connect.
"""
from __future__ import annotations

import datetime
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Tuple

import gpu_desk  # bench/ is this script's directory

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
Row = Tuple[str, str, str]  # check, result, verdict

PER_RANK = r'''
import json, os, sys, torch
from clusterddp import runtime
env = runtime.init(timeout=120)
dev = runtime.device()
props = torch.cuda.get_device_properties(dev)
model = runtime.wrap(torch.nn.Linear(64, 64))
x = torch.randn(32, 64, device=dev)
model(x).sum().backward()
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("error")
error = ""
try:
    for _ in range(20):
        runtime.should_stop()
        runtime.heartbeat()
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
torch.cuda.set_sync_debug_mode("default")
t = torch.ones(1, device=dev) * (env.rank + 1)
torch.distributed.all_reduce(t)
print("RESULT " + json.dumps({"rank": env.rank, "device": str(dev), "uuid": str(getattr(props, "uuid", props.name)),
      "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "sum": t.item(), "sync_error": error}), flush=True)
runtime.shutdown()
'''


def gpus() -> int:
    out = subprocess.run([PY, "-c", "import torch; print(torch.cuda.device_count())"], capture_output=True, text=True)
    return int(out.stdout.strip() or 0)


def run(argv: List[str], env: dict, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def check_train(rows: List[Row], n: int, work: Path) -> None:
    proc = run([PY, "-m", "clusterddp", "submit", "--local", "--nodes", "1", "--gpus", str(n), "--output-dir",
                str(work / "runs"), str(ROOT / "examples" / "train_ddp.py"), "--", "--epochs", "1", "--ckpt-dir",
                str(work / "ck-train")], dict(os.environ), work)
    text = proc.stdout + proc.stderr
    ok = proc.returncode == 0 and ("amp on" in text or "no native bf16" in text)
    rate = re.findall(r"([0-9.]+) images/s", text)
    rows.append((f"local backend, 1 node x {n} GPU(s), train_ddp.py, bf16 AMP",
                 f"exit {proc.returncode}, amp {'on' if 'amp on' in text else 'off?'}, "
                 f"{rate[-1] if rate else '?'} images/s", "ok" if ok else "FAILED: " + text[-300:]))


def check_observatory(rows: List[Row], n: int, work: Path) -> None:
    """Issue 42 on CUDA: check_train's run has step telemetry with the GPU's numbers (NVML utilisation where
    pynvml is, memory always), the all-reduce wait timed with CUDA events, and a report with its plots."""
    import json

    found = sorted((work / "runs").glob("train_ddp-local-*"))
    if not found:
        rows.append(("observatory on the CUDA run (top --json, report)", "no run directory", "FAILED"))
        return
    shown = run([PY, "-m", "clusterddp", "top", "--once", "--json", str(found[-1])], dict(os.environ), work)
    snap = json.loads(shown.stdout or "{}")
    ranks = snap.get("ranks", [])
    mem = [r.get("gpu_mem_mb") for r in ranks]
    comm = [r.get("comm_pct") for r in ranks]
    report = run([PY, "-m", "clusterddp", "report", str(found[-1])], dict(os.environ), work)
    ok = len(ranks) == n and all(isinstance(m, int) and m > 0 for m in mem) and all(r.get("steps", 0) > 0
                                                                                  for r in ranks) \
        and report.returncode == 0 and (found[-1] / "report.html").is_file() and (n == 1 or all(c for c in comm))
    rows.append((f"observatory on the CUDA run: top --json ({n} ranks), report",
                 f"steps {[r.get('steps') for r in ranks]}, GPU util {[r.get('gpu_util_pct') for r in ranks]} %, "
                 f"memory {mem} MiB, waiting in the all-reduce {comm} %, report exit {report.returncode}",
                 "ok" if ok else "FAILED: " + (shown.stderr + report.stderr)[-300:]))


def check_mask(rows: List[Row], n: int, work: Path) -> None:
    """Every rank sees one GPU (CUDA_VISIBLE_DEVICES=i, as --gpus-per-task gives) and must pick its own."""
    script = work / "per_rank.py"
    script.write_text(PER_RANK)
    procs, port = [], gpu_desk.free_port()
    for r, gpu in enumerate(gpu_desk.visible(n)):  # the GPUs we were given, never physical 0..n-1 (desk check 9)
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES=gpu)
        procs.append(subprocess.Popen([PY, str(script)], env=env, cwd=work, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    import json

    results = [json.loads(line.split("RESULT ", 1)[1]) for o in outs for line in o.splitlines() if "RESULT " in line]
    uuids = {r["uuid"] for r in results}
    ok = len(results) == n and len(uuids) == n and all(r["device"] == "cuda:0" for r in results) and all(
        r["sum"] == n * (n + 1) / 2 for r in results)
    rows.append((f"device selection with one visible GPU per rank ({n} ranks)",
                 f"{len(results)} ranks, {len(uuids)} distinct GPUs, devices {sorted({r['device'] for r in results})}",
                 "ok" if ok else "FAILED: " + " | ".join(o[-300:] for o in outs)))
    errors = [r["sync_error"] for r in results if r["sync_error"]]
    rows.append(("should_stop() x20 under torch.cuda.set_sync_debug_mode('error')",
                 "no synchronisation" if not errors else errors[0], "ok" if results and not errors else "FAILED"))


WARM_RANK = r"""
import hashlib, json, os, sys, time
import torch
from clusterddp.runtime import DistEnv
assert DistEnv.from_env().source == sys.argv[2], (DistEnv.from_env(), sys.argv[2])  # (each line's own variables)
fresh = {"bad_fork": torch.cuda._is_in_bad_fork(), "cuda_initialised": torch.cuda.is_initialized()}
from clusterddp import runtime
env = runtime.init(timeout=120)
dev = runtime.device()
torch.manual_seed(0)
model = runtime.wrap(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.Generator().manual_seed(env.rank)
for step in range(20):
    x = torch.randn(64, 256, generator=data).to(dev)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
if dev.type == "cuda":
    torch.cuda.synchronize()
h = hashlib.sha256()
for p in model.parameters():
    h.update(p.detach().cpu().numpy().tobytes())
print("RESULT " + json.dumps({"rank": env.rank, "pid": os.getpid(), "ppid": os.getppid(), "device": str(dev),
      "digest": h.hexdigest(), "done_s": time.time() - float(sys.argv[1]), **fresh}), flush=True)
runtime.shutdown()
"""


def check_warm(rows: List[Row], n: int, work: Path) -> None:
    """Issue 55's --warm-start on CUDA (not measured on a GPU before): ranks forked from a warm server that imported
    torch, torch._dynamo and clusterddp's job side (runtime/warm.py's PRELOAD) initialise CUDA and NCCL in the
    child, train, and end as ranks started by ``python`` do, with the same parameters; under srun's line (each rank a
    client) and torchrun's (the agent forked, its workers clients). What decides whether warm starts can be on by
    default for GPU jobs."""
    from clusterddp import contract
    from clusterddp.runtime import warm

    (work / "warm.py").write_text(WARM_RANK)
    (work / "shm").mkdir(mode=0o700, exist_ok=True)
    base = dict(os.environ, **{contract.WARM: f"gpu-check-{os.getpid()}", contract.PEER_DIR: str(work / "shm")})
    path = warm.socket_path(base)
    server = subprocess.Popen([PY, "-m", "clusterddp.runtime.warm", "serve"], env=base, cwd=work,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (path and os.path.exists(path)) and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.1)
        if not (path and os.path.exists(path)):
            rows.append(("--warm-start on CUDA: the warm server", "did not start", "FAILED"))
            return
        runs = {}
        for mode in ("srun-warm", "srun-cold", "torchrun-warm", "torchrun-cold"):
            runs[mode] = _warm_run(mode, n, base, work)
    finally:
        server.terminate()
        try:
            server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()
    for launcher in ("srun", "torchrun"):
        (w_codes, w), (c_codes, c) = runs[f"{launcher}-warm"], runs[f"{launcher}-cold"]
        forked = [r for r in w if r["ppid"] == server.pid]
        same = sorted(r["digest"] for r in w) == sorted(r["digest"] for r in c) and len(w) == n
        clean = not any(r["bad_fork"] or r["cuda_initialised"] for r in w)
        ok = set(w_codes) == set(c_codes) == {0} and len(forked) == n and clean and same
        start = (statistics.median(r["done_s"] for r in w) if w else float("nan"),
                 statistics.median(r["done_s"] for r in c) if c else float("nan"))
        rows.append((f"--warm-start on CUDA, {launcher}'s line, {n} rank(s): forked from the warm server, NCCL, "
                     "20 SGD steps, against a cold start",
                     f"exit {w_codes} / {c_codes}; {len(forked)} of {n} forked; CUDA untouched at the fork: {clean}; "
                     f"parameters {'identical' if same else 'DIFFER'}; start to done {start[0]:.1f} s / "
                     f"{start[1]:.1f} s", "ok" if ok else "FAILED"))


def _warm_run(mode: str, n: int, base: dict, work: Path) -> Tuple[List[int], List[dict]]:
    """One run of warm.py as ``mode`` says: (exit codes, each rank's RESULT)."""
    import json

    launcher, how = mode.split("-")
    warm_line = [PY, "-m", "clusterddp.runtime.warmrun"] if how == "warm" else [PY]
    now = str(time.time())
    if launcher == "torchrun":
        agent = [*warm_line, "-m", "clusterddp.runtime.agent"]  # (as the batch script runs it)
        worker = ["--module", "clusterddp.runtime.warmrun"] if how == "warm" else []
        argvs = [[*agent, "--standalone", f"--nproc-per-node={n}", *worker, "warm.py", now, "torchrun"]]
        envs = [dict(base)]
    else:
        port = gpu_desk.free_port()
        argvs = [[*warm_line, "warm.py", now, "srun"] for _ in range(n)]
        # srun's task variables (not RANK: that is torchrun's, and its workers join by env://)
        envs = [dict(base, SLURM_PROCID=str(r), SLURM_LOCALID=str(r), SLURM_NODEID="0", SLURM_STEP_ID="0",
                     SLURM_STEP_NUM_TASKS=str(n), SLURM_STEP_NUM_NODES="1", SLURM_STEP_TASKS_PER_NODE=str(n),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)) for r in range(n)]
    procs = [subprocess.Popen(a, env=e, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for a, e in zip(argvs, envs)]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    except subprocess.TimeoutExpired:  # (never left holding the GPUs for the checks after)
        for p in procs:
            p.kill()
        raise
    results = [json.loads(line.split("RESULT ", 1)[1]) for o in outs for line in o.splitlines() if "RESULT " in line]
    if any(p.returncode for p in procs):
        print(f"gpu-check: {mode}:\n" + "\n".join(o[-2000:] for o in outs), file=sys.stderr)
    return [p.returncode for p in procs], results


def check_stacks(rows: List[Row], n: int, work: Path) -> None:
    out = work / "hang-runs"
    last = n - 1
    job = subprocess.Popen([PY, "-m", "clusterddp", "submit", "--local", "--nodes", "1", "--gpus", str(n),
                            "--launcher", "srun", "--hang-timeout", "0", "--output-dir", str(out),
                            str(ROOT / "tests" / "scripts" / "hang.py"), "--", "--where", "before-allreduce",
                            "--rank", str(last)], cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        deadline, run_dir = time.monotonic() + 180, None
        while time.monotonic() < deadline:
            found = list(out.glob("hang-local-*/stacks/ranks"))
            if found and len(list(found[0].glob("rank-*.json"))) == n:
                run_dir = found[0].parent.parent
                break
            time.sleep(0.5)
        time.sleep(5)
        start = time.monotonic()
        proc = run([PY, "-m", "clusterddp", "stacks", str(run_dir)], dict(os.environ), work, timeout=120) \
            if run_dir else None
        took = time.monotonic() - start
    finally:
        os.killpg(job.pid, 15)
        job.wait(timeout=60)
    text = proc.stdout if proc else "(the job never started)"
    ok = proc is not None and proc.returncode == 0 and (f"rank {last} (" in text if n > 1 else "1 of 1" in text)
    rows.append((f"clusterddp stacks on an NCCL job, rank {last} stuck before its first all_reduce",
                 f"{took:.1f} s: " + " / ".join(text.splitlines()[:2]), "ok" if ok else "FAILED"))


def check_throughput(rows: List[Row], n: int, work: Path) -> None:
    # The patches are computed on the CPU: in the main process, this measured the CPU more than either loop (first
    # run, one H100: 232 / 394 images/s, then 239-274 / 285-309 in single runs on another machine, where cProfile
    # put the runtime's own calls at ~0.4 ms of a ~29-ms step). Workers on both sides leave the GPU step to compare.
    knobs = ["--images", "64", "--width", "64", "--depth", "17", "--epochs", "2", "--workers", "4"]

    def rate(argv: List[str]) -> float:  # one main-process thread each: the raw script's default where unset
        proc = run(argv, dict(os.environ, OMP_NUM_THREADS="1"), work, timeout=900)
        m = re.search(r"throughput ([0-9.]+) images/s", proc.stdout)
        if not m:
            raise RuntimeError(proc.stdout[-500:] + proc.stderr[-1000:])
        return float(m.group(1))
    ours, raw = [], []
    for _ in range(5):
        shutil.rmtree(work / "ck", ignore_errors=True)
        ours.append(rate([PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                          str(ROOT / "examples" / "train_ddp.py"), *knobs, "--ckpt-dir", str(work / "ck"),
                          "--log-every", "100000"]))
        raw.append(rate([PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                         str(ROOT / "bench" / "train_raw.py"), *knobs]))
    o, r = statistics.median(ours), statistics.median(raw)
    rows.append((f"images/s, {n} GPU(s): clusterddp.runtime / raw DDP (median of 5, interleaved, 4 loader workers "
                 "each)",
                 f"{o:.0f} / {r:.0f} = {o / r:.3f}", "ok" if o / r >= 0.95 else "below 0.95"))


def main() -> int:
    n = gpus()
    if n == 0:
        print("gpu-check: no CUDA GPU here (torch.cuda.device_count() == 0): nothing to check", file=sys.stderr)
        return 2
    rows: List[Row] = []
    with tempfile.TemporaryDirectory(prefix="clusterddp-gpu-") as tmp:
        work = Path(tmp)
        for check in (check_train, check_observatory, check_mask, check_warm, check_stacks, check_throughput,
                      *gpu_desk.CHECKS):
            print(f"gpu-check: {check.__name__} ...", file=sys.stderr, flush=True)
            try:
                check(rows, n, work)
            except Exception as exc:  # a script, not a test: record and go on to the next check
                rows.append((check.__name__, f"{type(exc).__name__}: {str(exc)[:300]}", "FAILED"))
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip().splitlines()
    except OSError:  # no nvidia-smi (some containers): the results are written all the same (desk check P9)
        smi = subprocess.run([PY, "-c", "import torch; print(torch.cuda.get_device_name(0))"], capture_output=True,
                             text=True).stdout.strip().splitlines()
    table = ["| check | result | verdict |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    torch_version = subprocess.run([PY, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                   text=True).stdout.strip()
    text = (f"# GPU check\n\n{datetime.date.today().isoformat()}, `make gpu-check`, {n} x {smi[0] if smi else '?'}, "
            f"torch {torch_version}.\n\n" + "\n".join(table) + "\n")
    print(text)
    (ROOT / "bench" / "RESULTS-gpu.md").write_text(text)
    return 1 if any(c.startswith("FAILED") for _, _, c in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
