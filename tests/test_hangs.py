"""Hangs (issue 12): the stack roll call, the hang watchdog, the rendezvous report and the CPU control channel.

Real processes throughout: the local backend (4 ranks as 2 nodes x 2) and, marked slurm, the real test cluster.
tests/scripts/hang.py gets one rank stuck on purpose; tests/scripts/hang_raw.py is the same without
clusterddp.runtime (found through py-spy).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from clusterddp import contract, rollcall

from .conftest import ROOT, SCRIPTS, run_cli

HANG = SCRIPTS / "hang.py"
SHAPE = ["--nodes", "2", "--procs-per-node", "2"]


def line_of(path: Path, needle: str, after: str = "") -> int:
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    return next(i + 1 for i, line in enumerate(lines) if i >= start and needle in line)


SLEEP_BEFORE_ALLREDUCE = line_of(HANG, "time.sleep(3600)", after='"before-allreduce" and env.rank')
SLEEP_IN_LOADER = line_of(HANG, "time.sleep(3600)  # a wedged file system")


# --- the roll call itself (pure) -------------------------------------------------------------------------------
def frame(file: str, line: int, func: str, lib: bool = False) -> dict:
    return {"file": file, "line": line, "func": func, "lib": lib}


def dump(rank: int, frames: list, node: str = "n1") -> dict:
    return {"rank": rank, "node": node, "pid": 100 + rank, "time": 0,
            "threads": [{"name": "other", "main": False, "frames": [frame("/x/q.py", 1, "poll", True)]},
                        {"name": "MainThread", "main": True, "frames": frames}]}


WAITING = [frame("/u/train.py", 120, "main"), frame("/u/train.py", 88, "step"),
           frame("/site-packages/torch/distributed/c10d_logger.py", 81, "wrapper", True),
           frame("/site-packages/torch/distributed/distributed_c10d.py", 2800, "all_reduce", True)]
ELSEWHERE = [frame("/u/train.py", 115, "main"), frame("/site-packages/torch/utils/data/dataloader.py", 700,
                                                      "__next__", True), frame("/u/data.py", 40, "__getitem__")]


def test_the_roll_call_groups_ranks_and_names_the_odd_one_out():
    dumps = [dump(0, WAITING), dump(1, ELSEWHERE, "n2"), dump(2, WAITING), dump(3, WAITING, "n2")]
    call = rollcall.build(dumps, 5, {4: "n3: never started"})
    text = rollcall.format_text(call)
    assert text.splitlines() == [
        "3 of 5 ranks wait at the same place: all_reduce  <- train.py:88 step  <- train.py:120 main   "
        "(ranks 0,2,3 on 2 nodes)",
        "rank 1 (n2) is elsewhere:  data.py:40 __getitem__  <- train.py:115 main      <- look here",
        "missing: rank 4 (n3: never started)"]
    assert call["summary"] == ("rank(s) 4 did not answer; rank 1 at data.py:40 __getitem__; 3 ranks (0,2,3) wait "
                               "in all_reduce at train.py:88 step")
    assert [g["ranks"] for g in call["groups"]] == [[0, 2, 3], [1]]


def test_the_roll_call_with_every_rank_in_one_place_and_none_missing():
    call = rollcall.build([dump(r, WAITING) for r in range(4)], 4, {})
    assert rollcall.format_text(call) == ("4 of 4 ranks wait at the same place: all_reduce  <- train.py:88 step  "
                                          "<- train.py:120 main   (ranks 0-3 on n1)\nmissing: none\n")


@pytest.mark.parametrize("numbers, text", [([0, 1, 2, 5], "0-2,5"), ([3], "3"), ([1, 2], "1,2"), ([], ""),
                                           ([7, 0, 9, 8, 1], "0,1,7-9")])
def test_rank_ranges(numbers, text):
    assert rollcall.ranges(numbers) == text


def test_library_code_is_told_from_the_users():
    prefixes = ["/usr/lib/python3.11", "/opt/env/lib/python3.11/site-packages/clusterddp"]
    assert rollcall.is_library("/usr/lib/python3.11/threading.py", prefixes)
    assert rollcall.is_library("/opt/env/lib/python3.11/site-packages/torch/nn/modules/module.py", prefixes)
    assert rollcall.is_library("<frozen importlib._bootstrap>", prefixes)
    assert not rollcall.is_library("/usr/lib/python3.11x/mine.py", prefixes)
    assert not rollcall.is_library("/home/u/train.py", prefixes)


@pytest.mark.parametrize("data", [None, [], {"rank": "0", "threads": []}, {"rank": 0, "threads": "x"},
                                  {"rank": 0, "threads": [{"frames": "x"}]}])
def test_a_malformed_dump_file_is_ignored(data):
    assert rollcall.parse_dump(data) is None


def test_reports_read_back_from_a_shared_run_directory_cannot_drive_the_terminal(tmp_path):
    hang = tmp_path / "stacks" / "hang-2"
    hang.mkdir(parents=True)
    (hang / "rollcall.txt").write_text("rank 1 \x1b]0;owned\x07 is elsewhere\nmissing: none\n")
    (hang / "rollcall.json").write_text(json.dumps({"summary": "hung since 12:00:00: rank 1\x1b[2J\nat x"}))
    (tmp_path / "stacks" / "hang-1").mkdir()
    (tmp_path / "stacks" / "hang-1" / "rollcall.txt").write_text("an older restart's roll call\n")
    (tmp_path / "stacks" / "rendezvous-0.txt").write_text("missing rank 3\x1b[31m (n2)\n")
    report = rollcall.hang_report(tmp_path)
    assert report is not None and report["dir"] == str(hang)  # the latest restart's
    assert report["text"] == "rank 1 ?]0;owned? is elsewhere\nmissing: none\n"
    assert report["summary"] == "hung since 12:00:00: rank 1?[2J?at x"
    assert rollcall.rendezvous_failure(tmp_path) == "missing rank 3?[31m (n2)"
    assert rollcall.hang_report(tmp_path / "nothing") is None and rollcall.rendezvous_failure(tmp_path / "x") is None


@pytest.mark.parametrize("launcher", ["srun", "torchrun", "spawn"])
def test_a_missing_rank_s_node_is_the_step_s_not_the_job_s(launcher):
    """A rank no other rank of its node vouches for is placed by the attempt's nodes (a retry on a spare runs on a
    part of the job's), in blocks, under every launcher (torchrun's node rank is SLURM_NODEID)."""
    from clusterddp.runtime import control
    from clusterddp.runtime.env import DistEnv

    env = DistEnv(0, 0, 4, 2, 0, 2, "node1", 24242, launcher)
    hellos = {0: {"node": "node1"}, 1: {"node": "node1"}}
    job = {"SLURM_JOB_NODELIST": "node[1-3]"}
    assert control.node_of(3, env, hellos, job) == "node2"
    assert control.node_of(3, env, hellos, dict(job, SLURM_STEP_NODELIST="node[1,3]")) == "node3"
    assert control.node_of(1, env, hellos, dict(job, SLURM_STEP_NODELIST="node[1,3]")) == "node1"


def test_stacks_names_a_silent_rank_s_node_only_where_the_job_s_nodes_tell_it():
    """stacks, for a rank that gave no hello and no other rank of its node did: the job's nodes place it, in blocks,
    where the ranks use them all; with spares a retry may run on a part of them, and nothing is guessed."""
    from clusterddp.observe import stacks

    hellos = {0: {"node": "node1"}, 1: {"node": "node1"}}
    whole = stacks.Target(Path("."), 4, "torchrun", 2, "7", ("node1", "node2"))
    assert stacks._node_guess(3, whole, hellos) == "node2"
    spare = stacks.Target(Path("."), 4, "torchrun", 2, "7", ("node1", "node2", "node3"))
    assert stacks._node_guess(3, spare, hellos) == "node 1 of the attempt"
    assert stacks._node_guess(1, spare, hellos) == "node1"


def test_hang_timeout_is_validated_and_exported():
    from clusterddp.backends.slurm.script import render
    from clusterddp.errors import SpecError
    from clusterddp.job.spec import JobSpec

    assert JobSpec("t.py").hang_timeout_seconds == contract.DEFAULT_HANG_TIMEOUT_S
    assert JobSpec("t.py", hang_timeout="0").hang_timeout_seconds == 0
    assert JobSpec("t.py", hang_timeout="1:30").hang_timeout_seconds == 90
    with pytest.raises(SpecError, match="hang_timeout: invalid time limit 'soon'"):
        JobSpec("t.py", hang_timeout="soon")
    assert "export CLUSTERDDP_HANG_TIMEOUT=90\n" in render(JobSpec("t.py", hang_timeout="1:30"))
    gpu = render(JobSpec("t.py", gpus_per_node=2))
    assert "export TORCH_NCCL_TRACE_BUFFER_SIZE=2000" in gpu and 'nccl-trace/rank_"' in gpu
    assert "TORCH_NCCL" not in render(JobSpec("t.py", gpus_per_node=2, flight_recorder=False))
    assert "TORCH_NCCL" not in render(JobSpec("t.py"))  # gloo jobs have no NCCL


def test_hang_options_on_the_command_line(tmp_path):
    (tmp_path / "t.py").write_text("")
    bad = run_cli("render", "--hang-timeout", "later", "t.py", cwd=tmp_path)
    assert bad.returncode == 2 and "hang_timeout: invalid time limit 'later'" in bad.stderr
    assert "Traceback" not in bad.stderr
    out = run_cli("explain", "--gpus", "2", "--no-flight-recorder", "t.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "flight recorder: off" in out.stdout
    out = run_cli("explain", "--gpus", "2", "--hang-timeout", "0", "t.py", cwd=tmp_path)
    assert "flight recorder: on" in out.stdout and "hang watchdog: off" in out.stdout


def test_torchs_collective_timeout_comes_after_the_watchdog():
    """After the watchdog's longest limit (its start-up window, until the first step ends: NCCL's communicator
    set-up, the first batch), so the roll call and exit 79 come before torch's abort (issue 28, desk check 1)."""
    from clusterddp.contract import HANG_STARTUP_FACTOR
    from clusterddp.runtime.group import collective_timeout

    for rendezvous, hang in ((300, 900), (300, 60), (1000, 30), (300, 7200)):
        assert collective_timeout(rendezvous, hang) > hang * HANG_STARTUP_FACTOR
        assert collective_timeout(rendezvous, hang) >= rendezvous  # a short watchdog never shortens the rendezvous
    assert collective_timeout(300, 900) == 1920
    # watchdog off: the rendezvous bound, never below torch's own NCCL default of 10 minutes (desk check P6)
    assert collective_timeout(300, 0) == 600 and collective_timeout(900, 0) == 900


