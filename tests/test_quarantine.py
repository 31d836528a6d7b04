"""Issue 25, points 1 and 5 without a cluster: how a job's leftovers are classified (faults.classify over the files
a job leaves, in the formats srun and torchrun write; the real thing runs in test_faults.py), the quarantine list,
`clusterddp nodes`, --exclude and --no-quarantine through the CLI."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from clusterddp.cli import cli
from clusterddp.healing import quarantine
from clusterddp.healing.faults import AMBIGUOUS, INFRASTRUCTURE, PROGRAM, SUSPECT, classify

TRACEBACK = """Traceback (most recent call last):
  File "/home/u/train.py", line 40, in <module>
    main()
  File "/home/u/train.py", line 33, in main
    raise ValueError("bad batch")
ValueError: bad batch
"""
PEER_GONE = """Traceback (most recent call last):
  File "/home/u/train.py", line 30, in main
    dist.all_reduce(t)
RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.200.0.2]:1234
"""
TORCHRUN_ROOT = """[W] torch.distributed.elastic.multiprocessing.api: Sending process 77 closing signal SIGTERM
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : {time}
  host      : {host}
  rank      : {rank} (local_rank: 0)
  exitcode  : {code} (pid: 4711)
  error_file: <N/A>
  traceback : {why}
============================================================
"""


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path


def job(tmp_path: Path, batch: str, logs: dict) -> tuple:
    run = tmp_path / "run"
    run.mkdir()
    for name, text in logs.items():
        (run / name).write_text(text)
    (tmp_path / "batch.out").write_text(batch)
    return run, sorted(run.glob("*.out")), tmp_path / "batch.out"


def test_every_rank_of_a_node_killed_by_a_signal_first_makes_it_a_suspect(tmp_path):
    """Issue 53: nothing from Slurm, so a suspect (moved off where a spare is free), not the node's proven fault."""
    run, logs, batch = job(tmp_path, "srun: error: node2: tasks 2-3: Killed\n"
                                     "srun: Terminating StepId=5.0\n"
                                     "srun: error: node1: tasks 0-1: Terminated\n",
                           {"rank-0.out": PEER_GONE, "rank-1.out": PEER_GONE, "rank-2.out": "", "rank-3.out": ""})
    fault = classify(run, logs, batch, ["node1", "node2"])
    assert fault.kind == SUSPECT and fault.nodes == ("node2",)
    assert fault.line() == ("fault: suspect on node2: rank(s) 2-3 on node2: killed (every one of its 2 ranks at "
                            "once, no Python traceback, nothing from Slurm) (probably the node: tried without it where "
                            'a spare is free, not quarantined); evidence: batch.out: "srun: error: node2: tasks 2-3: '
                            'Killed"')


def test_a_python_exception_first_is_the_program(tmp_path):
    run, logs, batch = job(tmp_path, "srun: error: node2: task 3: Exited with exit code 1\n"
                                     "srun: error: node1: tasks 0-1: Killed\n",
                           {"rank-0.out": PEER_GONE, "rank-3.out": TRACEBACK})
    fault = classify(run, logs, batch, ["node1", "node2"])
    assert fault.kind == PROGRAM and fault.nodes == ()
    assert fault.why == "rank-3.out: ValueError: bad batch"


def test_torchrun_s_earliest_root_cause_decides(tmp_path):
    killed = TORCHRUN_ROOT.format(time="2026-12-01_10:00:05", host="node2.cluster.example", rank=2, code=-9,
                                  why="Signal 9 (SIGKILL) received by PID 4711")
    collateral = TORCHRUN_ROOT.format(time="2026-12-01_10:00:07", host="node1.cluster.example", rank=0, code=1,
                                      why=PEER_GONE.replace("\n", "\n  "))
    run, logs, batch = job(tmp_path, "srun: error: node1: task 0: Exited with exit code 1\n"
                                     "srun: error: node2: task 1: Exited with exit code 1\n",
                           {"node-node1.out": collateral, "node-node2.out": killed})
    fault = classify(run, logs, batch, ["node1", "node2"], launcher="torchrun")
    # one worker of node2 killed (its report lists no other failure): one process, unclear (issue 53)
    assert fault.kind == AMBIGUOUS and fault.nodes == ("node2",), fault
    assert fault.why.startswith("rank(s) 2 on node2: killed (1 rank(s), nothing else said"), fault.why
    # torchrun's times are whole seconds: the collateral failure in the same second does not hide the signal
    (run / "node-node1.out").write_text(collateral.replace("10:00:07", "10:00:05"))
    assert classify(run, logs, batch, ["node1", "node2"], launcher="torchrun") == fault
    # under spawn (or srun) node-N.out is the program's own output: a "Root Cause" block there is its text
    assert classify(run, logs, batch, ["node1", "node2"], launcher="spawn") != fault


