"""Issue 25 on the real 3-node test cluster: every rank process on node2 SIGKILLed mid-run (a lost node, as far as
the job can tell); the batch script's retry loop runs the step again on a spare (or requeues the job without
node2), from the last checkpoint, and the result is bit-identical to an uninterrupted run, step for step. A hang
that comes back at the same line on another node is the program's. 4 ranks on 2 nodes."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

import clusterddp
from clusterddp.backends.slurm.commands import Slurm, parse_scontrol
from clusterddp.healing import attempts
from clusterddp.observe import goodput

from .conftest import CLUSTER_SH, SCRIPTS, run_cli
from .procs import kill_at_once
from .test_faults import _rank_pids
from .test_hangs import SLEEP_IN_LOADER
from .test_requeue import (
    RANKS,
    TOTAL_STEPS,
    identical,
    interrupt_and_release,
    job_args,
    rank_steps,
    spoil_checkpoints,
    steps,
)

pytestmark = pytest.mark.slurm
slurm = Slurm.here()
EVERY = 4  # checkpoint interval (steps)
ONCE = pytest.mark.slurm_releases("22.05")


@pytest.fixture
def work(slurm_env, tmp_path):
    for script in ("resumable.py", "hang.py"):
        shutil.copy(SCRIPTS / script, tmp_path)
    return tmp_path


def victims_logged(log: Path, n: int, ranks=(2, 3)) -> bool:
    """Rank 0 and the ranks about to be killed logged step ``n`` (resumable.py logs after its optimizer step, then
    sleeps): a kill now lands between steps, after the step's random states went to the buddies, as a real loss
    mostly does. (A loss after the gradient all-reduce and before the lost rank's optimizer step leaves its random
    states with nobody: peer heal then falls back to the checkpoint, rightly; tests/test_peer_heal.py.)"""
    if len(steps(log)) < n:
        return False
    for rank in ranks:
        path = Path(f"{log}.rank{rank}")
        if not path.exists() or len(path.read_text().splitlines()) < n:
            return False
    return True


def kill_node2_after(log: Path, n: int, script: str = "resumable.py", spoil: Optional[Path] = None) -> float:
    """SIGKILL every rank process on node2 at once (a lost node) when rank 0 logged ``n`` steps; returns when.
    ``spoil``: the checkpoint directory, whose files are made garbage first (issue 55: a peer heal reads none)."""
    deadline = time.monotonic() + 150
    while not victims_logged(log, n) and time.monotonic() < deadline:
        time.sleep(0.05)
    victims = _rank_pids("node2", script)
    assert len(victims) == 2, victims  # ranks 2 and 3
    if spoil is not None:
        assert spoil_checkpoints(spoil) >= 1
    kill_at_once(victims)
    return time.monotonic()


def freeze_node2_after(log: Path, n: int, script: str = "resumable.py") -> float:
    """SIGSTOP every rank process on node2 (a wedged node: its processes stop answering, nothing from Slurm, as a
    node whose network or kernel hung leaves them) when rank 0 logged ``n`` steps. The others then wait in their
    all-reduce until the hang watchdog's roll call, which node2's ranks cannot answer."""
    deadline = time.monotonic() + 150
    while not victims_logged(log, n) and time.monotonic() < deadline:
        time.sleep(0.05)
    victims = _rank_pids("node2", script)
    assert len(victims) == 2, victims  # ranks 2 and 3
    for pid in victims:
        os.kill(pid, signal.SIGSTOP)
    return time.monotonic()


def _epoch(clock: str) -> float:
    """scontrol's local time ('2026-12-03T19:40:01') as a Unix time."""
    return time.mktime(time.strptime(clock, "%Y-%m-%dT%H:%M:%S"))


def peer_healed(run_dir: Path, survivors: str) -> int:
    """Issue 55: the next attempt resumed from the survivors' memory (rank 0 said so); returns the step."""
    said = "".join(p.read_text(errors="replace") for p in sorted(run_dir.glob("*.out")))
    found = re.findall(r"clusterddp: peer heal: resuming at step (\d+) from the memory of the ranks that survived on "
                       + survivors + r" \(digests agree\); nothing read from the checkpoint directory", said)
    assert len(found) == 1 and "peer heal not used" not in said, said[-3000:]
    assert int(found[0]) >= EVERY + 3, found  # the last step rank 0 logged before the kill, or a later one
    return int(found[0])


