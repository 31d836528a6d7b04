"""Warm starts (clusterddp/runtime/warm.py): a rank forked from a server that imported torch once behaves as the
same script started by ``python SCRIPT ARGS``: its arguments, environment, directory, streams, exit status and
traceback; the signals its task gets; its end when the task is killed; a cold start where no server answers.

Real processes: a server (preloading nothing here, to stay quick; the imports are what it saves, not what it does)
and clients started as srun starts a rank's task. Each behaviour is compared with the cold start of the same script.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterddp import contract
from clusterddp.runtime import warm

SCRIPT = r'''
import json, os, signal, sys, time
what = sys.argv[1]
print(json.dumps({"argv": sys.argv, "file": __file__, "name": __name__, "path0": sys.path[0], "cwd": os.getcwd(),
                  "x": os.environ.get("X"), "pid": os.getpid(), "ppid": os.getppid(),
                  "cpus": sorted(os.sched_getaffinity(0))}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if what == "hook":  # what an excepthook sees (the runtime's end at a lost peer reads sys.last_value)
    def hook(kind, value, tb):
        print("hook", kind.__name__, sys.last_value is value, sys.last_type is kind, file=sys.stderr)
    sys.excepthook = hook
    raise ConnectionError("Connection closed by peer")
if what == "interrupt":
    raise KeyboardInterrupt
if what == "raise":
    def deep():
        raise ValueError("boom at step 3")
    deep()
if what == "exit":
    sys.exit(int(sys.argv[2]))
if what == "message":
    sys.exit("stopped: no data")
if what == "term":
    signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM", flush=True), sys.exit(7)))
    signal.signal(signal.SIGUSR2, lambda *a: print("got SIGUSR2", flush=True))
    print("handlers set", flush=True)
    while True:
        time.sleep(60)
if what == "sleep":
    time.sleep(60)
if what == "selfkill":
    os.kill(os.getpid(), signal.SIGKILL)
if what == "unflushed":  # (written without a flush, then killed: under python -u it was out already)
    print("written before the kill")
    print("and to stderr", file=sys.stderr)
    os.kill(os.getpid(), signal.SIGKILL)
'''


@pytest.fixture
def server(tmp_path, request):
    """A warm server for this test's key (nothing preloaded unless the test says: ``@pytest.mark.preload(...)``),
    ended and checked gone afterwards."""
    marker = request.node.get_closest_marker("preload")
    preload = tuple(marker.args) if marker else ()
    env = dict(os.environ, **{contract.WARM: f"test-{tmp_path.name}", contract.PEER_DIR: str(tmp_path / "shm")})
    (tmp_path / "shm").mkdir()
    path = warm.socket_path(env)
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from clusterddp.runtime import warm; "
                             "sys.exit(warm.serve(sys.argv[1], preload=sys.argv[2:]))", path, *preload], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(path), proc.communicate(timeout=5)
    yield env, proc, path
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and not os.path.exists(path), (out, err)


def start(tmp_path: Path, env: dict, *args: str, warm_start: bool = True, cpus=None,
          unbuffered: bool = False) -> subprocess.Popen:
    """The script as a rank's task starts it: ``python [-u] [-m clusterddp.runtime.warmrun] train.py ARGS`` (-u: as
    torchrun starts its workers)."""
    (tmp_path / "job").mkdir(exist_ok=True)
    (tmp_path / "job" / "train.py").write_text(SCRIPT)
    python = [sys.executable, *(["-u"] if unbuffered else [])]
    argv = [*python, "-m", "clusterddp.runtime.warmrun"] if warm_start else python
    return subprocess.Popen([*argv, "train.py", *args], cwd=tmp_path / "job", env=dict(env, X="from the task"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)


def both(tmp_path: Path, env: dict, *args: str):
    """(warm, cold): each run's exit status, its first stdout line as JSON, the rest of stdout, and stderr."""
    out = []
    for warm_start in (True, False):
        proc = start(tmp_path, env, *args, warm_start=warm_start)
        stdout, stderr = proc.communicate(timeout=60)
        first, _, rest = stdout.partition("\n")
        out.append((proc.returncode, json.loads(first), rest, stderr))
    return out


