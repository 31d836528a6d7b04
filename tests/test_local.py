"""The local backend: the same job on this machine, no Slurm (real processes, real gloo)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterddp import JobSpec
from clusterddp.backends.local.plan import describe, make_plan

from .conftest import SCRIPTS, run_cli
from .procs import descendants

SPAWN_ARGS = ["--dist-url", "tcp://{master_addr}:{master_port}", "--world-size", "{nnodes}", "--rank", "{node_rank}",
              "--procs", "{gpus_per_node}"]


def results(text: str) -> list:
    return [json.JSONDecoder().raw_decode(line.split("RESULT ", 1)[1])[0] for line in text.splitlines()
            if "RESULT " in line]


@pytest.mark.ranks
@pytest.mark.parametrize("launcher, warm", [("torchrun", False), ("srun", False), ("spawn", False),
                                            ("torchrun", True), ("srun", True)])  # (spawn refuses --warm-start)
def test_four_ranks_each_launcher(tmp_path, launcher, warm):
    """Cold, and with --warm-start (issue 79: --local honours it): one warm server per emulated node forks that
    node's processes (torchrun's agent and each of its workers, srun's ranks), and the job computes what the cold
    one does."""
    script = "allreduce_spawn.py" if launcher == "spawn" else "allreduce.py"
    extra = SPAWN_ARGS if launcher == "spawn" else []
    proc = run_cli("submit", "--local", "--launcher", launcher, "--nodes", "2", "--gpus", "2",
                   *["--warm-start"] * warm, "--output-dir", str(tmp_path), str(SCRIPTS / script), "--", *extra,
                   "--echo", "a b", "$HOME", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = results(proc.stdout)
    assert sorted(r["rank"] for r in res) == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["sum"] == 10.0 and r["argv"][-3:] == ["--echo", "a b", "$HOME"]
               for r in res)
    assert "running on CPU with gloo" in proc.stderr  # this machine has no 4 GPUs
    # terminal lines carry the right rank prefix (torchrun: mapped from the agent's node rank)
    for line in proc.stdout.splitlines():
        if "RESULT " in line and launcher != "spawn":
            assert line.startswith(f"[rank {results(line)[0]['rank']}] "), line
    run_dir = next(tmp_path.glob(f"{Path(script).stem}-local-*"))
    names = sorted(p.name for p in run_dir.glob("*.out") if not p.name.startswith("warm-"))
    assert names == ([f"rank-{i}.out" for i in range(4)] if launcher == "srun" else ["node-0.out", "node-1.out"])
    forked = {node: re.findall(r"forked (torchrun agent|rank process) \d+ \(([^)]*)\)",
                               (run_dir / f"warm-local{node}.out").read_text()) if warm else []
              for node in (0, 1)}
    assert not warm or "not apply" not in proc.stderr
    if not warm:
        assert not list(run_dir.glob("warm-*.out")), list(run_dir.iterdir())
    elif launcher == "torchrun":  # each node's agent, then its two workers (RANK set by the agent)
        assert {node: sorted(f) for node, f in forked.items()} == {
            node: [("rank process", f"RANK={2 * node}"), ("rank process", f"RANK={2 * node + 1}"),
                   ("torchrun agent", "-")] for node in (0, 1)}, forked
    else:  # srun's ranks (RANK and SLURM_PROCID set by the runner)
        want = {node: [f"RANK={r} SLURM_PROCID={r} SLURM_STEP_ID=0" for r in (2 * node, 2 * node + 1)]
                for node in (0, 1)}
        assert {node: sorted(who for _, who in f) for node, f in forked.items()} == want, forked
    # the srun emulation shows the training script what srun would
    if launcher == "srun":
        assert all(r["node_id"] == str(r["rank"] // 2) for r in res)


@pytest.mark.ranks
def test_quiet_shows_rank_zero_only(tmp_path):
    proc = run_cli("submit", "--local", "--quiet", "--launcher", "srun", "--procs-per-node", "3",
                   "--output-dir", str(tmp_path), str(SCRIPTS / "plumbing.py"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [r["rank"] for r in results(proc.stdout)] == [0]
    run_dir = next(tmp_path.glob("plumbing-local-*"))
    assert len(results("".join(p.read_text() for p in run_dir.glob("rank-*.out")))) == 3


@pytest.mark.ranks
@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_failing_rank_ends_everything_fast(tmp_path, launcher):
    # timeout=60: a job that waited for gloo's own 60-s timeout instead of ending its ranks would not end in it
    # (srun: the torch-free plumbing.py, whose other ranks wait on a socket as torch's would in a collective)
    script = "allreduce.py" if launcher == "torchrun" else "plumbing.py"
    proc = run_cli("submit", "--local", "--launcher", launcher, "--nodes", "2", "--gpus", "2", "--output-dir",
                   str(tmp_path), str(SCRIPTS / script), "--", "--fail-rank", "3", cwd=tmp_path, timeout=60)
    assert proc.returncode == 1
    assert "deliberate failure on rank 3" in proc.stderr and "first failure" in proc.stderr
    assert ("rank 3 exited with code 1" if launcher == "srun" else "node 1 exited with code 1") in proc.stderr


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _sigint_default() -> None:
    """Ctrl-C as at a terminal: a shell running the suite in the background makes children ignore SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.ranks
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="process tree from /proc (Linux)")
@pytest.mark.parametrize("launcher, ranks_ignore_term, warm", [("torchrun", False, False), ("srun", False, False),
                                                               ("torchrun", True, False), ("srun", True, True)])
