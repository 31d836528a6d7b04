"""Issue 55: peer heal. The decision (resume from the survivors' memory, or fall back to the checkpoint and say why)
checked against a simulator of what a lost-node fault leaves on the survivors, built from the documented protocol
(docs/node-failure.md: each rank's random states are held by its own node and the next one in rank order), not from
the code's own output; then real runs on emulated nodes: two neighbouring nodes lost, and a script whose saves keep
more than a peer state can, both fall back to the checkpoint bit-identical and say why."""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterddp.runtime import peerheal, peerload, peerpaths

from .conftest import SCRIPTS, reference_run, run_cli
from .procs import children
from .test_local_healing import _environ
from .test_requeue import identical, job_args, rank_steps, steps, total_steps


def simulate(nodes: int, per_node: int, lost: set, step: int = 9, *, behind: int = -1, buffers: bool = False):
    """What the next attempt's ranks read after the nodes in ``lost`` died during step ``step + 1``: one entry per
    new rank (the survivors' nodes first, then the replacements', ``per_node`` each); a survivor's entry holds its
    own random states and those of the rank of its local rank on the node before it. ``behind``: that old rank
    finished one step fewer (its state differs). Returns (entries, each old rank's true random states)."""
    world = nodes * per_node
    truth = {r: {"torch": f"rank {r} after step {step}"} for r in range(world)}
    entries = []
    for node in [n for n in range(nodes) if n not in lost] + sorted(lost):
        for local in range(per_node):
            old = node * per_node + local
            if node in lost:
                entries.append(None)
                continue
            before = ((node - 1) % nodes) * per_node + local
            at = step - (old == behind)
            entries.append({"rank": old, "world_size": world, "step": at, "parameters_digest": f"p{at}",
                            "digest": f"d{at}-{old}", "node": f"node{node}", "buffers": buffers,
                            "rng": {str(old): truth[old], str(before): truth[before]}})
    return entries, truth


@pytest.mark.parametrize("nodes,per_node", [(2, 1), (2, 2), (3, 2), (4, 2), (4, 1), (5, 3)])
def test_the_decision_matches_what_the_fault_left(nodes, per_node):
    """Every set of lost nodes short of all: resumed exactly where every lost node's successor survived (each rank
    then gets its own true random states, at the step every survivor finished), else a fall-back naming the ranks."""
    for count in range(1, nodes):
        for lost in map(set, itertools.combinations(range(nodes), count)):
            entries, truth = simulate(nodes, per_node, lost)
            verdict = peerload.decide(entries, nodes * per_node, newest_checkpoint=8)
            held = all((n + 1) % nodes not in lost for n in lost)
            if held:
                assert isinstance(verdict, peerload.Use) and verdict.step == 9, (lost, verdict)
                assert peerload.random_states(entries) == truth, lost
                assert entries[verdict.source]["rank"] == min(e["rank"] for e in entries if e)
                assert verdict.nodes == sorted(f"node{n}" for n in range(nodes) if n not in lost)
            else:
                missing = sorted({r for n in lost if (n + 1) % nodes in lost
                                  for r in range(n * per_node, (n + 1) * per_node)})
                assert isinstance(verdict, str) and verdict.startswith(
                    f"no survivor holds the random states of rank(s) {','.join(map(str, missing))} "), (lost, verdict)