def healed_either_way(work: Path, ref_pt: Path, run_dir: Path, survivors: str) -> None:
    """Bit-identical from the survivors' memory (at most the step in flight redone), or, where a survivor could not
    keep its state (slurmstepd's SIGKILL after this cluster's KillWait of 5 s can come first on a loaded machine:
    CI #9 met it), from the checkpoint with the reason said. The spare test above holds peer heal to its promise."""
    said = "".join(p.read_text(errors="replace") for p in sorted(run_dir.glob("*.out")))
    if "clusterddp: peer heal: resuming at step" in said:
        same_as_reference(work, ref_pt, peer=True)
        peer_healed(run_dir, survivors)
    else:
        assert "clusterddp: peer heal not used: " in said, said[-3000:]
        same_as_reference(work, ref_pt)


def same_as_reference(work: Path, ref_pt: Path, peer: bool = False) -> None:
    """Final parameters bit for bit (``ref_pt``: the uninterrupted run's, test_requeue's fixture); every step
    every rank ran (redone ones too) with the reference's loss. ``peer``: resumed from the survivors' memory
    (issue 55): at most the step in flight redone, else from the last checkpoint: at most its interval."""
    assert identical(work / "run.pt", ref_pt)
    ref, got = rank_steps(ref_pt.parent / "ref.log"), rank_steps(work / "run.log")
    for rank in range(RANKS):
        expected = dict(ref[rank])
        assert len(expected) == TOTAL_STEPS
        assert all(expected[step] == loss for step, loss in got[rank]), rank
        assert {step for step, _ in got[rank]} == set(expected), rank
        redone = len(got[rank]) - TOTAL_STEPS
        if peer:  # (the step in flight is logged only once done: it may or may not show)
            assert redone <= 1, (rank, redone)
        else:
            assert 0 < redone <= EVERY, (rank, redone)  # at most one checkpoint interval
        kept = work / f"run.pt.rank{rank}.json"  # (--per-rank: each rank's loss sum, resumed with it)
        if kept.exists():
            total = 0.0
            for step in sorted(expected, key=int):  # the uninterrupted run's sum, in its order: bit for bit
                total += float.fromhex(expected[step])
            assert json.loads(kept.read_text()) == {"loss_sum": total, "steps": TOTAL_STEPS}, rank