def test_ctrl_c_leaves_no_process(tmp_path, launcher, ranks_ignore_term, warm):
    """Also where the ranks ignore SIGTERM: torchrun's workers live in sessions of their own, out of reach of their
    agent's process group, and would outlive it. Under --warm-start the ranks are the servers' children, and the
    servers go too."""
    cli = subprocess.Popen([sys.executable, "-m", "clusterddp", "submit", "--local", "--launcher", launcher,
                            *["--warm-start"] * warm,
                            "--nodes", "2", "--gpus", "2", "--output-dir", str(tmp_path), str(SCRIPTS / "sleeper.py"),
                            "--", "300", *(["ignore-term"] if ranks_ignore_term else [])], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=_sigint_default)
    deadline = time.monotonic() + 90
    started = 0
    while time.monotonic() < deadline and started < 4:
        time.sleep(0.3)
        started = sum(p.read_text().count("started pid") for p in tmp_path.glob("sleeper-local-*/*.out"))
    assert started == 4
    pids = descendants(cli.pid)
    assert len(pids) >= 4 + 2 * warm  # (the servers, and the ranks they forked)
    cli.send_signal(signal.SIGINT)
    out, err = cli.communicate(timeout=60)
    assert cli.returncode == 130 and "stopped all" in err
    time.sleep(0.5)
    assert [p for p in pids if _alive(p)] == []


