"""Issue 25, point 7: the retry loop on one machine (`submit --local`), with emulated nodes: the ranks of emulated
node 1 SIGKILLed mid-run, the job runs again from its last checkpoint on node 0 and the spare node 2, bit-identical
to an uninterrupted run, step for step; without a spare, in place (issue 53: every rank of a node killed with nothing
from Slurm makes the node a suspect, never quarantined). 4 ranks on 2 emulated nodes, srun and torchrun emulation."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterddp.healing import attempts
from clusterddp.observe import goodput

from .conftest import SCRIPTS, run_cli
from .procs import children
from .test_requeue import LOCAL_SHAPE, job_args, spoil_checkpoints, steps  # noqa: F401
from .test_self_healing import EVERY, same_as_reference, victims_logged

pytestmark = pytest.mark.ranks


def _environ(pid: int) -> dict:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def node1_ranks(cli: int, launcher: str) -> list:
    """The processes of ranks 2 and 3 (emulated node 1): the srun emulation's ranks are the runner's children;
    torchrun's are its agents' children, and the agent of node 1 was started second."""
    tree = children()
    if launcher == "srun":
        return [p for p in tree.get(cli, []) if _environ(p).get("RANK") in ("2", "3")]
    agents = sorted(tree.get(cli, []))
    return tree.get(agents[1], []) if len(agents) == 2 else []


def run_and_kill(work: Path, launcher: str, *extra: str, spoil: bool = False, script: tuple = (),
                 late_agent: bool = False) -> tuple:
    """``late_agent`` (torchrun): the killed workers' agent is stopped (SIGSTOP) before the kill and let go only once
    the survivors' agent has ended and 1.5 s more, as a loaded machine can order them (seen in CI): the survivors'
    report comes first, its root cause an exit 1 of a lost peer, the kill's a second or more later."""
    cli = subprocess.Popen([sys.executable, "-m", "clusterddp", "submit", "--local", "--launcher", launcher,
                            *LOCAL_SHAPE, *extra, *job_args(work, "run", 0.3), "--ckpt-every", str(EVERY), *script],
                           cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not victims_logged(work / "run.log", EVERY + 3) and time.monotonic() < deadline:
        time.sleep(0.05)
    victims = node1_ranks(cli.pid, launcher)
    assert len(victims) == 2, victims
    if spoil:  # issue 55: a peer heal reads nothing from the checkpoint directory
        assert spoil_checkpoints(work / "run-ck") >= 1
    agents = sorted(children().get(cli.pid, [])) if late_agent else []
    if late_agent:
        assert len(agents) == 2, agents
        os.kill(agents[1], signal.SIGSTOP)
    try:
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while agents and agents[0] in children().get(cli.pid, []) and time.monotonic() < deadline:
            time.sleep(0.05)  # (the survivors' agent ends, its workers' errors a lost peer's)
        if agents:  # (then 1.5 s: the late agent's root cause is in a later second than the survivors')
            time.sleep(1.5)
    finally:
        if late_agent:
            os.kill(agents[1], signal.SIGCONT)
    out, err = cli.communicate(timeout=180)
    run_dir = next((work / "clusterddp-runs").glob("resumable-local-*"))
    return cli.returncode, out, err, run_dir


def test_a_spawn_job_s_lost_node_resumes_from_the_survivors_memory(tmp_path, reference):
    """Issue 55 under the spawn launcher (one process a node starts the node's ranks: runtime.spawn): node 1 lost
    whole, its process and its ranks SIGKILLed, the checkpoints spoilt first. Before, nothing was kept: torch's
    spawn wrapper caught the survivors' exception (sys.excepthook never ran), and the local runner's SIGTERM killed
    node 0's process at once, its ranks with it (torch's parent-death SIGINT). Now the ranks' exceptions are the
    runtime's records and a node's process waits for its ranks: the retry resumes from node 0's memory."""
    shutil.copy(SCRIPTS / "resumable.py", tmp_path)
    cli = subprocess.Popen([sys.executable, "-m", "clusterddp", "submit", "--local", "--launcher", "spawn",
                            *LOCAL_SHAPE, "--spare-nodes", "1", *job_args(tmp_path, "run", 0.3), "--ckpt-every",
                            str(EVERY)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not victims_logged(tmp_path / "run.log", EVERY + 3) and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = children()
    node1 = [p for p in tree.get(cli.pid, []) if _environ(p).get("SLURM_NODEID") == "1"]
    assert len(node1) == 1, tree
    victims = [*node1, *tree.get(node1[0], [])]  # (its ranks, and multiprocessing's resource tracker)
    assert len(victims) >= 3, victims
    assert spoil_checkpoints(tmp_path / "run-ck") >= 1
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    out, err = cli.communicate(timeout=180)
    assert cli.returncode == 0, err
    same_as_reference(tmp_path, reference, peer=True)
    # (the local runner saw node 1's process, one of the node's processes, end by SIGKILL: ambiguous, in place)
    assert "retrying once in place on local0,local1" in err, err
    resumed = re.search(r"clusterddp: peer heal: resuming at step (\d+) from the memory of the ranks that survived on "
                        r"local0 \(digests agree\); nothing read from the checkpoint directory", out)
    assert resumed and f"RESUME from step {resumed.group(1)}" in out, out + err
    kept = re.findall(r"clusterddp: peer heal: rank (\d) kept the state of step (\d+)", out)
    assert sorted(r for r, _ in kept) == ["0", "1"], kept


@pytest.mark.usefixtures("warm_start")  # (issue 79: not a test of the cold start)
def test_survivors_that_disagree_fall_back_to_the_checkpoint_and_the_run_stays_bit_identical(tmp_path, reference):
    """Issue 55, item 3, with a real fault: rank 0 (a survivor, the one whose state would seed every rank) flips one
    bit of one parameter (silent data corruption), then node 1 is lost. The survivors' digests disagree, so the
    retry falls back to the checkpoint (written before the flip), saying why, and the job ends bit-identical to the
    uninterrupted run (with the digests' check left out, it resumes from the corrupted model and differs)."""
    shutil.copy(SCRIPTS / "resumable.py", tmp_path)
    flip = tmp_path / "flip"
    cli = subprocess.Popen([sys.executable, "-m", "clusterddp", "submit", "--local", "--launcher", "srun",
                            *LOCAL_SHAPE, "--spare-nodes", "1", *job_args(tmp_path, "run", 0.3), "--ckpt-every",
                            str(EVERY), "--flip-bit-when", str(flip)],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not victims_logged(tmp_path / "run.log", EVERY + 3) and time.monotonic() < deadline:
        time.sleep(0.05)
    flip.touch()
    while not Path(f"{flip}.done").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    victims = node1_ranks(cli.pid, "srun")
    assert len(victims) == 2, victims
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    out, err = cli.communicate(timeout=180)
    assert cli.returncode == 0, err
    said = re.search(r"clusterddp: peer heal not used: the survivors disagree: step (\d+) \(digest \w+\) on old "
                     r"rank\(s\) ([01]); step \1 \(digest \w+\) on old rank\(s\) ([01]); resuming from the last "
                     r"checkpoint", out)
    assert said and {said.group(2), said.group(3)} == {"0", "1"}, out
    assert len(re.findall(r"peer heal: rank \d kept the state of step", out)) == 2, out
    resumed = int(re.search(r"RESUME from step (\d+)", out).group(1))
    assert resumed % EVERY == 0 and resumed < int(said.group(1)), out
    same_as_reference(tmp_path, reference)


@pytest.mark.parametrize("launcher,peer", [("srun", True), ("torchrun", True), ("srun", False)])
def test_a_killed_emulated_node_is_replaced_by_a_spare(tmp_path, reference, launcher, peer, request):
    """Issue 55: by default the survivors' memory seeds the next attempt (the checkpoints spoilt before the kill:
    nothing of them is read), at most the step in flight redone; with --no-peer-heal, the last checkpoint. Each rank
    keeps its own loss sum in a per_rank= dict (the README example's running loss): resumed from either, each rank's
    sum is the uninterrupted run's, bit for bit, and peer heal stays on. Under torchrun the killed workers' agent
    reports after the survivors' (run_and_kill's late_agent): their exit 1 is a lost peer's, the kill still the cause.
    (CI saw that order once: the drill's kill-node0 ended with exit 1, the node never retried.) Under srun the
    ranks are forked by warm servers (issue 79); torchrun's case stops an agent, so its agents are the runner's."""
    if launcher == "srun":
        request.getfixturevalue("warm_start")
    shutil.copy(SCRIPTS / "resumable.py", tmp_path)
    code, out, err, run_dir = run_and_kill(tmp_path, launcher, "--spare-nodes", "1",
                                           *([] if peer else ["--no-peer-heal"]), spoil=peer, script=("--per-rank",),
                                           late_agent=launcher == "torchrun")
    assert code == 0, err
    same_as_reference(tmp_path, reference, peer=peer)
    assert sorted(p.name for p in tmp_path.glob("run.pt.rank*.json")) == [f"run.pt.rank{r}.json" for r in range(4)]
    assert "peer heal is off" not in out, out
    first, second = attempts.read(run_dir)
    assert first.nodes == ("local0", "local1") and first.fault_nodes == ("local1",) and first.next == "retry"
    assert first.fault == "suspect" and attempts.at_fault([first, second]) == []  # never quarantined
    assert second.nodes == ("local0", "local2") and second.exit == 0 and second.next == "end"
    assert ("clusterddp: retrying on local0,local2 without local1 (a suspect, not quarantined; retry 1 of 2), "
            "from the survivors' memory where they kept it (peer heal), else the last checkpoint") in err, err
    cited = (r"the local runner's wait: rank [23] on local1 ended by SIGKILL, 2 of the node's processes by a signal"
             if launcher == "srun" else r'node-1\.out: "torchrun\'s root cause: rank [23], exitcode -9"')
    assert re.fullmatch(cited, first.evidence) and f"; evidence: {first.evidence}" in err, (first, err)
    if peer:
        resumed = re.search(r"clusterddp: peer heal: resuming at step (\d+) from the memory of the ranks that "
                            r"survived on local0 \(digests agree\); nothing read from the checkpoint directory", out)
        assert resumed and int(resumed.group(1)) >= EVERY + 3, out  # the last step done before the kill, or later
        assert f"RESUME from step {resumed.group(1)}" in out and "peer heal not used" not in out, out
        kept = re.findall(r"clusterddp: peer heal: rank (\d) kept the state of step (\d+)", out)
        assert sorted(r for r, _ in kept) == ["0", "1"] and {int(s) for _, s in kept} == {int(resumed.group(1))}, kept
    else:
        resumed = None
        assert f"RESUME from step {EVERY}" in out and "peer heal" not in out, out
    assert (run_dir / "attempts" / "0.0").is_dir()
    # issue 55: status (and report) say where each retry started
    second_line = [ln for ln in run_cli("status", str(run_dir), cwd=tmp_path).stdout.splitlines()
                   if ln.startswith("attempt 2 (restart 0)")]
    assert second_line and second_line[0].endswith(
        f"; started from the survivors' memory at step {resumed.group(1)} (peer heal: local0; no checkpoint read)"
        if peer else f"; started from the checkpoint of step {EVERY}"), second_line
    ids = re.findall(r"tracker run id (\S+)", "".join(p.read_text() for p in run_dir.rglob("*.out")))
    assert len(ids) == 2 and len(set(ids)) == 1 and ids[0] != "None", ids  # issue 42: one identity per job
    # issue 42: the ledger's redone steps are the steps that ran twice; its parts add up to the attempts' spans
    ledger = goodput.ledger(run_dir)
    ran = [step for _, step in steps(tmp_path / "run.log")]
    # (and the step in flight: begun by the survivors, never logged, where the kill came after a should_stop())
    assert ledger.redone_steps - (len(ran) - len(set(ran))) in (0, 1), (ledger.as_json(), ran)
    assert ledger.redone_steps >= (0 if peer else 1) and (ledger.redone_steps <= 1 or not peer)
    assert ledger.steps - len(ran) == ledger.redone_steps - (len(ran) - len(set(ran)))
    (held,) = attempts.allocations(run_dir)  # the emulated allocation: 3 nodes (a spare), the whole local run
    assert held.nodes == ("local0", "local1", "local2") and held.start <= first.start + 1 and held.end >= second.end
    alloc = 3 * (held.end - held.start)
    assert abs(ledger.total - alloc) <= 0.02 * alloc and ledger.parts["gate"] == 3 * (second.start - first.end), \
        ledger.as_json()
    idle = (first.end - first.start) + (second.end - second.start)  # one emulated node of three unused in each
    assert abs(ledger.parts["idle"] - idle) <= 2, ledger.as_json()
    # (the failed attempt's time after its last step is under the attempts' whole-second clock: maybe 0)
    assert ledger.parts["failed"] >= 0 and ledger.parts["productive"] > 0
    assert f"clusterddp: {ledger.line()}" in err
    assert (f"({ledger.redone_steps} of {ledger.steps} steps redone)" in err) == (ledger.redone_steps > 0), err
    shown = run_cli("top", "--once", str(run_dir), cwd=tmp_path).stdout.splitlines()
    assert sorted((r.split()[0], r.split()[1]) for r in shown[2:6]) == [("local0", "0"), ("local0", "1"),
                                                                      ("local2", "2"), ("local2", "3")], shown


@pytest.mark.usefixtures("warm_start")  # (issue 79: not a test of the cold start)
def test_without_a_spare_a_killed_emulated_node_is_retried_in_place(tmp_path, reference):
    shutil.copy(SCRIPTS / "resumable.py", tmp_path)
    code, out, err, run_dir = run_and_kill(tmp_path, "srun", spoil=True)
    assert code == 0, err
    same_as_reference(tmp_path, reference, peer=True)  # issue 55: node0's ranks seed node1's new ones
    assert "clusterddp: peer heal: resuming at step" in out, out
    first, second = attempts.read(run_dir)
    assert (first.fault, first.fault_nodes, first.next) == ("suspect", ("local1",), "in-place"), first
    assert second.nodes == ("local0", "local1") and second.exit == 0, second
    assert "clusterddp: retrying in place on local0,local1: no spare to leave local1 out" in err, err


@pytest.mark.usefixtures("warm_start")  # (issue 79: not a test of the cold start)
def test_a_native_abort_after_the_work_is_the_program_and_never_moves_the_job(tmp_path):
    """Issue 39's first case, on emulated nodes with a spare: a rank that ends in std::terminate (libstdc++'s line,
    then SIGABRT) is the program's fault: not retried on the spare, no node blamed, one attempt."""
    proc = run_cli("submit", "--local", "--launcher", "srun", *LOCAL_SHAPE, "--spare-nodes", "1",
                   str(SCRIPTS / "native_abort.py"), "--", "--rank", "3", cwd=tmp_path, timeout=120)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "fault: program: rank-3.out: terminate called without an active exception" in proc.stderr, proc.stderr
    assert "retrying" not in proc.stderr and "quarantined" not in proc.stderr, proc.stderr
    run_dir = next((tmp_path / "clusterddp-runs").glob("native_abort-local-*"))
    (only,) = attempts.read(run_dir)
    assert (only.fault, only.fault_nodes, only.next) == ("program", (), "end"), only