# --- local runs: real processes, 4 ranks -----------------------------------------------------------------------
class LocalJob:
    """A `clusterddp submit --local` in the background; its run directory once it exists."""

    def __init__(self, tmp_path: Path, script: Path, *options: str, env: dict | None = None) -> None:
        self.out = tmp_path / "runs"
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "clusterddp", "submit", "--local", *SHAPE, "--output-dir", str(self.out),
             *options], cwd=tmp_path, env=env or dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True)
        self.script = script

    def run_dir(self) -> Path:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = list(self.out.glob(f"{self.script.stem}-local-*"))
            if found:
                return found[0]
            time.sleep(0.2)
        raise AssertionError("the local run never made its run directory")

    def wait_joined(self, ranks: set) -> Path:
        run_dir = self.run_dir()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            hellos = rollcall.read_hellos(run_dir)
            if {r for r, h in hellos.items() if h["state"] == "joined"} >= ranks:
                return run_dir
            time.sleep(0.3)
        raise AssertionError(f"ranks {ranks} never joined: {rollcall.read_hellos(run_dir)}")

    def finish(self, timeout: float = 120) -> tuple:
        out, err = self.popen.communicate(timeout=timeout)
        return self.popen.returncode, out, err

    def kill(self) -> None:
        """End the run (its runner stops the ranks); SIGKILL to the whole group if it takes too long."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, 15)
                self.popen.communicate(timeout=30)
            except ProcessLookupError:  # it ended between poll() and killpg()
                pass
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, 9)
                self.popen.communicate(timeout=30)


@pytest.fixture
def local_jobs():
    jobs: list = []
    yield jobs
    for job in jobs:
        job.kill()


def stacks(target: str, *options: str, cwd: Path) -> subprocess.CompletedProcess:
    """``clusterddp stacks``; one that does not end within 120 s (a hang) fails the test (no timed assertion: the
    bound is the process's)."""
    return run_cli("stacks", *options, target, cwd=cwd, timeout=120)


@pytest.mark.ranks
@pytest.mark.parametrize("launcher", ["srun"])  # every launcher's stacks: the loader test below
def test_stacks_names_the_rank_that_never_reaches_the_collective(tmp_path, local_jobs, launcher):
    job = LocalJob(tmp_path, HANG, "--launcher", launcher, "--hang-timeout", "0", str(HANG), "--",
                   "--where", "before-allreduce", "--rank", "3")
    local_jobs.append(job)
    run_dir = job.wait_joined({0, 1, 2, 3})
    time.sleep(2)  # ranks 0-2 reach the all-reduce
    proc = stacks(str(run_dir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("3 of 4 ranks wait at the same place: all_reduce  <- hang.py:"), proc.stdout
    assert "(ranks 0-2 on " in lines[0]
    assert re.match(rf"rank 3 \(\S+\) is elsewhere:  hang.py:{SLEEP_BEFORE_ALLREDUCE} main ", lines[1]), lines
    assert lines[1].endswith("<- look here") and lines[2] == "missing: none"
    dumps = Path(lines[-1].split(": ", 1)[1].rstrip("/"))
    assert sorted(p.name for p in dumps.glob("rank-*.txt")) == [f"rank-{r}.txt" for r in range(4)]
    assert f'hang.py", line {SLEEP_BEFORE_ALLREDUCE}, in main' in (dumps / "rank-3.txt").read_text()
    as_json = json.loads(run_cli("stacks", "--json", str(run_dir), cwd=tmp_path).stdout)
    assert [g["ranks"] for g in as_json["groups"]] == [[0, 1, 2], [3]] and as_json["missing"] == []
    # NCCL flight-recorder dumps, when a job left some, are pointed to
    (run_dir / "nccl-trace").mkdir()
    for r in range(4):
        (run_dir / "nccl-trace" / f"rank_{r}").write_bytes(b"\x80")
    out = run_cli("stacks", str(run_dir), cwd=tmp_path).stdout
    assert f"NCCL flight recorder: 4 dump(s) in {run_dir / 'nccl-trace'}/ (read them with: torchfrtrace" in out


def settled_stacks(target: str, cwd: Path, run_dir: Path, stuck_rank: int) -> list:
    """``stacks`` of a job whose ``stuck_rank`` blocks in its loader (hang.py --where loader), asked until the roll
    call settles; its lines. Rank 1's dataset blocks after 40 items and leaves a marker. Even then the others may
    still be on their way (on a loaded 2-core machine one rank spent >15 s importing torch._dynamo inside DDP's
    constructor): ask again, a few times, until the rank is in its loader; what is asserted is that settled roll
    call."""
    deadline = time.monotonic() + 90
    marker = run_dir / f"stuck-rank-{stuck_rank}"
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert marker.exists(), f"rank {stuck_rank} never reached its blocking __getitem__"
    time.sleep(2)
    for _ in range(10):
        proc = stacks(target, cwd=cwd)
        if proc.stdout.startswith("3 of 4 ranks wait at the same place: ") and "__getitem__" in proc.stdout:
            break
        time.sleep(3)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("3 of 4 ranks wait at the same place: "), proc.stdout
    assert lines[2] == "missing: none", lines
    return lines


@pytest.mark.ranks
def test_stacks_lists_a_rank_that_never_started_as_missing(tmp_path, local_jobs):
    job = LocalJob(tmp_path, HANG, "--launcher", "srun", "--hang-timeout", "0", str(HANG), "--",
                   "--where", "rendezvous", "--rank", "3", env=dict(os.environ, **{contract.TIMEOUT: "600"}))
    local_jobs.append(job)
    run_dir = job.run_dir()
    deadline = time.monotonic() + 90
    while len(rollcall.read_hellos(run_dir)) < 3 and time.monotonic() < deadline:
        time.sleep(0.3)
    proc = stacks(str(run_dir), "--timeout", "3", "--no-py-spy", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    missing = [line for line in proc.stdout.splitlines() if line.startswith("missing:")]
    assert missing and re.fullmatch(r"missing: rank 3 \(\S+: never started, or does not use clusterddp.runtime\)",
                                    missing[0]), proc.stdout
    assert "rank 3" not in proc.stdout.split("missing:")[0]  # ranks 0-2 answered from inside init()


@pytest.mark.ranks
def test_stacks_of_an_unmodified_script_through_py_spy_and_without_it_says_why_in_one_line(tmp_path, local_jobs):
    raw = SCRIPTS / "hang_raw.py"
    ready = tmp_path / "ready"
    ready.mkdir()
    job = LocalJob(tmp_path, raw, "--launcher", "torchrun", str(raw), "--", "--rank", "3", "--ready-dir", str(ready))
    local_jobs.append(job)
    run_dir = job.run_dir()
    # No hello files (the script does not use the runtime): it leaves its own marker once past its imports.
    deadline = time.monotonic() + 120
    while len(list(ready.glob("ready-*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2)
    for _ in range(5):
        proc = stacks(str(run_dir), "--timeout", "2", cwd=tmp_path)
        if proc.stdout.startswith("3 of 4 ranks wait at the same place: all_reduce"):
            break
        time.sleep(3)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    sleep_line = line_of(raw, "time.sleep(3600)")
    assert lines[0].startswith("3 of 4 ranks wait at the same place: all_reduce  <- hang_raw.py:"), proc.stdout
    assert re.match(rf"rank 3 \(\S+\) is elsewhere:  hang_raw.py:{sleep_line} stuck  <- hang_raw.py:\d+ main",
                    lines[1]), lines
    assert "trying py-spy" in proc.stderr
    assert json.loads((run_dir / "stacks").glob("*/rank-3.json").__next__().read_text())["source"] == "py-spy"
    # Without py-spy the same job's stacks say why in one line. The same Python, through a link in a directory
    # without py-spy beside it, nor on PATH (the shared venv's own py-spy is left alone: other runs may use it); its
    # packages and clusterddp through PYTHONPATH.
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    env = dict(os.environ, PATH=f"{bare}:/usr/bin:/bin",
               PYTHONPATH=os.pathsep.join([str(ROOT), sysconfig.get_path("purelib")]))
    proc = subprocess.run([str(bare / "python3"), "-m", "clusterddp", "stacks", "--timeout", "1", str(run_dir)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "py-spy fallback: " in proc.stdout and "pip install 'clusterddp[stacks]'" in proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.ranks
@pytest.mark.parametrize("launcher", ["srun", "torchrun", "spawn"])
def test_a_rank_blocked_in_its_loader_is_named_by_stacks_then_the_watchdog_ends_the_job(tmp_path, local_jobs,
                                                                                        launcher):
    """One hung job per launcher: `stacks` names the rank blocked in its data loader while the job hangs, then the
    watchdog ends the job with the same roll call. (45 s: the watchdog must not end the job while stacks is still
    asking; and a busy 2-core machine can starve a healthy rank for several seconds while its peers import torch
    and build DDP.)"""
    job = LocalJob(tmp_path, HANG, "--launcher", launcher, "--hang-timeout", "0:45", str(HANG), "--",
                   "--where", "loader", "--rank", "1")
    local_jobs.append(job)
    run_dir = job.wait_joined({0, 1, 2, 3})
    lines = settled_stacks(str(run_dir), tmp_path, run_dir, 1)
    assert re.match(rf"rank 1 \(\S+\) is elsewhere:  hang.py:{SLEEP_IN_LOADER} __getitem__  <- hang.py:\d+ main",
                    lines[1]), lines
    code, out, err = job.finish(timeout=240)
    assert code == contract.HANG_EXIT, err
    assert "the hang watchdog ended the job (hung since " in err
    assert re.search(rf"rank 1 \(\S+\) is elsewhere:  hang.py:{SLEEP_IN_LOADER} __getitem__", err), err
    assert "3 of 4 ranks wait at the same place" in err and "Traceback" not in err
    assert (run_dir / "stacks" / "hang-0" / "rollcall.txt").exists()
    assert sorted(p.name for p in (run_dir / "stacks" / "hang-0").glob("rank-*.json")) == [
        f"rank-{r}.json" for r in range(4)]


@pytest.mark.ranks
def test_slow_steps_that_advance_are_never_a_hang(tmp_path):
    # Each step takes 3 s with a 12-s watchdog: 8 steps (24 s) outlast the timeout, and nothing stops them. (Not
    # shorter: start-up on a busy 2-core machine, DDP's construction included, can take longer than 6 s.)
    job = LocalJob(tmp_path, HANG, "--launcher", "srun", "--hang-timeout", "0:12", str(HANG), "--",
                   "--where", "slow", "--step-s", "3", "--steps", "8")
    code, out, err = job.finish(timeout=240)
    assert code == 0, err  # (8 steps of 3 s each outlast the 12-s watchdog: "finished 8 steps" below says so)
    assert "finished 8 steps" in out + err and "hang watchdog" not in err


@pytest.mark.ranks
@pytest.mark.parametrize("launcher", ["srun", "spawn", "torchrun"])  # (torchrun: its node ranks given, so its node)
def test_a_rank_that_never_starts_is_named_by_the_others(tmp_path, launcher):
    env = dict(os.environ, **{contract.TIMEOUT: "10"})
    job = LocalJob(tmp_path, HANG, "--launcher", launcher, str(HANG), "--", "--where", "rendezvous", "--rank", "3",
                   env=env)
    code, out, err = job.finish(timeout=180)
    assert code == contract.RENDEZVOUS_EXIT, err
    assert re.search(r"did not complete in 1\d s: 3 of 4 ranks arrived; missing rank 3 \(\S+\): never started",
                     err), err


@pytest.mark.ranks
def test_should_stop_agrees_on_the_cpu_channel_and_shutdown_tears_it_down(tmp_path):
    """4 real gloo ranks: rank 2 is asked to stop at call 3; every rank answers True at that same call, on a
    group that is not the training group; after shutdown() nothing of it is left (no group, no thread)."""
    script = tmp_path / "agree.py"
    script.write_text(r'''
import json, os, signal, sys, threading
import torch.distributed as dist
from clusterddp import runtime
from clusterddp.runtime import group
env = runtime.init(timeout=60)
channel = group.STATE["channel"]
assert channel is not None and channel != dist.group.WORLD
assert dist.get_backend(channel) == "gloo" and dist.get_world_size(channel) == env.world_size
answers = []
for call in range(6):
    if call == 3 and env.rank == 2:
        os.kill(os.getpid(), signal.SIGUSR2)
    answers.append(runtime.should_stop())
runtime.shutdown()
print("RESULT " + json.dumps({"rank": env.rank, "answers": answers, "initialized": dist.is_initialized(),
      "state": sorted(group.STATE), "threads": [t.name for t in threading.enumerate()]}), flush=True)
''')
    code, out, err = LocalJob(tmp_path, script, "--launcher", "srun", str(script)).finish(timeout=180)
    assert code == 0, err
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in (out + err).splitlines() if "RESULT " in line]
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3]
    for r in results:
        assert r["answers"] == [False, False, False, True, True, True], r
        assert r["initialized"] is False and r["state"] == [] and "clusterddp-control" not in r["threads"], r


# --- the real Slurm cluster -------------------------------------------------------------------------------------
@pytest.fixture
def work(slurm_env, tmp_path_factory):
    d = tmp_path_factory.mktemp("hangjob")
    for script in ("hang.py", "hang_raw.py"):
        shutil.copy(SCRIPTS / script, d)
    return d, dict(os.environ)


def node_of(rank: int, job_id: str) -> str:
    """The node of ``rank``: every launcher places ranks in blocks in the order of the job's nodes (torchrun's node
    rank is given at its static rendezvous). (The test cluster has 3 nodes: a job may get node[1,3].)"""
    from clusterddp.hostlist import expand

    shown = subprocess.run(["scontrol", "--oneliner", "show", "job", job_id], capture_output=True, text=True).stdout
    found = re.search(r"(?<!\S)NodeList=(\S+)", shown)
    nodes = expand(found.group(1) if found and found.group(1) != "(null)" else "node[1-2]")
    return nodes[rank // 2]


def wait_for_hellos(run_dir: Path, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len([h for h in rollcall.read_hellos(run_dir).values() if h["state"] == "joined"]) >= n:
            return
        time.sleep(0.5)
    raise AssertionError(f"not all ranks joined in {run_dir}: {rollcall.read_hellos(run_dir)}")


ONCE = pytest.mark.slurm_releases("22.05")  # this launcher on 22.05 only; srun on every release (Slurm's part)


@pytest.mark.slurm
@pytest.mark.parametrize("launcher", ["srun", pytest.param("torchrun", marks=ONCE)])
def test_stacks_of_an_unmodified_script_on_the_cluster_through_srun_overlap(work, launcher):
    d, env = work
    ready = d / "ready"
    ready.mkdir()
    proc = run_cli("submit", "--launcher", launcher, "--nodes", "2", "--gpus", "2", "--time", "5", "hang_raw.py",
                   "--", "--rank", "3", "--ready-dir", str(ready), cwd=d, env=env)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.split()[0]
    try:
        # Every rank past its imports (on a loaded 2-core machine importing torch took over 10 s), then a moment
        # for the three to enter all_reduce; the roll call is asked again a few times until it settles.
        deadline = time.monotonic() + 120
        while len(list(ready.glob("ready-*"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(list(ready.glob("ready-*"))) == 4, "the ranks never got past their imports"
        time.sleep(2)
        for _ in range(5):
            out = stacks(job_id, "--timeout", "2", cwd=d)
            if out.stdout.startswith("3 of 4 ranks wait at the same place: all_reduce"):
                break
            time.sleep(3)
        assert out.returncode == 0, out.stdout + out.stderr
        lines = out.stdout.splitlines()
        assert lines[0].startswith("3 of 4 ranks wait at the same place: all_reduce  <- hang_raw.py:"), out.stdout
        node = node_of(3, job_id)
        assert re.match(rf"rank 3 \({node}\) is elsewhere:  hang_raw.py:\d+ stuck", lines[1]), lines
    finally:
        run_cli("cancel", job_id, cwd=d, env=env)


@pytest.mark.slurm
@pytest.mark.parametrize("launcher", ["srun"])
def test_stacks_names_the_hung_rank_then_the_watchdog_ends_the_job_on_the_cluster(work, launcher):
    """A hung job on the cluster: `stacks JOBID` names the rank blocked in its loader, with its node,
    while `submit --wait` follows the job; then the watchdog ends it with the roll call. (A 45-s watchdog: it must
    not end the job while stacks still asks; with 10 s, healthy ranks still building DDP on a loaded 2-core
    machine looked hung.) srun only (issue 57): the same hang under torchrun and spawn is
    test_a_rank_blocked_in_its_loader_is_named_by_stacks_then_the_watchdog_ends_the_job (each launcher, emulated
    nodes); their stacks through Slurm are test_stacks_of_an_unmodified_script_on_the_cluster_through_srun_overlap
    (torchrun) and test_a_rank_that_never_starts_on_the_cluster_is_named_with_its_node (spawn)."""
    d, env = work
    cli = subprocess.Popen(
        [sys.executable, "-m", "clusterddp", "submit", "--launcher", launcher, "--nodes", "2", "--gpus", "2",
         "--time", "5", "--hang-timeout", "0:45", "--retries", "0", "--wait", "hang.py", "--", "--where", "loader",
         "--rank", "1"], cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job_id = cli.stdout.readline().strip()
        assert job_id.isdigit(), job_id + cli.stderr.read()
        run_dir = d / "clusterddp-runs" / f"hang-{job_id}"
        deadline = time.monotonic() + 120
        while not run_dir.is_dir() and time.monotonic() < deadline:
            time.sleep(0.5)
        wait_for_hellos(run_dir, 4)
        lines = settled_stacks(job_id, d, run_dir, 1)
        node = node_of(1, job_id)
        assert re.match(rf"rank 1 \({node}\) is elsewhere:  hang.py:{SLEEP_IN_LOADER} __getitem__", lines[1]), lines
        out, err = cli.communicate(timeout=300)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    assert cli.returncode == contract.HANG_EXIT, err
    assert f"job {job_id} ended FAILED, exit code {contract.HANG_EXIT}" in err
    assert "the hang watchdog ended the job (hung since " in err
    assert re.search(rf"rank 1 \({node}\) is elsewhere:  hang.py:{SLEEP_IN_LOADER} __getitem__", err), err
    batch_log = (d / "clusterddp-runs" / f"hang-{job_id}.out").read_text()
    assert "clusterddp: the hang watchdog ended the job: no rank advanced for 45 s. Roll call:" in batch_log
    assert "3 of 4 ranks wait at the same place" in batch_log
    status = run_cli("status", job_id, cwd=d, env=env)
    assert re.search(rf"hung since \d\d:\d\d:\d\d: rank 1 at hang.py:{SLEEP_IN_LOADER} __getitem__", status.stdout)


@pytest.mark.slurm
@pytest.mark.slurm_releases("22.05")  # the runtime's rendezvous report: Slurm's part is the exit code, tested above
@pytest.mark.parametrize("launcher", ["srun", "spawn"])  # (torchrun's node naming: the test above, and the stacks')
def test_a_rank_that_never_starts_on_the_cluster_is_named_with_its_node(work, launcher):
    d, env = work
    env = dict(env, **{contract.TIMEOUT: "15"})  # sbatch passes the submitting environment on
    proc = run_cli("submit", "--launcher", launcher, "--nodes", "2", "--gpus", "2", "--time", "5", "--retries", "0",
                   "--wait", "hang.py", "--", "--where", "rendezvous", "--rank", "3", cwd=d, env=env, timeout=300)
    assert proc.returncode == contract.RENDEZVOUS_EXIT, proc.stderr
    assert re.search(r"3 of 4 ranks arrived; missing rank 3 \(node2\): never started", proc.stderr), proc.stderr
    job_id = proc.stdout.split()[0]
    batch_log = (d / "clusterddp-runs" / f"hang-{job_id}.out").read_text()
    assert "missing rank 3 (node2): never started" in batch_log


@pytest.mark.ranks
def test_an_outsider_on_master_port_cannot_keep_a_hung_job_alive(tmp_path):
    """Issue 23, class 9: the progress counter lives in the rendezvous store, which any process that reaches
    MASTER_PORT can write. Under its old fixed name an outsider adding to it kept a hung job alive, and a
    non-number there switched the watchdog off for good. The name is now a per-run secret: the same outsider,
    writing both, changes nothing, and the job still ends with the roll call."""
    import socket as sockets
    import threading
    from datetime import timedelta

    from torch.distributed import TCPStore

    with sockets.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = LocalJob(tmp_path, HANG, "--launcher", "srun", "--hang-timeout", "0:08", "--master-port", str(port),
                   str(HANG), "--", "--where", "loader", "--rank", "2")
    try:
        job.wait_joined({0, 1, 2, 3})
        outsider = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        stop, wrote = threading.Event(), []

        def meddle():
            while not stop.wait(0.5):
                try:
                    # the counter's old, fixed name, as the job's default group prefixes it (PrefixStores)
                    outsider.add("default_pg/0//clusterddp/progress", 1)
                    outsider.set("default_pg/0//clusterddp/progress/", "not a number")  # a guess at the new one
                    wrote.append(1)
                except Exception:  # the job ended and took the store with it
                    return
        t = threading.Thread(target=meddle, daemon=True)
        t.start()
        try:
            code, _, err = job.finish(timeout=120)
        except subprocess.TimeoutExpired:
            code, err = None, "the job was kept alive"
        stop.set()
    finally:
        job.kill()
    assert wrote, "the outsider never reached the store"
    assert code == contract.HANG_EXIT, err
    assert "the hang watchdog ended the job (hung since " in err and "Traceback" not in err