def test_dry_run_prints_commands_and_environment(tmp_path):
    for launcher, needle in (("torchrun", "-m clusterddp.runtime.agent --nnodes=2 --nproc-per-node=2"),
                             ("srun", "SLURM_PROCID=3"), ("spawn", "--rank 1")):
        args = SPAWN_ARGS if launcher == "spawn" else []
        proc = run_cli("submit", "--local", "--dry-run", "--launcher", launcher, "--nodes", "2", "--gpus", "2",
                       "--env", "A=b c", str(SCRIPTS / "allreduce.py"), "--", *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert needle in proc.stdout and "export A='b c'" in proc.stdout and "nothing is started" in proc.stdout
        assert "export MASTER_ADDR=127.0.0.1" in proc.stdout
    # --warm-start: a server per emulated node first, each rank's process its client
    proc = run_cli("submit", "--local", "--dry-run", "--warm-start", "--launcher", "srun", "--nodes", "2", "--gpus",
                   "2", str(SCRIPTS / "allreduce.py"), cwd=tmp_path)
    assert proc.returncode == 0 and "not apply" not in proc.stderr, proc.stderr
    assert re.search(r"^SLURMD_NODENAME=local1 CLUSTERDDP_WARM=local-\d+\.0\.NAME \S+ -m clusterddp\.runtime\.warm "
                     r"serve &$", proc.stdout, re.MULTILINE), proc.stdout
    assert len(re.findall(r" -m clusterddp\.runtime\.warmrun \S+allreduce\.py &$", proc.stdout, re.MULTILINE)) == 4
    # with another interpreter (which may lack clusterddp) the ranks start cold, and that is said
    proc = run_cli("submit", "--local", "--dry-run", "--warm-start", "--python", "/usr/bin/python3", "--launcher",
                   "srun", "--nodes", "2", "--gpus", "2", str(SCRIPTS / "allreduce.py"), cwd=tmp_path)
    assert "--local does not apply --warm-start (--python names another interpreter)" in proc.stderr, proc.stderr
    assert "warmrun" not in proc.stdout
    assert not list(tmp_path.glob("clusterddp-runs/*"))


def test_plan_uses_gpus_when_there_are_enough():
    spec = JobSpec("t.py", nodes=2, gpus_per_node=2)
    plan = make_plan(spec, "/tmp/r", 20001, 1, ["0", "1", "2", "3"])
    assert plan.gpus == ["0", "1", "2", "3"]
    assert [dict(p.env)["CUDA_VISIBLE_DEVICES"] for p in plan.procs] == ["0,1", "2,3"]
    cpu = make_plan(spec, "/tmp/r", 20001, 1, ["0"])
    assert cpu.gpus is None and ("CUDA_VISIBLE_DEVICES", "") in cpu.common and "CPU with gloo" in cpu.note
    threads = dict(make_plan(spec.replace(cpus_per_task=3), "/tmp/r", 1, 1, []).common)["OMP_NUM_THREADS"]
    assert threads == "3"
    assert "SLURM_LOCALID=1" in describe(make_plan(spec.replace(launcher="srun"), "/tmp/r", 1, 1, []))


@pytest.mark.ranks
def test_slurm_variables_of_a_parent_job_do_not_leak(tmp_path):
    env = dict(os.environ, SLURM_JOB_ID="999", SLURM_NTASKS="64", SLURM_CPU_BIND="map_cpu:0", SBATCH_PARTITION="x")
    proc = run_cli("submit", "--local", "--procs-per-node", "2", "--output-dir", str(tmp_path),
                   str(SCRIPTS / "allreduce.py"), cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert sorted(r["rank"] for r in results(proc.stdout)) == [0, 1]


@pytest.mark.ranks
def test_new_skeleton_runs_on_two_ranks(tmp_path):
    made = run_cli("new", "train.py", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    again = run_cli("new", "train.py", cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr
    proc = run_cli("submit", "--local", "--procs-per-node", "2", "train.py", "--", "--epochs", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("loss") == 6 and "world size 2" in proc.stdout  # every 10 of 2 x 32 steps
    assert list(tmp_path.glob("clusterddp-runs/train-local-*/model.pt"))
    # issue 56: its run records its steps (top, goodput) and its loss (report's curve)
    from clusterddp.observe import telemetry
    run = next(tmp_path.glob("clusterddp-runs/train-local-*"))
    steps = {r.rank: r.steps for r in telemetry.read(run, 0)}
    assert sorted(steps) == [0, 1] and min(steps.values()) == 2 * (2048 // 2 // 32), steps  # 2 epochs x 32 batches
    import json
    losses = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in losses] == [10, 20, 30, 40, 50, 60] and all(m["metrics"]["loss"] > 0 for m in losses)
    assert sorted(p.name for p in (run / "checkpoints").glob("*.pt")) == ["ckpt-0000000050.pt"]  # (--ckpt-every 50)
    # the run ends saying where its files are and what to run next, and those commands work on it
    here = run.relative_to(tmp_path)  # as the user gave it: relative to where they ran it
    job = re.search(r"clusterddp: local job (L[0-9]+): run directory ", proc.stderr).group(1)  # issue 56: its id
    assert f"clusterddp: local job {job}: run directory {here} " in proc.stderr, proc.stderr
    assert f"clusterddp: saved last:    {here / 'model.pt'}" in proc.stderr
    assert f"next: clusterddp status {job} " in proc.stderr and f"clusterddp report {job} " in proc.stderr
    assert "on Slurm: clusterddp submit --nodes 1 --gpus 2 train.py -- --epochs 2" in proc.stderr
    status = run_cli("status", str(here), cwd=tmp_path)
    assert status.returncode == 0 and re.search(rf"{here}\s+COMPLETED\s+\S+\s+1\s+local0\s+0", status.stdout), \
        status.stdout + status.stderr
    assert "goodput" in status.stdout
    top = run_cli("top", str(run), "--once", cwd=tmp_path)
    assert top.returncode == 0 and re.search(r"\b64\b", top.stdout), top.stdout + top.stderr  # each rank's steps
    page = run_cli("report", str(run), "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    assert page.returncode == 0 and "loss" in (tmp_path / "r.html").read_text(), page.stderr
    assert re.search(r"clusterddp: goodput \d+%: ", proc.stderr), proc.stderr  # measured (steps recorded)
    # issue 56: with telemetry off, a clean run's goodput is not measured (it read "goodput 0%, all start-up")
    off = run_cli("submit", "--local", "--procs-per-node", "2", "--env", "CLUSTERDDP_TELEMETRY=0", "train.py", "--",
                  "--epochs", "1", cwd=tmp_path)
    assert off.returncode == 0 and "clusterddp: goodput not measured: no step was recorded" in off.stderr, off.stderr
    assert "goodput 0%" not in off.stderr


@pytest.mark.ranks
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="process tree from /proc (Linux)")
def test_warm_servers_go_with_their_runner_even_when_it_is_killed(tmp_path):
    """Issue 79, from a review: the warm servers live in sessions of their own; a runner SIGKILLed (no finally)
    takes them along (the parent-death signal), so no server outlives its run. (The ranks' processes of a killed
    runner are ended here by pid: that is the runner's own case, cold or warm.)"""
    cli = subprocess.Popen([sys.executable, "-m", "clusterddp", "submit", "--local", "--launcher", "srun",
                            "--warm-start", "--nodes", "2", "--gpus", "2", "--output-dir", str(tmp_path),
                            str(SCRIPTS / "sleeper.py"), "--", "300"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    deadline, started = time.monotonic() + 90, 0
    while time.monotonic() < deadline and started < 4:
        time.sleep(0.3)
        started = sum(p.read_text().count("started pid") for p in tmp_path.glob("sleeper-local-*/rank-*.out"))
    servers = [int(m) for p in tmp_path.glob("sleeper-local-*/warm-*.out")
               for m in re.findall(r"warm server (\d+): starting", p.read_text())]
    everything = descendants(cli.pid)
    assert started == 4 and len(servers) == 2 and set(servers) <= everything, (started, servers)
    cli.kill()
    cli.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in servers):
        time.sleep(0.1)
    left = [p for p in servers if _alive(p)]
    for pid in everything:  # (the runner's own leftovers, cold or warm: ours, by pid)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert left == [], left