def test_every_doubt_falls_back_and_says_why():
    entries, _ = simulate(3, 2, {1})
    assert peerload.decide([None] * 6, 6, 4) is None  # nothing kept (a fresh start): nothing to say
    assert peerload.decide(entries, 6, 4).step == 9
    behind, _ = simulate(3, 2, {1}, behind=4)  # old rank 4 finished step 8 only: the survivors disagree
    assert peerload.decide(behind, 6, 4) == ("the survivors disagree: step 8 (digest p8) on old rank(s) 4; "
                                             "step 9 (digest p9) on old rank(s) 0,1,5")
    assert peerload.decide(entries, 8, 4) == "the survivors' states were written by 6 ranks, this attempt has 8"
    assert peerload.decide(entries, 6, 12) == "the survivors' state (step 9) is older than the checkpoint of step 12"
    assert isinstance(peerload.decide(entries, 6, 9), peerload.Use)  # the checkpoint of that very step: either will do
    twice = [entries[0], dict(entries[1], rank=0)] + entries[2:]
    assert peerload.decide(twice, 6, 4) == "two survivors' states claim the same rank"
    lost_zero, _ = simulate(3, 2, {0}, buffers=True)
    assert peerload.decide(lost_zero, 6, 4).startswith("rank 0's buffers (BatchNorm statistics")
    kept_zero, _ = simulate(3, 2, {2}, buffers=True)
    assert isinstance(peerload.decide(kept_zero, 6, 4), peerload.Use)


def test_a_state_s_digest_covers_every_tensor_byte_and_key():
    import torch

    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "optimizer": {"state": {0: {"m": torch.zeros(3)}}},
             "step": 4, "loader": {"epoch": 1, "batches_done": 3}}
    same = {"loader": {"batches_done": 3, "epoch": 1}, "step": 4, "optimizer": {"state": {0: {"m": torch.zeros(3)}}},
            "model": {"w": torch.arange(6.0).reshape(2, 3).clone()}}
    assert peerheal.digest(state) == peerheal.digest(same)
    flipped = {**same, "model": {"w": torch.arange(6.0).reshape(2, 3)}}
    flipped["model"]["w"][1, 2] = torch.nextafter(torch.tensor(5.0), torch.tensor(6.0))
    assert peerheal.digest(flipped) != peerheal.digest(state)  # one bit of one number
    assert peerheal.digest({**state, "step": 5}) != peerheal.digest(state)
    assert peerheal.digest({**state, "model": {"w": torch.arange(6.0).reshape(3, 2)}}) != peerheal.digest(state)


def test_the_state_directory_is_private_and_never_one_planted(tmp_path, monkeypatch, capsys):
    """... and where it is not used, the rank's log says why once (peer heal and warm starts would go without it,
    silently: a case found by a practitioner's reading)."""
    monkeypatch.setenv("CLUSTERDDP_PEER_DIR", str(tmp_path))
    monkeypatch.setattr(peerpaths, "_SAID", set())
    mine = peerpaths.root()
    assert mine == str(tmp_path / f"clusterddp-{os.getuid()}") and os.stat(mine).st_mode & 0o777 == 0o700
    os.chmod(mine, 0o755)  # readable by others (made so by someone, or an umask): not used
    assert peerpaths.root() is None and peerpaths.root() is None
    said = capsys.readouterr().err
    assert said.count(f"clusterddp: {mine} is not used") == 1 and "(mode 0755); remove it" in said, said
    os.rmdir(mine)
    os.symlink(tmp_path / "elsewhere", mine)  # a link planted under the expected name
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    monkeypatch.setattr(peerpaths, "_SAID", set())
    assert peerpaths.root() is None
    assert "(not a directory)" in capsys.readouterr().err
    assert not peerpaths.enabled({"CLUSTERDDP_PEER_HEAL": "0"}) and peerpaths.enabled({})
    assert peerpaths.node_name({"SLURMD_NODENAME": "../node2"}) == ".._node2"


# --- real runs on emulated nodes --------------------------------------------------------------------------------