@pytest.mark.parametrize("launcher", ["srun", pytest.param("torchrun", marks=ONCE)])
def test_a_killed_node_is_replaced_by_a_spare_and_the_run_is_bit_identical(work, reference, launcher):
    job = subprocess.Popen(
        [sys.executable, "-m", "clusterddp", "submit", "--launcher", launcher, "--nodes", "2", "--spare-nodes", "1",
         "--gpus", "2", "--time", "10", "--wait", *job_args(work, "run", 0.3), "--ckpt-every", str(EVERY)],
        cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kill_node2_after(work / "run.log", EVERY + 3, spoil=work / "run-ck")
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, err
    job_id = out.split()[0]
    assert f"job {job_id} ended COMPLETED, exit code 0" in err
    run_dir = work / "clusterddp-runs" / f"resumable-{job_id}"
    healed = peer_healed(run_dir, "node1")  # (first: its failure shows the reason said)
    same_as_reference(work, reference, peer=True)
    first, second = attempts.read(run_dir)
    # Issue 53: every rank of node2 killed, nothing from Slurm: a suspect, moved to the spare, never quarantined
    assert first.nodes == ("node1", "node2") and first.fault == "suspect" and first.fault_nodes == ("node2",)
    assert first.next == "retry" and second.nodes == ("node1", "node3") and second.exit == 0
    assert second.restart == 0  # the same allocation: the job never left the queue
    # what decided it, cited (issue 39): srun's own line for srun; torchrun's root cause block for torchrun
    if launcher == "srun":
        # (both at once, or one: slurmstepd can report the second death in a later pass even with the kill at
        # once, and srun's line for the first is the evidence then)
        said = r'srun-0\.0\.err: "srun: error: node2: (tasks 2-3|task [23]): Killed"'
        assert re.fullmatch(said, first.evidence), first
    else:
        assert re.fullmatch(r'node-1\.out: "torchrun\'s root cause: rank [23] on node2, '
                            r'exitcode -9 \(pid: \d+\) +\(SIGKILL\)"', first.evidence), first
    assert f"; evidence: {first.evidence}" in err, err
    # --wait said so as it happened, and the node is quarantined
    assert re.search(r"clusterddp: attempt 1 \(restart 0\) on node1,node2, .*: fault: suspect on node2: "
                     r".*; retried here without the node\(s\) at fault", err), err
    assert "clusterddp: quarantined" not in err, err
    assert run_cli("nodes", cwd=work).stdout.startswith("no node is quarantined")
    # as it happened: the retry was told while the job still ran
    assert err.index("clusterddp: attempt 1 (restart 0)") < err.index(f"job {job_id} ended COMPLETED"), err
    assert clusterddp.job_attempts(job_id) == [first, second]  # the Python API reads the same history
    status = run_cli("status", job_id, cwd=work)
    lines = status.stdout.splitlines()
    assert lines[1].split()[:2] == [job_id, "COMPLETED"], status.stdout
    assert lines[2].startswith("attempt 1 (restart 0) on node1,node2") and "fault: suspect on node2" in lines[2]
    assert f"; evidence: {first.evidence}" in lines[2], lines
    assert lines[3].startswith("attempt 2 (restart 0) on node1,node3") and lines[3].endswith(
        f"exit 0; started from the survivors' memory at step {healed} (peer heal: node1; no checkpoint read)"), lines
    # the failed attempt's logs were kept aside; the batch log tells the story
    assert sorted(p.name for p in (run_dir / "attempts" / "0.0").glob("*.out"))[:1] in (["node-0.out"],
                                                                                        ["rank-0.out"])
    batch = (work / "clusterddp-runs" / f"resumable-{job_id}.out").read_text()
    assert ("clusterddp: retrying on node1,node3 without node2 (a suspect, not quarantined; retry 1 of 2), "
            "from the survivors' memory where they kept it (peer heal), else the last checkpoint") in batch
    assert "clusterddp: attempt 2 on node1,node3: MASTER_ADDR=node1 MASTER_PORT=" in batch
    ids = re.findall(r"tracker run id (\S+)", "".join(p.read_text() for p in run_dir.rglob("*.out")))
    assert len(ids) == 2 and len(set(ids)) == 1 and ids[0] != "None", ids  # issue 42: one identity per job
    dry = run_cli("submit", "--dry-run", "--nodes", "1", "resumable.py", cwd=work)
    assert "--exclude" not in dry.stdout, dry.stdout  # nothing quarantined: later jobs may use node2
    # issue 42: the goodput ledger (redone = the steps that ran twice) in --wait and status; top by job id
    ledger = goodput.ledger(run_dir)
    ran = [step for _, step in steps(work / "run.log")]
    assert ledger.redone_steps == len(ran) - len(set(ran)) <= 1 and ledger.steps == len(ran), ledger.as_json()
    # its parts add up to what Slurm allocated (start to end x 3 nodes: the spare and the excluded node held too)
    # within 2%, plus scontrol's clock resolution (whole seconds: up to 1 s x 3 nodes on this half-minute job)
    held = parse_scontrol(subprocess.run(["scontrol", "--oneliner", "show", "job", job_id], capture_output=True,
                                         text=True).stdout)
    alloc = int(held["NumNodes"]) * (_epoch(held["EndTime"]) - _epoch(held["StartTime"]))
    assert held["NumNodes"] == "3" and abs(ledger.total - alloc) <= 0.02 * alloc + 3, (held, ledger.as_json())
    assert ledger.parts["gate"] == 3 * (second.start - first.end), ledger.as_json()
    idle = (first.end - first.start) + (second.end - second.start)  # one node of three unused in each attempt
    assert abs(ledger.parts["idle"] - idle) <= 2 and ledger.parts["productive"] > 0, ledger.as_json()
    assert f"clusterddp: {ledger.line()}" in err and ledger.line() in status.stdout.splitlines(), status.stdout
    shown = run_cli("top", "--once", job_id, cwd=work)
    assert shown.returncode == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines()[2:6]]
    assert sorted((r[0], r[1]) for r in rows) == [("node1", "0"), ("node1", "1"), ("node3", "2"), ("node3", "3")]
    assert shown.stdout.splitlines()[-1].startswith("stragglers: ")