def test_srun_s_node_failure_and_slurm_s_node_fail(tmp_path):
    run, logs, batch = job(tmp_path, "srun: error: Node failure on node7\n", {})
    assert classify(run, logs, batch).nodes == ("node7",)
    (tmp_path / "batch.out").write_text("")
    fault = classify(run, logs, batch, node_failed=True)
    assert fault.kind == INFRASTRUCTURE and fault.nodes == ()


def test_a_native_abort_of_the_program_is_the_program_not_the_node(tmp_path):
    """Issue 39: libstdc++'s "terminate called ..." then SIGABRT (an uncaught C++ exception, or native threads left
    at exit as in a script that never destroys its process group) is the program's: it would end the same way on
    any node. The same abort from torch's distributed watchdog after a peer died is collateral (a peer was lost:
    ambiguous), and a SIGABRT with nothing said is still the process's own abort()."""
    exiting = "DONE at step 36\nterminate called without an active exception\n"
    run, logs, batch = job(tmp_path, "srun: error: node2: task 3: Aborted (core dumped)\n"
                                     "srun: error: node1: tasks 0-1: Terminated\n",
                           {"rank-0.out": "", "rank-3.out": exiting})
    fault = classify(run, logs, batch, ["node1", "node2"])
    assert fault.kind == PROGRAM and fault.nodes == (), fault
    assert fault.why == ("rank-3.out: terminate called without an active exception: the program's native code "
                         "ended it (abort), as it would on any node"), fault
    thrown = "terminate called after throwing an instance of 'std::runtime_error'\n  what():  bad shape\n"
    (run / "rank-3.out").write_text(thrown)
    assert classify(run, logs, batch, ["node1", "node2"]).kind == PROGRAM
    (run / "rank-3.out").write_text("terminate called after throwing an instance of 'c10::DistBackendError'\n")
    watchdog = classify(run, logs, batch, ["node1", "node2"])
    assert watchdog.kind == AMBIGUOUS and "a peer was lost" in watchdog.why, watchdog  # collateral
    (run / "rank-3.out").write_text("")
    silent = classify(run, logs, batch, ["node1", "node2"])
    assert silent.kind == PROGRAM and "SIGABRT: the process ended itself with abort()" in silent.why, silent
    # torchrun: the root cause's exit code -6 (SIGABRT) and the same words in that node's log
    aborted = TORCHRUN_ROOT.format(time="2026-12-01_10:00:05", host="node2", rank=3, code=-6,
                                   why="Signal 6 (SIGABRT) received by PID 4711") + "[default1]:" + exiting
    (tmp_path / "t").mkdir()
    run2, logs2, batch2 = job(tmp_path / "t", "", {"node-node2.out": aborted})
    assert classify(run2, logs2, batch2, ["node1", "node2"], launcher="torchrun").kind == PROGRAM
    (run2 / "node-node2.out").write_text(aborted.replace("terminate called", "terminated"))
    assert classify(run2, logs2, batch2, ["node1", "node2"], launcher="torchrun").kind == PROGRAM  # SIGABRT still
    # A "Root Cause" block the program printed itself (torchrun prefixes a rank's lines) is not torchrun's.
    planted = "".join(f"[default0]:{line}\n" for line in TORCHRUN_ROOT.format(
        time="2026-12-01_10:00:05", host="node1", rank=0, code=-9, why="Signal 9 (SIGKILL)").splitlines())
    (run2 / "node-node2.out").write_text(planted + "[default0]:" + TRACEBACK.replace("\n", "\n[default0]:"))
    assert classify(run2, logs2, batch2, ["node1", "node2"], launcher="torchrun").kind == PROGRAM


def test_nothing_to_tell_is_none_and_names_are_data(tmp_path):
    run, logs, batch = job(tmp_path, "srun: error: node1: task 0: Exited with exit code 3\n", {"rank-0.out": "x\n"})
    assert classify(run, logs, batch) is None
    (tmp_path / "batch.out").write_text("srun: error: $(reboot): tasks 0: Killed\n")  # not a node name
    assert classify(run, logs, batch) is None


def test_quarantine_lists_times_out_and_forgets(state, monkeypatch):
    assert quarantine.add("here", ["node2", "bad name;"], "rank 2 killed", "17") == ["node2"]
    first = quarantine.active("here")["node2"]["since"]
    quarantine.add("here", ["node2"], "rank 2 killed", "17")  # the same job seen again keeps its time
    assert quarantine.active("here")["node2"]["since"] == first
    assert quarantine.active("here", now=first + quarantine.DEFAULT_SECONDS + 1) == {}
    runner = CliRunner()
    listed = runner.invoke(cli, ["nodes"])
    assert listed.exit_code == 0 and listed.output.splitlines()[0].split() == ["NODE", "SINCE", "JOB", "REASON"]
    assert listed.output.splitlines()[1].startswith("node2  ") and listed.output.rstrip().endswith("rank 2 killed")
    missing = runner.invoke(cli, ["nodes", "--forget", "node9"])
    assert missing.exit_code == 2 and "node 'node9' is not quarantined on cluster 'here'" in missing.output
    assert runner.invoke(cli, ["nodes", "--forget", "node2"]).exit_code == 0
    assert runner.invoke(cli, ["nodes"]).output == "no node is quarantined on cluster 'here'\n"