@pytest.mark.ranks
def test_a_warm_rank_is_the_script_as_python_runs_it(tmp_path, server):
    env, proc, _ = server
    (w_code, w, _, w_err), (c_code, c, _, c_err) = both(tmp_path, env, "plain", "--lr", "0.1 two words")
    assert w_code == c_code == 0 and w_err == c_err == "to stderr\n", (w_err, c_err)
    same = ("argv", "file", "name", "path0", "cwd", "x")
    assert {k: w[k] for k in same} == {k: c[k] for k in same}, (w, c)
    assert w["argv"] == ["train.py", "plain", "--lr", "0.1 two words"] and w["x"] == "from the task"
    assert w["ppid"] == proc.pid and c["ppid"] != proc.pid  # forked by the server: warm
    for args in (("exit", "3"), ("message",), ("interrupt",), ("hook",), ("raise",)):
        (w_code, _, _, w_err), (c_code, _, _, c_err) = both(tmp_path, env, *args)
        assert (w_code, w_err) == (c_code, c_err), (args, w_err, c_err)
    assert 'File "' + str(tmp_path / "job" / "train.py") + '", line 18, in <module>' in w_err
    assert "ValueError: boom at step 3" in w_err and "warm.py" not in w_err and "runpy" not in w_err


@pytest.mark.ranks
def test_signals_reach_the_warm_rank_and_its_end_is_the_task_s(tmp_path, server):
    env, _, _ = server
    proc = start(tmp_path, env, "term")
    first = json.loads(proc.stdout.readline())
    assert proc.stdout.readline() == "handlers set\n"
    proc.send_signal(signal.SIGUSR2)
    assert proc.stdout.readline() == "got SIGUSR2\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.readline() == "got SIGTERM\n"
    assert proc.wait(timeout=10) == 7
    # a rank killed by a signal: its task ends by the same signal (srun then says "Killed", as for a cold rank)
    proc = start(tmp_path, env, "selfkill")
    assert proc.wait(timeout=10) == -signal.SIGKILL
    proc = start(tmp_path, env, "sleep")
    rank = json.loads(proc.stdout.readline())["pid"]
    os.kill(rank, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert first["pid"] != rank


@pytest.mark.ranks
def test_a_warm_rank_s_streams_are_buffered_as_its_task_s_python(tmp_path, server):
    """torchrun starts each worker as ``python -u``: what a rank wrote before it was killed is in its log, warm as
    cold; without -u (srun's tasks), block-buffered as a cold python's writing to a file or pipe."""
    env = {k: v for k, v in server[0].items() if k != "PYTHONUNBUFFERED"}  # (-u alone says it here)
    for unbuffered in (True, False):
        got = []
        for warm_start in (True, False):
            proc = start(tmp_path, env, "unflushed", warm_start=warm_start, unbuffered=unbuffered)
            out, err = proc.communicate(timeout=60)
            got.append((proc.returncode, out.splitlines()[1:], err.splitlines()[1:]))
        assert got[0] == got[1], (unbuffered, got)
        assert got[0][1:] == ((["written before the kill"], ["and to stderr"]) if unbuffered else
                              ([], ["and to stderr"])), (unbuffered, got)


@pytest.mark.ranks
def test_a_killed_task_takes_its_warm_rank_with_it(tmp_path, server):
    env, _, _ = server
    proc = start(tmp_path, env, "sleep")
    rank = json.loads(proc.stdout.readline())["pid"]
    proc.kill()  # (srun's SIGKILL to a task that outlived its KillWait)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _alive(rank) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(rank)


@pytest.mark.ranks
@pytest.mark.preload("torch", "torch.distributed.run")
def test_a_forked_torchrun_agent_s_workers_are_forked_too_and_a_killed_task_takes_them_all(tmp_path, server):
    """--warm-start under torchrun: the task is a client for ``-m clusterddp.runtime.agent`` (the agent, forked), whose
    workers are clients too (forked). The task ends as the agent did; killed (srun's SIGKILL after KillWait, or
    a lost node), it takes the agent, the workers' clients and the ranks with it: they live in the server's step,
    which no attempt's end would clear; so does an agent that ends by a signal it does not handle."""
    env, proc, _ = server
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text(SCRIPT)
    agent = [sys.executable, "-m", "clusterddp.runtime.warmrun", "-m", "clusterddp.runtime.agent", "--standalone",
             "--nnodes=1", "--nproc-per-node=2", "--monitor-interval=0.1", "--module", "clusterddp.runtime.warmrun",
             "train.py"]
    task = subprocess.run([*agent, "exit", "3"], cwd=tmp_path / "job", env=env, capture_output=True, text=True,
                          timeout=120)
    ranks = [json.loads(line) for line in task.stdout.splitlines() if line.startswith("{")]
    assert task.returncode == 1 and len(ranks) == 2, (task.stdout, task.stderr[-3000:])  # (the agent's: 1)
    assert {r["ppid"] for r in ranks} == {proc.pid}, ranks  # each rank the server's child
    assert "exitcode  : 3" in task.stderr, task.stderr[-3000:]  # (the agent's report: it ran the workers)
    for end in (signal.SIGKILL, signal.SIGUSR1):  # the task killed; the agent ended by a signal it does not handle
        task = subprocess.Popen([*agent, "sleep"], cwd=tmp_path / "job", env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        ranks = [json.loads(task.stdout.readline())["pid"] for _ in range(2)]
        deadline = time.monotonic() + 10
        while len(_children(proc.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        forked = _children(proc.pid)  # the server's: the agent and the two ranks
        assert set(ranks) < set(forked) and len(forked) == 3, (forked, ranks)
        agent_pid = (set(forked) - set(ranks)).pop()
        clients = _children(agent_pid)  # the agent's workers: clients
        assert len(clients) == 2, clients
        task.send_signal(end)
        assert task.wait(timeout=10) == -end
        everyone = [agent_pid, *clients, *ranks]
        while any(map(_alive, everyone)) and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        assert not any(map(_alive, everyone)), (end, [pid for pid in everyone if _alive(pid)])


def _children(pid: int) -> list:
    out = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read().rsplit(")", 1)[1].split()
            if entry.isdigit() and int(stat[1]) == pid and stat[0] != "Z":
                out.append(int(entry))
        except (OSError, IndexError):
            continue
    return sorted(out)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.ranks
def test_without_a_server_the_task_starts_its_rank_cold(tmp_path):
    env = dict(os.environ, **{contract.WARM: "nobody-serves-this", contract.PEER_DIR: str(tmp_path)})
    proc = start(tmp_path, env, "exit", "4")
    stdout, stderr = proc.communicate(timeout=60)
    first = json.loads(stdout.splitlines()[0])
    assert proc.returncode == 4 and first["pid"] == proc.pid, stderr  # exec: itself
    assert stderr == (f"clusterddp: warm start: no server answers at {warm.socket_path(env)}; starting train.py exit "
                      "cold\nto stderr\n"), stderr  # (said in the rank's log)
    off = {k: v for k, v in env.items() if k != contract.WARM}
    proc = start(tmp_path, off, "plain")
    assert proc.wait(timeout=60) == 0
    # started as torchrun starts its workers (python -u), the cold rank is unbuffered too: its last words are kept
    quiet = {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}
    proc = start(tmp_path, quiet, "unflushed", unbuffered=True)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL and stdout.endswith("written before the kill\n"), (stdout, stderr)


def test_the_socket_is_in_the_user_s_private_node_directory_and_off_without_a_key(tmp_path):
    env = {contract.WARM: "1234.0", contract.PEER_DIR: str(tmp_path), "SLURMD_NODENAME": "node2"}
    path = warm.socket_path(env)
    assert path is not None and os.path.dirname(path) == str(tmp_path / f"clusterddp-{os.getuid()}")
    assert path.endswith("-node2.sock")
    # (a path this long is bound through its directory's descriptor: the servers above live under tmp_path)
    assert len(warm.socket_path({**env, contract.PEER_DIR: "/dev/shm"}).encode()) < 100
    assert (os.stat(os.path.dirname(path)).st_mode & 0o777) == 0o700
    assert warm.socket_path({contract.PEER_DIR: str(tmp_path)}) is None
    os.chmod(os.path.dirname(path), 0o755)  # readable by others: never trusted
    assert warm.socket_path(env) is None


RANDOM = r"""
import json, random, sys
import numpy, torch
print(json.dumps({"python": random.random(), "numpy": float(numpy.random.rand()), "torch": float(torch.rand(1)),
                  "warm": "numpy" in sys.argv, "threads": torch.get_num_threads()}))
"""


@pytest.mark.ranks
@pytest.mark.preload("random", "numpy", "torch")
def test_each_warm_rank_draws_its_own_random_numbers_as_a_new_process_would(tmp_path, server):
    """Forked ranks would share the server's random states: every rank of a node drawing the same numbers. Python's,
    NumPy's and torch's are seeded anew, as a new process seeds each at import; torch's threads are as many as the
    task's OMP_NUM_THREADS says (torch reads it at its start: the server's value otherwise)."""
    env, _, _ = server
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "draw.py").write_text(RANDOM)
    draws = []
    for argv in ([sys.executable, "-m", "clusterddp.runtime.warmrun"],) * 2 + ([sys.executable],):
        out = subprocess.run([*argv, "draw.py"], cwd=tmp_path / "job", env=dict(env, OMP_NUM_THREADS="1"),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        draws.append(json.loads(out.stdout))
    warm_a, warm_b, cold = draws
    for source in ("python", "numpy", "torch"):
        assert len({warm_a[source], warm_b[source], cold[source]}) == 3, (source, draws)
    assert warm_a["threads"] == cold["threads"] == 1, draws  # (the server's: its own environment's)


@pytest.mark.ranks
def test_a_task_waits_for_its_node_s_server_while_it_imports_and_not_for_a_dead_one(tmp_path):
    """The first attempt's tasks start while their node's server is still importing: they wait for it (its pid,
    beside the socket, alive) and are forked warm; a server that died importing leaves a pid no task waits on."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "slow_import.py").write_text("import time\ntime.sleep(3)\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "mods"), **{contract.WARM: f"test-{tmp_path.name}",
                                                                   contract.PEER_DIR: str(tmp_path / "shm")})
    (tmp_path / "shm").mkdir()
    path = warm.socket_path(env)
    server = subprocess.Popen([sys.executable, "-c", "import sys; from clusterddp.runtime import warm; "
                               "sys.exit(warm.serve(sys.argv[1], preload=['slow_import']))", path], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().endswith(": starting\n")
        assert os.path.exists(path + warm.STARTING) and not os.path.exists(path)
        proc = start(tmp_path, env, "plain")
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0 and json.loads(stdout.splitlines()[0])["ppid"] == server.pid, stderr
        assert not os.path.exists(path + warm.STARTING)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with open(path + warm.STARTING, "w") as fh:
        fh.write(dead.stdout.strip())
    proc = start(tmp_path, env, "plain")
    stdout, _ = proc.communicate(timeout=60)  # (well within the client's wait for a live server: warmrun.WAIT_S)
    assert proc.returncode == 0 and json.loads(stdout.splitlines()[0])["pid"] == proc.pid  # cold


@pytest.mark.ranks
def test_the_rank_keeps_its_task_s_cpus_and_a_request_the_server_refuses_starts_cold(tmp_path, server):
    """srun binds each task to its CPUs (--cpus-per-task, --cpu-bind): the forked rank keeps its task's, not the
    server's. A request the server will not take (here an environment over its 1 MiB limit) runs nowhere twice: the
    task starts its rank itself."""
    env, proc, _ = server
    task = start(tmp_path, env, "plain", cpus={0})
    out, err = task.communicate(timeout=60)
    first = json.loads(out.splitlines()[0])
    assert task.returncode == 0 and first["ppid"] == proc.pid and first["cpus"] == [0], (first, err)
    huge = {f"HUGE{i}": "x" * 110_000 for i in range(10)}  # (one variable holds at most 128 KiB)
    task = start(tmp_path, dict(env, **huge), "plain")
    out, err = task.communicate(timeout=60)
    first = json.loads(out.splitlines()[0])
    assert task.returncode == 0 and first["pid"] == task.pid, (first, err)  # cold: the task is the rank


def test_warm_start_is_asked_where_it_applies_and_said_where_it_does_not(tmp_path):
    """--warm-start renders one server step per node and each rank's task (srun) or torchrun's worker as the
    client; spawn, a container or one GPU per task are a usage error that says what to do; --local says it ignores
    it."""
    from .conftest import run_cli

    (tmp_path / "train.py").write_text("print('hi')\n")
    ok = run_cli("submit", "--dry-run", "--launcher", "srun", "--nodes", "2", "--gpus", "2", "--warm-start",
                 "train.py", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("-m clusterddp.runtime.warm serve") == 1 and "--overlap" in ok.stdout
    assert "python3 -m clusterddp.runtime.warmrun train.py" in ok.stdout
    agents = run_cli("submit", "--dry-run", "--launcher", "torchrun", "--nodes", "2", "--gpus", "2", "--warm-start",
                     "-m", "pkg.train", "--", "--lr", "0.1", cwd=tmp_path)  # (torchrun: each worker the client)
    assert agents.returncode == 0, agents.stderr
    assert agents.stdout.count("-m clusterddp.runtime.warm serve") == 1 and "--overlap" in agents.stdout
    assert "--module clusterddp.runtime.warmrun -m pkg.train --lr 0.1 &" in agents.stdout, agents.stdout
    assert "python3 -m clusterddp.runtime.warmrun -m clusterddp.runtime.agent --nnodes=2" in agents.stdout  # agent
    plain = run_cli("submit", "--dry-run", "--launcher", "srun", "--nodes", "2", "--gpus", "2", "train.py",
                    cwd=tmp_path)
    assert plain.returncode == 0 and "warm" not in plain.stdout.lower(), plain.stdout
    for extra in (["--launcher", "spawn"], ["--launcher", "torchrun", "--apptainer", "x.sif"],
                  ["--launcher", "srun", "--gpu-request", "gpus-per-task"]):
        bad = run_cli("submit", "--dry-run", "--nodes", "2", "--gpus", "2", "--warm-start", *extra, "train.py",
                      cwd=tmp_path)
        assert bad.returncode == 2 and "--warm-start" in bad.stderr and "Traceback" not in bad.stderr, (extra, bad)
    local = run_cli("submit", "--local", "--dry-run", "--launcher", "srun", "--nodes", "2", "--warm-start",
                    "train.py", cwd=tmp_path)
    # (issue 79: --local honours it, a server per emulated node: tests/test_local.py runs it)
    assert local.returncode == 0 and "does not apply" not in local.stdout + local.stderr, local
    assert local.stdout.count("-m clusterddp.runtime.warm serve &") == 2 and "-m clusterddp.runtime.warmrun" in \
        local.stdout, local.stdout


