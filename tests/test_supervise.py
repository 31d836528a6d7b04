"""Issue 39: the one supervisor (clusterddp/healing/supervise.py), table-driven: evidence, retries used, spares,
the requeue budget and the partition's room in; run here / requeue without / end, with the sentence, out. Then the
same decisions through `python -m clusterddp.healing next` as the batch script asks, with bad input (an unreadable
record, a partition sinfo cannot describe, a supervisor that fails) ending the job in one line."""
from __future__ import annotations

import subprocess
import sys

import pytest

from clusterddp import contract
from clusterddp.healing import attempts
from clusterddp.healing.faults import Fault, FaultKind
from clusterddp.healing.supervise import Act, Policy, Room, after_failure, after_gate, parse_room

from .test_attempts import supervisor

K = FaultKind
HOSTS = ("node1", "node2", "node3")          # a 2-node job with one spare
POLICY = Policy(nodes=2, per_node=2, retries=2, requeues=True, max_requeues=3, gate=True)
ROOMY = Room("debug", ("node1", "node2", "node3", "node4"))
TIGHT = Room("pair", ("node1", "node2"))


def past(fault: str, nodes: str, nxt: str, signal_nodes: str = "node1,node2") -> attempts.Attempt:
    return attempts.Attempt(0, 0, 0, 0, tuple(signal_nodes.split(",")), 137, fault,
                            tuple(n for n in nodes.split(",") if n), "before", nxt)


NODE2 = Fault(K.INFRASTRUCTURE, ("node2",), "rank(s) 2-3 on node2: killed", "Killed", (2, 3))
ONE_RANK = Fault(K.AMBIGUOUS, ("node2",), "rank(s) 3 on node2: killed (1 of the node's 2 ranks)", "Killed", (3,))
SEGV = Fault(K.AMBIGUOUS, ("node2",), "rank(s) 3 on node2: segmentation fault", "Segmentation fault", (3,))
SEGV_ON_3 = SEGV._replace(nodes=("node3",))
SUSPECT2 = Fault(K.SUSPECT, ("node2",), "rank(s) 2-3 on node2: killed (every one of its 2 ranks)", "Killed", (2, 3))