def test_a_planted_or_broken_list_is_data(state):
    path = quarantine.path("here")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"node1": {"reason": "\x1b[2Jx", "job": "1", "since": time.time()},
                                "--partition=x": {"reason": "r", "job": "1", "since": time.time()},
                                "node3": "not an entry"}))
    assert list(quarantine.active("here")) == ["node1"] and "\x1b" not in quarantine.active("here")["node1"]["reason"]
    path.write_text("{not json")
    assert quarantine.active("here") == {}


def test_dry_run_leaves_quarantined_and_excluded_nodes_out(state, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print(1)\n")
    runner = CliRunner()
    quarantine.add("here", ["node2"], "rank 2 killed", "17")
    out = runner.invoke(cli, ["submit", "--dry-run", "-x", "gpu[01-03,07],node9", "train.py"])
    assert out.exit_code == 0, out.output
    assert '#SBATCH --exclude="gpu[01-03,07],node9,node2"' in out.stdout.splitlines(), out.stdout
    assert "leaving out node(s) quarantined after a fault: node2 (job 17: rank 2 killed)" in out.stderr
    plain = runner.invoke(cli, ["submit", "--dry-run", "--no-quarantine", "train.py"])
    assert "--exclude" not in plain.stdout and "quarantined" not in plain.stderr
    bad = runner.invoke(cli, ["submit", "--dry-run", "-x", "node1;reboot", "train.py"])
    assert bad.exit_code == 2 and "invalid node to exclude 'node1;reboot'" in bad.output
    owned = runner.invoke(cli, ["submit", "--dry-run", "--sbatch-arg=--exclude=node4", "train.py"])
    assert owned.exit_code == 2 and "use --exclude (clusterddp adds the quarantined nodes" in owned.output


def test_srun_task_ranges_from_a_log_are_bounded(tmp_path):
    """A log is data: a task range of a billion is read in bounded memory (unbounded, it would be a list of a
    billion ints, ~36 GB); the traceback of one of the killed tasks is its own: the program's."""
    run, logs, batch = job(tmp_path, "srun: error: node2: tasks 0-999999999: Killed\n", {"rank-5.out": TRACEBACK})
    assert classify(run, logs, batch, ["node1", "node2"]).kind == PROGRAM


def test_an_exception_s_record_is_the_evidence_not_text(tmp_path):
    """Issue 39: the runtime's exception hook records what ended a rank (type, message, the user's FILE:LINE) beside
    its hello; the fault is read from that record. A peer's reaction (DistBackendError) is no cause; a killed node's
    ranks are still the node's though other ranks recorded their reaction."""
    import os
    import subprocess
    import sys

    from .conftest import ROOT

    run = tmp_path / "run"
    run.mkdir()
    job_py = tmp_path / "job.py"
    job_py.write_text("from clusterddp import runtime\nruntime.init(allow_single=True)\n\ndef step():\n"
                      "    raise ValueError('bad batch 7')\n\nstep()\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "CLUSTERDDP_RUN_DIR": str(run)}
    proc = subprocess.run([sys.executable, str(job_py)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "ValueError: bad batch 7" in proc.stderr, proc.stderr  # shown as always
    record = json.loads((run / "stacks" / "ranks" / "exception-0.json").read_text())
    assert record["type"] == "builtins.ValueError" and record["user"] == f"{job_py}:5", record
    (run / "rank-0.out").write_text("nothing printed\n")  # (no traceback text needed)
    (tmp_path / "batch.out").write_text("srun: error: node1: task 0: Exited with exit code 1\n")
    fault = classify(run, [run / "rank-0.out"], tmp_path / "batch.out", ["node1"])
    assert fault.kind == PROGRAM and fault.why == f"rank 0: ValueError: bad batch 7 (at {job_py}:5)", fault
    reaction = dict(record, rank=1, type="torch.distributed.DistBackendError", message="peer gone",
                    time=record["time"] - 5)
    (run / "stacks" / "ranks" / "exception-1.json").write_text(json.dumps(reaction))
    assert classify(run, [run / "rank-0.out"], tmp_path / "batch.out", ["node1"]) == fault
    (tmp_path / "batch.out").write_text("srun: error: node2: tasks 2-3: Killed\nsrun: error: node1: task 0: "
                                        "Exited with exit code 1\n")
    killed = classify(run, [run / "rank-0.out"], tmp_path / "batch.out", ["node1", "node2"], per_node=2)
    assert killed.kind == SUSPECT and killed.nodes == ("node2",), killed  # issue 53: nothing from Slurm