def _run_and_kill(work: Path, shape: list, kill_ranks: set, *args: str) -> tuple:
    cli = subprocess.Popen([sys.executable, "-m", "clusterddp", "submit", "--local", "--launcher", "srun", *shape,
                            *job_args(work, "run", 0.3), "--ckpt-every", "4", *args],
                           cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(steps(work / "run.log")) < 7 and time.monotonic() < deadline:
        time.sleep(0.1)
    victims = [p for p in children().get(cli.pid, []) if _environ(p).get("RANK") in {str(r) for r in kill_ranks}]
    assert len(victims) == len(kill_ranks), victims
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    out, err = cli.communicate(timeout=180)
    return cli.returncode, out, err


def _same_as(work: Path, reference: Path, ranks: int, resumed_at: int) -> None:
    assert identical(work / "run.pt", reference)
    got, ref = rank_steps(work / "run.log", ranks), rank_steps(reference.parent / "ref.log", ranks)
    for rank in range(ranks):
        assert sorted(set(got[rank])) == sorted(ref[rank]), rank  # every step, with the reference's loss
    assert [s for _, s in steps(work / "run.log")].count(resumed_at + 1) == 2  # the first step after it, redone


@pytest.mark.ranks
def test_two_neighbouring_nodes_lost_fall_back_to_the_checkpoint_saying_why(tmp_path, tmp_path_factory):
    """3 emulated nodes x 2 ranks and 2 spares; the ranks of local1 and local2 killed at once: local0's survivors
    hold their own random states and local2's (the node before local0), not local1's: the next attempt resumes from
    the last checkpoint, bit-identical, and says so."""
    reference = reference_run(tmp_path_factory, 3, 2)
    shutil.copy(SCRIPTS / "resumable.py", tmp_path)
    code, out, err = _run_and_kill(tmp_path, ["--nodes", "3", "--procs-per-node", "2", "--spare-nodes", "2"],
                                   {2, 3, 4, 5})
    assert code == 0, err
    assert ("clusterddp: peer heal not used: no survivor holds the random states of rank(s) 2,3 (each rank's are "
            "held by its own node and the next one") in out, out
    assert "clusterddp: peer heal: resuming" not in out
    resumed = int(re.search(r"RESUME from step (\d+)", out).group(1))
    assert resumed % 4 == 0 and resumed >= 4, out  # a checkpoint's step
    _same_as(tmp_path, reference, 6, resumed)
    assert total_steps(6) == len(set(s for _, s in steps(tmp_path / "run.log")))
    run_dir = next((tmp_path / "clusterddp-runs").glob("resumable-local-*"))
    shown = run_cli("status", str(run_dir), cwd=tmp_path).stdout
    assert re.search(rf"\nattempt 2 \(restart 0\) on local0,\S+, .*; started from the checkpoint of step {resumed} "
                     r"\(peer heal not used: no survivor holds the random states of rank\(s\) 2,3 ", shown), shown
    assert _peer_checked(tmp_path) == {True}  # its saves count optimizer steps: a resume from them keeps at once


def _peer_checked(where: Path) -> set:
    """What the run's checkpoints say of their step count (checked at the save: a resume from them keeps at once)."""
    import torch

    return {torch.load(p, map_location="cpu", weights_only=True).get("peer_checked") for p in where.rglob("ckpt-*.pt")}


@pytest.mark.ranks
def test_a_save_that_keeps_extra_values_turns_peer_heal_off_and_a_lost_node_resumes_from_the_checkpoint(
        tmp_path, reference):
    """Right or abstain: a save with extra= values (here the epoch) keeps what a peer state cannot know at the step
    in flight: peer heal says it is off, at the first save, and the lost node's job resumes from the checkpoint."""
    shutil.copy(SCRIPTS / "resumable.py", tmp_path)
    code, out, err = _run_and_kill(tmp_path, ["--nodes", "2", "--procs-per-node", "2", "--spare-nodes", "1"],
                                   {2, 3}, "--save-extra")
    assert code == 0, err
    assert out.count("clusterddp: peer heal is off for this run: save() keeps extra= values (epoch), which only a "
                     "save records (pass the object itself, e.g. sched=sched, and to load_latest too: its state is "
                     "then kept at each step's end); a lost node resumes from the last checkpoint") == 2, out
    assert "peer heal: rank" not in out and "peer heal: resuming" not in out, out
    assert _peer_checked(tmp_path) == {False}
    resumed = int(re.search(r"RESUME from step (\d+)", out).group(1))
    assert resumed % 4 == 0, out
    _same_as(tmp_path, reference, 4, resumed)


@pytest.mark.ranks
def test_the_drill_s_node_loss_without_peer_heal_resumes_from_the_checkpoint_and_says_what_it_redid(tmp_path):
    """Issue 55, item 4: the drill kills a node a step after the first checkpoint; with --no-peer-heal the kill
    resumes from that checkpoint and redoes the step, said so. (With peer heal, the default, the same kill resumes
    from the survivors' memory and redoes nothing: tests/test_drill.py drills each node's loss so, and the README's
    drill of the example in tests/test_newcomer.py.)"""
    shutil.copy(SCRIPTS / "resumable.py", tmp_path)
    args = ["--", "--ckpt-dir", "ck", "--out", "out.pt", "--steps-log", "steps.log", "--step-sleep", "0",
            "--ckpt-every", "4", "--epochs", "1"]
    proc = subprocess.run([sys.executable, "-m", "clusterddp", "drill", "--launcher", "srun", "--only", "kill",
                           "--json", "--no-peer-heal", "resumable.py", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = {v["scenario"]: v["why"] for v in json.loads(proc.stdout)["scenarios"]}
    assert set(found) == {"kill-node0"}, found
    assert re.search(r": bit-identical \(resumed from its checkpoint at step 4, 1 step\(s\) redone\)$",
                     found["kill-node0"]), found


@pytest.mark.ranks
def test_a_rank_ended_by_a_lost_peer_runs_its_exit_handlers_keeps_its_files_and_skips_the_teardown(tmp_path):
    """Issue 55 (the restart's time): a survivor's exit waited for the interpreter's teardown (0.4-0.8 s with torch
    imported), and a rank blocked on a peer that was tearing down waited for it too, before srun could end the step.
    3 real gloo ranks, the last SIGKILLed: each survivor ends with exit 1 and its traceback, after its exit handler
    ran and with what it wrote to files it never closed all there (a plain file, and gzip's, closed whole), and
    without the teardown (an object's __del__ never ran); a rank that ends normally still tears down."""
    import gzip
    import socket as sockets

    with sockets.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    try:
        for rank in range(3):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="3", LOCAL_WORLD_SIZE="3",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CLUSTERDDP_RUN_DIR=str(tmp_path / "run"))
            procs.append(subprocess.Popen([sys.executable, str(SCRIPTS / "lost_peer_exit.py"), str(tmp_path)],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        ended = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[2].returncode == -signal.SIGKILL
    for rank in (0, 1):
        out, err = ended[rank]
        assert procs[rank].returncode == 1 and "Traceback" in err, (rank, err[-2000:])
        assert (tmp_path / f"atexit-{rank}").exists(), rank
        lines = [f"line {i} of rank {rank}" for i in range(100)]
        assert (tmp_path / f"text-{rank}.log").read_text().splitlines() == lines
        with gzip.open(tmp_path / f"packed-{rank}.gz", "rt") as packed:  # (a truncated stream would raise here)
            assert packed.read().splitlines() == lines
        assert not (tmp_path / f"teardown-{rank}").exists(), rank
    # the marks work: a normal end, and a rank's own exception after init(), tear down as always
    for mode, code in (("plain", 0), ("raise", 1)):
        (tmp_path / mode).mkdir()
        env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0",
                   CLUSTERDDP_RUN_DIR=str(tmp_path / mode / "run"))
        alone = subprocess.run([sys.executable, str(SCRIPTS / "lost_peer_exit.py"), str(tmp_path / mode), mode],
                               env=env, capture_output=True, text=True, timeout=120)
        assert alone.returncode == code, alone.stderr
        assert (tmp_path / mode / "teardown-0").exists() and (tmp_path / mode / "atexit-0").exists(), mode


# Issue 79: these local jobs test what the ranks do, not their cold start (conftest.warm_start).
pytestmark = pytest.mark.usefixtures("warm_start")