CASES = [
    # (what happened, earlier attempts, hosts, room, policy) -> (action, nodes, next, final kind, words said)
    ("node fault, spare left", NODE2, [], HOSTS, ROOMY, POLICY,
     Act.GATE, ("node1", "node3"), "retry", K.INFRASTRUCTURE, "retrying on node1,node3 without node2 (retry 1 of 2)"),
    ("node fault, no spare: requeue", NODE2, [], HOSTS[:2], ROOMY, POLICY,
     Act.REQUEUE, ("node2",), "requeue", K.INFRASTRUCTURE, ""),
    ("node fault, no spare, partition too small: in place", NODE2, [], HOSTS[:2], TIGHT, POLICY,
     Act.GATE, ("node1", "node2"), "in-place", K.INFRASTRUCTURE,
     "partition pair has 2 usable node(s); without node2, 1 is left; the job needs 2: retrying in place"),
    ("node fault, sinfo said nothing", NODE2, [], HOSTS[:2], None, POLICY,
     Act.END, (), "end", K.INFRASTRUCTURE, "sinfo could not describe the job's partition"),
    ("node fault, requeue off", NODE2, [], HOSTS[:2], ROOMY, POLICY._replace(requeues=False),
     Act.END, (), "end", K.INFRASTRUCTURE, "requeue is off (--time or --requeue turns it on)"),
    ("node fault, requeue limit", NODE2, [], HOSTS[:2], ROOMY,
     POLICY._replace(max_requeues=0), Act.END, (), "end", K.INFRASTRUCTURE, "the requeue limit is reached"),
    ("retries used", NODE2, [past("infrastructure", "node3", "retry"), past("ambiguous", "node1", "in-place")],
     HOSTS, ROOMY, POLICY, Act.END, (), "end", K.INFRASTRUCTURE, "2 of --retries 2 used"),
    ("a time-limit requeue is no retry", NODE2, [past("", "", "requeue")] * 3, HOSTS, ROOMY, POLICY,
     Act.GATE, ("node1", "node3"), "retry", K.INFRASTRUCTURE, "retry 1 of 2"),
    ("ambiguous: once in place", ONE_RANK, [], HOSTS, ROOMY, POLICY,
     Act.GATE, ("node1", "node2", "node3"), "in-place", K.AMBIGUOUS, "retrying once in place on node1,node2"),
    # Issue 53: unclear twice in a row is the program's (a node is blamed only on evidence about the node).
    ("ambiguous again on the same node: the program", ONE_RANK, [past("ambiguous", "node2", "in-place")], HOSTS,
     ROOMY, POLICY, Act.END, (), "end", K.PROGRAM, "an unclear failure again after a retry in place is the program's"),
    ("a segfault again in place: the program", SEGV, [past("ambiguous", "node2", "in-place")], HOSTS, ROOMY, POLICY,
     Act.END, (), "end", K.PROGRAM, "an unclear failure again after a retry in place is the program's"),
    ("the same again on another node: the program", SEGV_ON_3, [past("ambiguous", "node2", "in-place")], HOSTS,
     ROOMY, POLICY, Act.END, (), "end", K.PROGRAM, "an unclear failure again after a retry in place is the program's"),
    ("suspect, spare left: without it, no quarantine", SUSPECT2, [], HOSTS, ROOMY, POLICY,
     Act.GATE, ("node1", "node3"), "retry", K.SUSPECT, "retrying on node1,node3 without node2 (a suspect, not quar"),
    ("suspect, no spare: in place, never a requeue", SUSPECT2, [], HOSTS[:2], ROOMY, POLICY,
     Act.GATE, ("node1", "node2"), "in-place", K.SUSPECT, "retrying in place on node1,node2: no spare to leave node2"),
    ("suspect again on the same node: the node", SUSPECT2, [past("suspect", "node2", "in-place")], HOSTS[:2], ROOMY,
     POLICY, Act.REQUEUE, ("node2",), "requeue", K.INFRASTRUCTURE, ""),
    ("a suspect counts against --retries", SUSPECT2, [past("suspect", "node3", "retry")] * 2, HOSTS, ROOMY, POLICY,
     Act.END, (), "end", K.SUSPECT, "2 of --retries 2 used"),
    ("ambiguous after a node fault: in place", ONE_RANK, [past("infrastructure", "node3", "retry")], HOSTS, ROOMY,
     POLICY, Act.GATE, ("node1", "node2", "node3"), "in-place", K.AMBIGUOUS, "retry 2 of 2"),
    ("program", Fault(K.PROGRAM, (), "rank-3.out: ValueError"), [], HOSTS, ROOMY, POLICY,
     Act.END, (), "end", K.PROGRAM, "the program's fault"),
    ("after the work", Fault(K.AFTER_WORK, (), "rank 3 aborted after its work ended"), [], HOSTS, ROOMY, POLICY,
     Act.END, (), "end", K.AFTER_WORK, "the work had ended; no node is blamed"),
    ("unknown", Fault(K.UNKNOWN, (), "nothing"), [], HOSTS, ROOMY, POLICY,
     Act.END, (), "end", K.UNKNOWN, "nothing the job left tells"),
    ("node unknown", Fault(K.INFRASTRUCTURE, (), "a hang"), [], HOSTS, ROOMY, POLICY,
     Act.END, (), "end", K.INFRASTRUCTURE, "the node at fault is not known"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_decision_table(case):
    _, fault, history, hosts, room, policy, act, nodes, nxt, kind, said = case
    ran_on = hosts[:2]
    action = after_failure(fault, history=history, policy=policy, hosts=hosts, bad=(), ran_on=ran_on, restart=0,
                           room=room, exit_code=137)
    assert (action.act, action.nodes, action.next) == (act, nodes, nxt), action
    assert action.fault is not None and action.fault.kind == kind, action
    assert said in " ".join(action.say), action.say
    if act == Act.END:
        assert action.exit == 137
    if nxt == "in-place":
        assert not set(ran_on) & set(action.bad), action  # in place: none of the job's nodes is left out


def test_the_docs_table_is_the_code_s():
    """Issue 53: docs/node-failure.md shows DECISIONS as they are, and every fault kind has its row."""
    from pathlib import Path

    from clusterddp.healing.supervise import DECISIONS, decision_rows

    docs = (Path(__file__).resolve().parents[1] / "docs" / "node-failure.md").read_text()
    table = [line for line in docs.splitlines() if line.startswith("|") and "**" in line or
             line.startswith("| evidence")]
    code = [ln for ln in decision_rows().splitlines() if ln != "|---|---|---|"]
    assert table == code
    assert decision_rows() in docs
    assert {kind for _, kind, _, _ in DECISIONS} == set(K)


def test_a_gate_that_could_not_run_blames_no_node():
    from clusterddp.healing.supervise import gate_not_run

    first = gate_not_run(history=[], policy=POLICY, hosts=HOSTS, bad=(), why="srun: error: Unable to create step")
    assert (first.act, first.nodes, first.bad, first.next) == (Act.GATE, HOSTS, (), "in-place"), first
    assert first.fault is not None and first.fault.kind == K.GATE and not first.fault.nodes
    again = gate_not_run(history=[past("gate", "", "in-place")], policy=POLICY, hosts=HOSTS, bad=(), why="x")
    assert (again.act, again.bad, again.exit) == (Act.END, (), contract.EXIT["RUNTIME"]), again
    assert "the health gate could not run (twice, or no retry left" in again.say[0]
    spent = gate_not_run(history=[past("ambiguous", "", "in-place"), past("suspect", "node2", "retry")],
                         policy=POLICY, hosts=HOSTS, bad=(), why="x")
    assert spent.act == Act.END and "2 of --retries 2 used" in spent.say[0]
    assert attempts.at_fault([past("gate", "", "in-place"), past("suspect", "node2", "retry")]) == []  # no quarantine


def test_after_the_gate():
    tight = after_gate(["node2"], history=[], policy=POLICY, hosts=HOSTS[:2], bad=(), restart=0, room=TIGHT)
    assert tight.act == Act.END and tight.next == "end" and "without node2, 1 is left; the job needs 2" in tight.say[1]
    spare = after_gate(["node2"], history=[], policy=POLICY, hosts=HOSTS, bad=(), restart=0, room=TIGHT)
    assert (spare.act, spare.nodes, spare.bad) == (Act.RUN, ("node1", "node3"), ("node2",))
    requeue = after_gate(["node2"], history=[past("infrastructure", "node7", "requeue")], policy=POLICY,
                         hosts=HOSTS[:2], bad=(), restart=1, room=ROOMY)
    assert (requeue.act, requeue.nodes) == (Act.REQUEUE, ("node2", "node7"))  # earlier requeues' nodes stay out
    spent = after_gate(["node2"], history=[past("infrastructure", "node7", "requeue"),
                                           past("ambiguous", "", "in-place")],
                       policy=POLICY, hosts=HOSTS[:2], bad=(), restart=1, room=ROOMY)
    assert spent.act == Act.END and "2 of --retries 2 used" in spent.say[-1], spent  # a requeue is a retry too


def test_sinfo_states_decide_what_is_usable():
    room = parse_room("debug", "node1 alloc\nnode2 idle*\nnode3 drain\nnode4 mix\nnode5 down\nnode6 idle~\n"
                               "node7 comp\nnode8 maint\n")
    assert room == Room("debug", ("node1", "node4", "node7"))
    assert parse_room("debug", "") is None and parse_room("debug", None) is None


def answer(proc: subprocess.CompletedProcess) -> list:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\n")[:4]


def test_the_batch_script_s_questions(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert answer(supervisor(run, "start")) == ["run", "node1,node2", "", "0"]
    assert answer(supervisor(run, "start", "--gate")) == ["gate", "node1,node2,node3", "", "0"]
    gate = run / contract.HEALTH_DIR.format(restarts=0, attempt=0)
    gate.mkdir(parents=True)
    for node in ("node1", "node3"):
        (gate / f"{node}.ok").write_text("")
    (gate / "node2.out").write_text("node2: ECC errors\n--health-check exited with 3\n")
    proc = supervisor(run, "gated", "--gate")
    assert answer(proc) == ["run", "node1,node3", "node2", "0"]
    assert "clusterddp: health gate: node2 gets no rank: node2: ECC errors --health-check exited with 3" in proc.stderr
    # The attempt succeeded: recorded, the end.
    assert answer(supervisor(run, "ended", "--status", "0", "--ran-on", "node1,node3", "--bad", "node2")) == [
        "end", "", "node2", "0"]
    (done,) = attempts.read(run)
    assert (done.nodes, done.exit, done.next) == (("node1", "node3"), 0, "end")


def test_a_requeue_that_would_strand_the_job_is_never_asked(tmp_path):
    run = tmp_path / "run"
    (run / "health").mkdir(parents=True)
    (run / "rank-0.out").write_text("")
    (run / contract.STEP_ERR.format(restarts=0, attempt=0)).write_text(  # Slurm's word about node2
        "srun: error: Node failure on node2\nsrun: error: node2: tasks 2-3: Killed\n")
    (run / contract.SINFO_FILE).write_text("node1 alloc\nnode2 alloc\n")
    base = ["--hosts", "node1,node2", "--partition", "pair", "--ran-on", "node1,node2"]
    proc = subprocess.run([sys.executable, "-m", "clusterddp.healing", "next", "ended", "--run-dir", str(run),
                           "--nodes", "2", "--per-node", "2", "--retries", "2", "--max-requeues", "3", "--requeues",
                           "--status", "137", *base], capture_output=True, text=True, timeout=60)
    assert answer(proc) == ["gate", "node1,node2", "", "0"], proc.stderr
    assert ("clusterddp: partition pair has 2 usable node(s); without node2, 1 is left; the job needs 2: retrying in "
            "place on node1,node2 if the health gate passes node2") in proc.stderr
    (first,) = attempts.read(run)
    assert (first.fault, first.fault_nodes, first.next) == ("infrastructure", ("node2",), "in-place")
    assert attempts.at_fault([first]) == []  # run again on it: not quarantined


@pytest.mark.parametrize("damage", ["attempts-dir", "no-sinfo", "bad-args"])
def test_bad_input_ends_the_job_in_one_line(tmp_path, damage):
    run = tmp_path / "run"
    run.mkdir()
    (run / contract.STEP_ERR.format(restarts=0, attempt=0)).write_text("srun: error: Node failure on node2\n")
    args = ["--hosts", "node1,node2", "--nodes", "2", "--per-node", "2", "--retries", "2", "--max-requeues", "3",
            "--requeues", "--status", "137", "--ran-on", "node1,node2"]
    if damage == "attempts-dir":  # the record cannot be written
        (run / contract.ATTEMPTS_FILE).mkdir()
    if damage == "bad-args":
        args[args.index("--status") + 1] = "x"
    proc = subprocess.run([sys.executable, "-m", "clusterddp.healing", "next", "ended", "--run-dir", str(run), *args],
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    if damage == "no-sinfo":  # no room known: not requeued blindly
        assert answer(proc)[0] == "end" and "sinfo could not describe the job's partition" in proc.stderr
    else:
        assert proc.returncode != 0 and proc.stdout == "", proc.stdout
    assert (run / contract.STEP_ERR.format(restarts=0, attempt=0)).exists()  # the logs stay


def test_a_node_failure_slurm_ended_is_recorded_at_the_next_restart_s_start(tmp_path):
    """Issue 53: Slurm ends (and requeues) a job whose node failed; its batch script may be killed before it records
    the attempt. The requeued job's first question records Slurm's word from the last attempt's srun messages as that
    attempt's fault, once; an attempt that was recorded, or one Slurm said nothing about, is left as it is."""
    run = tmp_path / "run"
    run.mkdir()
    (run / contract.STEP_ERR.format(restarts=0, attempt=0)).write_text(
        "srun: error: node1: task 1: Exited with exit code 1\nsrun: error: Node failure on node2\n")
    args = ["--run-dir", str(run), "--hosts", "node1,node3", "--nodes", "2", "--per-node", "2", "--retries", "2",
            "--max-requeues", "3", "--requeues"]
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "clusterddp.healing", "next", "start", "--restart", "1", *args],
                              capture_output=True, text=True, timeout=60)
        assert answer(proc)[:2] == ["run", "node1,node3"], proc.stderr
    (only,) = attempts.read(run)
    assert (only.restart, only.attempt, only.fault, only.fault_nodes, only.next) == (
        0, 0, "infrastructure", ("node2",), "requeue"), only
    assert only.evidence == 'srun-0.0.err: "srun: error: Node failure on node2"'
    assert attempts.at_fault([only]) == [(("node2",), f"Slurm reported a node failure; evidence: {only.evidence}")]