@pytest.mark.parametrize("launcher", ["srun", pytest.param("torchrun", marks=pytest.mark.slurm_releases("26.05"))])
def test_with_warm_start_the_retry_s_ranks_are_forked_from_the_warm_servers_and_the_run_is_bit_identical(
        work, reference, launcher):
    """Issue 55, --warm-start: one server per node imports torch once and forks every rank, the first attempt's
    too; node2's ranks (and their tasks: srun's, or torchrun's workers) are killed, and the retry's ranks on node1
    and the spare node3 are forked by those nodes' servers (no torch import again): the job completes bit-identical,
    from the survivors' memory. (torchrun on 26.05 only: its agents are the srun case's tasks plus an agent.)"""
    job = subprocess.Popen(
        [sys.executable, "-m", "clusterddp", "submit", "--launcher", launcher, "--nodes", "2", "--spare-nodes", "1",
         "--gpus", "2", "--time", "10", "--wait", "--warm-start", *job_args(work, "run", 0.3),
         "--ckpt-every", str(EVERY)], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 150
    while not victims_logged(work / "run.log", EVERY + 3) and time.monotonic() < deadline:
        time.sleep(0.05)
    run_dir = next((work / "clusterddp-runs").glob("resumable-*/"))
    tasks = _rank_pids("node2", "resumable.py")  # (the clients: python [-u] -m clusterddp.runtime.warmrun resumable.py)
    forked = re.findall(r"forked rank process (\d+) \(RANK=[23] ", (run_dir / "warm-node2.out").read_text())
    cold = [line for f in sorted(run_dir.rglob("*.out")) + sorted(run_dir.rglob("*.log"))
            for line in f.read_text(errors="replace").splitlines() if "clusterddp: warm start:" in line]
    assert len(tasks) == 2 and len(forked) == 2, (tasks, forked, cold,  # the first attempt's ranks are forks too
                                                  [(f.name, f.read_text()) for f in run_dir.glob("warm-*.out")])
    assert spoil_checkpoints(work / "run-ck") >= 1
    kill_at_once(tasks + [int(pid) for pid in forked])
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, err
    job_id = out.split()[0]
    assert run_dir == work / "clusterddp-runs" / f"resumable-{job_id}"
    peer_healed(run_dir, "node1")
    same_as_reference(work, reference, peer=True)
    first, second = attempts.read(run_dir)
    assert (first.fault, first.fault_nodes, second.nodes, second.exit) == ("suspect", ("node2",), ("node1", "node3"),
                                                                          0), (first, second)
    assert re.fullmatch(r'srun-0\.0\.err: "srun: error: node2: (tasks 2-3|task [23]): Killed"' if launcher == "srun"
                        else r'node-1\.out: "torchrun\'s root cause: rank [23] on node2, exitcode -9 \(pid: \d+\) +'
                             r'\(SIGKILL\)"', first.evidence), first
    # each rank of the retry is a process its node's server forked (the server's log and the rank's own hello)
    for node, ranks in (("node1", (0, 1)), ("node3", (2, 3))):
        log = (run_dir / f"warm-{node}.out").read_text()
        assert re.search(r"clusterddp: warm server \d+: ready in [0-9.]+ s", log), log
        forked = {int(m.group(2)): int(m.group(1)) for m in re.finditer(
            r"forked rank process (\d+) \(RANK=(\d+) ", log)}
        for rank in ranks:
            hello = json.loads((run_dir / "stacks" / "ranks" / f"rank-{rank}.json").read_text())
            assert forked.get(rank) == hello["pid"], (node, rank, forked, hello)
        # torchrun: the retry's agent on each node is a fork too (no torch import at all in the retry)
        agents = re.findall(r"forked torchrun agent \d+ \(SLURM_PROCID=\d+ SLURM_STEP_ID=(\d+)\) at ", log)
        assert len(agents) == (0 if launcher == "srun" else 2 if node == "node1" else 1), (node, log)
    # the servers' own srun messages stay out of the attempts' evidence (srun-RESTART.ATTEMPT.err)
    errs = sorted(run_dir.rglob("srun-*.err"))
    assert [p.name for p in errs] == ["srun-0.0.err", "srun-0.1.err"], errs
    # (the servers' steps, as their logs name them at the job's end: "*** STEP 7.1 ON node1 CANCELLED AT ...")
    steps = {m for n in ("node1", "node2", "node3")
             for m in re.findall(r"STEP ([0-9]+\.[0-9]+) ON", (run_dir / f"warm-{n}.out").read_text())}
    assert len(steps) == 3 and (run_dir / "warm-srun.err").read_text(), steps  # (their srun wrote there)
    assert not [p for p in errs for step in steps if re.search(rf"\b{re.escape(step)}\b", p.read_text())], errs


def test_without_a_spare_the_job_requeues_itself_without_the_node_at_fault(work, reference, slurm_release):
    """node2's ranks frozen (a wedged node): the hang watchdog's roll call, which node1's ranks answer and node2's
    cannot, is node evidence (issue 53), so the job requeues itself without node2. Where the cluster allows an
    expedited requeue (26.05's test cluster sets enable_expedited_requeue; 22.05 has none), the job asks for it and
    starts again at once, never waiting on Slurm's requeue delay (BeginTime); elsewhere the test skips that delay."""
    expedited = slurm_release == "26.05"
    proc = run_cli("submit", "--launcher", "srun", "--nodes", "2", "--gpus", "2", "--time", "10", "--hang-timeout",
                   "0:20", *job_args(work, "run", 0.3), "--ckpt-every", str(EVERY), cwd=work)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    freeze_node2_after(work / "run.log", EVERY + 3)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        fields = parse_scontrol(subprocess.run(["scontrol", "--oneliner", "show", "job", job_id],
                                                     capture_output=True, text=True).stdout)
        assert fields.get("ExpeditedRequeue", "No") == ("Yes" if expedited else "No"), fields
        if fields.get("JobState") == "PENDING" and fields.get("Reason") == "BeginTime":
            assert not expedited, f"an expedited requeue waited on Slurm's requeue delay: {fields}"
            assert fields.get("ExcNodeList") == "node2" and fields.get("Restarts") == "1", fields
            time.sleep(3)  # Slurm's own requeue delay is 2 min (see test_requeue.interrupt_and_release)
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
            break
        if expedited and fields.get("Restarts") == "1" and fields.get("JobState") == "RUNNING":
            assert fields.get("ExcNodeList") == "node2", fields
            break
        time.sleep(0.3)
    else:
        raise AssertionError("the job did not requeue itself")
    final = slurm.wait(job_id)
    assert final.state == "COMPLETED" and final.node_list == "node[1,3]", final
    # node1's ranks kept their state across Slurm's requeue (peer_healed first: its failure shows the reason said)
    peer_healed(work / "clusterddp-runs" / f"resumable-{job_id}", "node1")
    same_as_reference(work, reference, peer=True)
    first, second = attempts.read(work / "clusterddp-runs" / f"resumable-{job_id}")
    assert (first.restart, first.fault, first.fault_nodes, first.next) == (0, "infrastructure", ("node2",), "requeue")
    assert "rank(s) 2,3 on node2 did not answer the roll call that every other rank answered" in first.why, first
    assert (second.restart, second.nodes, second.exit, second.next) == (1, ("node1", "node3"), 0, "end")
    assert {r for r, _ in steps(work / "run.log")} == {0, 1}
    # Not followed with --wait: status shows the fault and writes nothing (a read); nodes --from-job quarantines
    status = run_cli("status", job_id, cwd=work)
    assert "fault: infrastructure on node2" in status.stdout, status.stdout
    assert (f"clusterddp: node2 at fault in job {job_id} but not quarantined (status only reads): clusterddp nodes "
            f"--from-job {job_id} leaves it out of later submissions") in status.stdout, status.stdout
    assert run_cli("nodes", cwd=work).stdout.startswith("no node is quarantined")
    held = run_cli("nodes", "--from-job", job_id, cwd=work)
    assert held.returncode == 0 and "clusterddp: quarantined node2: later submissions leave it out" in held.stderr
    listed = run_cli("nodes", cwd=work).stdout.splitlines()
    assert listed[1].startswith("node2 ") and f"  {job_id}  " in listed[1], listed
    assert "not quarantined" not in run_cli("status", job_id, cwd=work).stdout


@ONCE
def test_a_hang_in_the_script_s_code_is_retried_once_in_place_and_the_same_hang_again_is_the_program(work):
    """Issue 53: rank 3 stuck in the script's own code (its loader) while the others wait: the commonest DDP hang is
    the program's, so nobody is blamed: one retry in place (the spare left unused), then the same place again ends
    the job, naming the script's line; nothing excluded or quarantined."""
    proc = run_cli("submit", "--launcher", "srun", "--nodes", "2", "--spare-nodes", "1", "--gpus", "2", "--time", "5",
                   "--hang-timeout", "0:20", "--wait", "hang.py", "--", "--where", "loader", "--rank", "3", cwd=work,
                   timeout=400)  # (20 s: a rank starved on a busy machine must not look hung before the real hang)
    assert proc.returncode == 79, proc.stderr
    job_id = proc.stdout.split()[0]
    first, second = attempts.read(work / "clusterddp-runs" / f"hang-{job_id}")
    assert (first.fault, first.fault_nodes, first.next) == ("ambiguous", (), "in-place"), first
    assert first.why.startswith("the hang watchdog ended the job") and "the script's own code" in first.why, first
    assert second.nodes == ("node1", "node2") and second.fault == "program" and second.next == "end", second
    assert second.why == (f"the same hang twice at hang.py:{SLEEP_IN_LOADER} __getitem__: probably the program, "
                          "not a node")
    assert f"the same hang twice at hang.py:{SLEEP_IN_LOADER} __getitem__" in proc.stderr
    assert "clusterddp: quarantined" not in proc.stderr
    assert run_cli("nodes", cwd=work).stdout.startswith("no node is quarantined")


@ONCE
def test_a_requeue_after_a_hang_then_a_python_exception_is_the_program_s_and_blames_no_node(work):
    """Issue 53: restart 0 leaves a roll call (stacks/hang-0/) and a hang's records; after the time-limit requeue,
    restart 1's plain ValueError is decided on restart 1's evidence alone: the program's, no node blamed."""
    log = work / "steps.log"
    job = subprocess.Popen(
        [sys.executable, "-m", "clusterddp", "submit", "--launcher", "srun", "--nodes", "2", "--spare-nodes", "1",
         "--gpus", "2", "--time", "5", "--hang-timeout", "0:20", "--wait", "hang.py", "--", "--where", "loader",
         "--rank", "3", "--once", "--raise-on-restart", "1", "--steps-log", str(log), "--step-s", "0.2"],
        cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not any(attempts.read(d.parent) for d in work.glob("clusterddp-runs/hang-*/attempts.tsv")) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    run_dir = next(work.glob("clusterddp-runs/hang-*/attempts.tsv")).parent
    job_id = run_dir.name.split("-")[-1]
    first = attempts.read(run_dir)[0]  # the hang: one retry in place
    assert (first.fault, first.next) == ("ambiguous", "in-place"), first
    begun = len(steps(log))
    assert interrupt_and_release(job_id, log, begun + 5), "a time-limit requeue on 22.05 waits BeginTime"
    out, err = job.communicate(timeout=300)
    assert job.returncode != 0, out + err
    rows = attempts.read(run_dir)
    assert [(r.restart, r.attempt) for r in rows] == [(0, 0), (0, 1), (1, 0)], rows
    last = rows[-1]
    assert (last.fault, last.fault_nodes, last.next) == ("program", (), "end"), last
    assert last.why.startswith("rank 3: ValueError: a bug met only after the requeue"), last
    assert last.evidence.startswith('stacks/ranks/exception-3.json: "ValueError'), last  # this attempt's record
    # restart 0's roll call is kept beside its attempt, where no later verdict reads it
    assert list(run_dir.glob("attempts/0.0/stacks/hang-0/*")), sorted(run_dir.rglob("*"))
    assert "clusterddp: quarantined" not in err and "node at fault" not in err, err
    assert run_cli("nodes", cwd=work).stdout.startswith("no node is quarantined")
    assert "(none excluded or quarantined)" in run_cli("status", job_id, cwd=work).stdout


@ONCE
def test_a_node_that_fails_the_health_hook_gets_no_rank_and_a_spare_is_used(work, reference):
    """node1, the allocation's first host (MASTER_ADDR), fails the gate before the first attempt: the rendezvous moves
    to node2, the step's first node, where torchrun's static rendezvous puts node rank 0 and its store (it stayed on
    node1, and every agent waited for a store that no one held)."""
    proc = run_cli("submit", "--launcher", "torchrun", "--nodes", "2", "--spare-nodes", "1", "--gpus", "2", "--time",
                   "5", "--health-check", 'test "$(hostname)" != node1 || { echo "node1: ECC errors"; exit 3; }',
                   "--wait", *job_args(work, "run", 0), cwd=work, timeout=300)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.split()[0]
    (only,) = attempts.read(work / "clusterddp-runs" / f"resumable-{job_id}")
    assert only.nodes == ("node2", "node3") and only.exit == 0, only
    batch = (work / "clusterddp-runs" / f"resumable-{job_id}.out").read_text()
    assert "clusterddp: health gate: node1 gets no rank: node1: ECC errors --health-check exited with 3" in batch
    assert "health gate: node2" not in batch and "health gate: node3" not in batch
    assert re.search(r"clusterddp: attempt 1 on node2,node3: MASTER_ADDR=node2 MASTER_PORT=\d+", batch), batch
    assert identical(work / "run.pt", reference)


NEWEST = pytest.mark.slurm_releases("26.05")


def _no_quarantine(err: str, work: Path) -> None:
    assert "clusterddp: quarantined" not in err, err
    assert run_cli("nodes", cwd=work).stdout.startswith("no node is quarantined")


@NEWEST
def test_with_no_node_to_spare_a_suspect_node_is_retried_in_place_never_requeued(work, reference):
    """Issues 39 and 53: partition `pair` has node1 and node2 only. Both ranks of node2 killed, nothing from Slurm:
    node2 is a suspect, and with no spare the job runs again in place (never a requeue, which would wait forever
    without node2: the stranding check itself is tests/test_supervise.py's), bit-identical; nothing quarantined."""
    job = subprocess.Popen(
        [sys.executable, "-m", "clusterddp", "submit", "--launcher", "srun", "--partition", "pair", "--nodes", "2",
         "--gpus", "2", "--time", "10", "--wait", *job_args(work, "run", 0.3), "--ckpt-every", str(EVERY)],
        cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kill_node2_after(work / "run.log", EVERY + 3)
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, err
    job_id = out.split()[0]
    healed_either_way(work, reference, work / "clusterddp-runs" / f"resumable-{job_id}", "node1")
    first, second = attempts.read(work / "clusterddp-runs" / f"resumable-{job_id}")
    assert (first.fault, first.fault_nodes, first.next) == ("suspect", ("node2",), "in-place"), first
    assert (second.restart, second.nodes, second.exit, second.next) == (0, ("node1", "node2"), 0, "end"), second
    batch = (work / "clusterddp-runs" / f"resumable-{job_id}.out").read_text()
    assert ("clusterddp: retrying in place on node1,node2: no spare to leave node2 out (a suspect, not quarantined; "
            "retry 1 of 2), from the survivors' memory where they kept it (peer heal), else the last checkpoint") \
        in batch, batch
    assert "retried in place on the same nodes (none excluded or quarantined)" in err, err
    _no_quarantine(err, work)


@NEWEST
def test_one_rank_killed_with_nothing_said_is_retried_once_in_place(work, reference):
    """Issue 39's ambiguous tier: one of node2's two ranks killed (an OOM killer, a stray kill: not the node gone)
    is retried once on the same nodes, though a spare is there; no node excluded or quarantined."""
    job = subprocess.Popen(
        [sys.executable, "-m", "clusterddp", "submit", "--launcher", "srun", "--nodes", "2", "--spare-nodes", "1",
         "--gpus", "2", "--time", "10", "--wait", *job_args(work, "run", 0.3), "--ckpt-every", str(EVERY)],
        cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 150
    while not victims_logged(work / "run.log", EVERY + 3) and time.monotonic() < deadline:
        time.sleep(0.05)
    victims = sorted(_rank_pids("node2", "resumable.py"))
    assert len(victims) == 2, victims
    os.kill(victims[-1], signal.SIGKILL)
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, err
    job_id = out.split()[0]
    # ranks 0-2 survived: rank 3's random states are rank 1's
    healed_either_way(work, reference, work / "clusterddp-runs" / f"resumable-{job_id}", "node1,node2")
    first, second = attempts.read(work / "clusterddp-runs" / f"resumable-{job_id}")
    assert (first.fault, first.fault_nodes, first.next) == ("ambiguous", ("node2",), "in-place"), first
    assert "1 of the node's 2 ranks, nothing else said" in first.why, first
    assert second.nodes == ("node1", "node2") and second.exit == 0, second
    assert "clusterddp: retrying once in place on node1,node2 (retry 1 of 2; no node excluded, none quarantined)" in (
        (work / "clusterddp-runs" / f"resumable-{job_id}.out").read_text())
    _no_quarantine(err, work)


@NEWEST
def test_a_node_that_dies_whole_is_left_out_by_slurm_s_own_requeue_and_quarantined(work, reference, slurm_release):
    """Issue 53's acceptance: node2 dies whole (its slurmd and every process on it). Slurm notices (SlurmdTimeout),
    says so in srun's messages ("Node failure on node2"), ends the attempt and requeues the job itself, without
    node2: the supervisor records Slurm's word as node2's fault, the job completes on node1,node3 bit-identical, and
    node2 is quarantined on request. (26.05: Slurm's own requeue after a node failure is expedited there.)"""
    release = {**os.environ, "CLUSTERDDP_SLURM_RELEASE": slurm_release}
    proc = run_cli("submit", "--launcher", "srun", "--nodes", "2", "--gpus", "2", "--time", "10",
                   *job_args(work, "run", 0.3), "--ckpt-every", str(EVERY), cwd=work)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    try:
        deadline = time.monotonic() + 150
        while not victims_logged(work / "run.log", EVERY + 3) and time.monotonic() < deadline:
            time.sleep(0.05)
        subprocess.run([str(CLUSTER_SH), "kill-node", "node2"], check=True, env=release, capture_output=True)
        final = slurm.wait(job_id)
    finally:
        subprocess.run([str(CLUSTER_SH), "revive-node", "node2"], check=True, env=release, capture_output=True)
    assert final.state == "COMPLETED" and final.node_list == "node[1,3]", final
    # node1's ranks kept their state across Slurm's requeue (peer_healed first: its failure shows the reason said)
    peer_healed(work / "clusterddp-runs" / f"resumable-{job_id}", "node1")
    same_as_reference(work, reference, peer=True)
    first, second = attempts.read(work / "clusterddp-runs" / f"resumable-{job_id}")
    assert (first.restart, first.fault, first.fault_nodes, first.next) == (0, "infrastructure", ("node2",), "requeue")
    # Slurm's word: in srun's messages, or (srun ended by the batch script before Slurm's word reached it) in
    # Slurm's state of the attempt's nodes once srun was gone (CI, 26.05: the record was a plain SIGTERM before)
    assert first.why == "Slurm reported a node failure" and first.evidence in (
        'srun-0.0.err: "srun: error: Node failure on node2"', 'health/sinfo.txt: "node2 down*"'), first
    assert (second.restart, second.nodes, second.exit) == (1, ("node1", "node3"), 0), second
    batch = (work / "clusterddp-runs" / f"resumable-{job_id}.out").read_text()
    # said by the killed attempt's batch script when it had the time (KillWait), else at the requeued one's start;
    # or, where the survivors ended before Slurm's SIGTERM (they end at once at a lost peer: runtime/excrecord.py),
    # the attempt's own verdict from Slurm's word, and the script's requeue without the node
    assert ("clusterddp: Slurm ended this attempt for the failure of node2; it requeues the job itself" in batch or
            "clusterddp: restart 0 was ended by Slurm for the failure of node2, which it requeued itself" in batch or
            ('clusterddp: attempt 1 failed: fault: infrastructure on node2: Slurm reported a node failure' in batch
             and f"clusterddp: requeueing job {job_id} without node2" in batch)), batch
    held = run_cli("nodes", "--from-job", job_id, cwd=work)
    assert held.returncode == 0 and "clusterddp: quarantined node2: later submissions leave it out" in held.stderr
