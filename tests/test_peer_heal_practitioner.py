"""Peer heal as a practitioner meets it on a 2-16 node Slurm job, checked against docs/node-failure.md ("Peer heal")
and the README's "Failed nodes" line, not against the code's output. The docs' promises used as ground truth:
- a lost node's next attempt resumes at the survivors' last completed step (at most the step in flight redone),
  nothing read from the checkpoint directory; every rank gets its own random states from whoever held them (its own
  node, and its buddy: the same local rank on the next node, in rank order);
- else it falls back to the last checkpoint and says why: survivors that disagree (a step or a digest); a rank whose
  random states nobody holds (two neighbouring nodes lost; a loss between the all-reduce and the optimizer step); a
  state older than the newest checkpoint; another world size; rank 0 lost with a model that has buffers; a state of
  another run, user or node is never used;
- no state is kept until the run's first save, nor by a rank inside its optimizer step, nor where save() counts
  something other than optimizer steps or keeps extra=/per_rank= values (then said once, "peer heal is off");
- states live in a private directory, /dev/shm/clusterddp-UID/RUN/NODE/rank-R.pt (CLUSTERDDP_PEER_DIR moves it); a
  frozen node's survivors write theirs from the hang watchdog; other runs' states older than a day go at any load.
Three simulators of our own: the summaries a fault leaves (what decide() is given), real state files in the
documented format (what the next attempt's ranks read), and one rank's training loop with the real keeping hooks."""
from __future__ import annotations

import base64
import json
import os
import random
import time
import types

import pytest
import torch

from clusterddp.runtime import peerheal, peerload, peerpaths, peerstate
from clusterddp.runtime.state import STATE

# --- 1. what a fault leaves: the summaries the next attempt's ranks gather --------------------------------------

def rng(rank: int, step: int) -> dict:
    return {"torch": f"rank {rank}'s random states at step {step}"}


def survivor(rank: int, per_node: int, world: int, step: int, *, buffers=False, only_own=False, params=None,
             node=None) -> dict:
    """The summary of the state old rank ``rank`` wrote: its own random states and (sent by the rank of its local
    rank on the node before it, whose buddy it is) that rank's, unless ``only_own`` (they never came)."""
    held = {rank} if only_own else {rank, (rank - per_node) % world}
    return {"rank": rank, "world_size": world, "step": step, "node": node or f"node{rank // per_node}",
            "whole": rank % per_node == 0,  # (the parameters and optimizer: one copy a node, its local rank 0's)
            "parameters_digest": params or f"params-{step}", "digest": f"all-{step}" + (f"-{rank}" * buffers),
            "buffers": buffers, "telemetry_steps": step, "rng": {str(r): rng(r, step) for r in held}}


def after_loss(nodes: int, per_node: int, lost: set, step: int = 9, *, silent=(), **kw) -> list:
    """The next attempt's entries after the nodes ``lost`` died in step ``step + 1``: the survivors' nodes first
    (one entry per rank; None for the ranks in ``silent``, which wrote nothing), then the replacements' (None)."""
    world, out = nodes * per_node, []
    for n in (n for n in range(nodes) if n not in lost):
        out += [None if r in silent else survivor(r, per_node, world, step, **kw)
                for r in range(n * per_node, (n + 1) * per_node)]
    return out + [None] * (len(lost) * per_node)


def edited(entries: list, rank: int, **change) -> list:
    return [dict(e, **change) if e and e["rank"] == rank else e for e in entries]


def nodes(*numbers: int) -> list:
    return [f"node{n}" for n in numbers]


USE, BACK, NOTHING = "use", "fall back", "nothing"
CASES = [  # (situation, entries, the attempt's world size, newest checkpoint's step, (expected, ...))
    ("2x8, node1 lost in step 10, checkpoint 8", after_loss(2, 8, {1}), 16, 8, (USE, 9, nodes(0))),
    ("2x8, rank 0's node lost, no buffers: rank 8 is the source", after_loss(2, 8, {0}), 16, 8, (USE, 9, nodes(1))),
    ("2x8, rank 0's node lost, BatchNorm", after_loss(2, 8, {0}, buffers=True), 16, 8,
     (BACK, "rank 0's buffers", "BatchNorm")),
    ("2x8, node1 lost, BatchNorm, rank 0 kept", after_loss(2, 8, {1}, buffers=True), 16, 8, (USE, 9, nodes(0))),
    ("4x4, node2 lost", after_loss(4, 4, {2}), 16, 8, (USE, 9, nodes(0, 1, 3))),
    ("4x4, lost right after the checkpoint of step 12 (equal steps)", after_loss(4, 4, {1}, 12), 16, 12,
     (USE, 12, nodes(0, 2, 3))),
    ("4x4, lost before the first save: nothing kept, nothing to say", [None] * 16, 16, None, (NOTHING,)),
    ("4x4, lost in the first save (collective), ckpt-4 never written", after_loss(4, 4, {3}, 4), 16, None,
     (USE, 4, nodes(0, 1, 2))),
    ("4x4, node1 lost; rank 9's all-reduce had completed, it finished step 10",
     edited(after_loss(4, 4, {1}), 9, step=10, parameters_digest="params-10"), 16, 8, (BACK, "disagree")),
    ("4x4, a silent corruption: rank 5's parameters differ at the same step",
     edited(after_loss(4, 4, {2}), 5, parameters_digest="params-9-flipped"), 16, 8, (BACK, "disagree")),
    ("2x4, /dev/shm full on survivor rank 2: it wrote nothing", after_loss(2, 4, {1}, silent={2}), 8, 8,
     (BACK, "random states of rank(s) 2,6 ")),
    ("4x4, node2 lost, rank 1 wrote nothing (its states are rank 5's too)", after_loss(4, 4, {2}, silent={1}), 16, 8,
     (USE, 9, nodes(0, 1, 3))),
    ("4x4, node2 lost, rank 12 (the lost node's buddy) wrote nothing", after_loss(4, 4, {2}, silent={12}), 16, 8,
     (BACK, "random states of rank(s) 8 ")),
    ("2x4, lost between the all-reduce and the optimizer step of step 10",
     after_loss(2, 4, {1}, 10, only_own=True), 8, 8, (BACK, "random states of rank(s) 4,5,6,7")),
    ("8x2, neighbouring nodes 3 and 4 lost", after_loss(8, 2, {3, 4}), 16, 8,
     (BACK, "random states of rank(s) 6,7 ", "two neighbouring nodes")),
    ("8x2, nodes 1, 3 and 5 lost, none neighbours", after_loss(8, 2, {1, 3, 5}), 16, 8,
     (USE, 9, nodes(0, 2, 4, 6, 7))),
    ("8x2, the last node lost alone (its buddies are on node0)", after_loss(8, 2, {7}), 16, 8,
     (USE, 9, nodes(0, 1, 2, 3, 4, 5, 6))),
    # Docs silent on whether the last node's "next node" is the first: either way node7's states are then held by
    # nobody alive, so the safe outcome is the only right one.
    ("8x2, the first and last node lost", after_loss(8, 2, {0, 7}), 16, 8, (BACK, "random states of rank(s) 14,15")),
    ("8x2, nodes 0, 2, 5 lost, BatchNorm", after_loss(8, 2, {0, 2, 5}, buffers=True), 16, 8, (BACK, "rank 0's")),
    ("16x8, node7 lost", after_loss(16, 8, {7}), 128, 8, (USE, 9, nodes(*[n for n in range(16) if n != 7]))),
    ("2x1 CPU job, node1 lost", after_loss(2, 1, {1}), 2, 8, (USE, 9, nodes(0))),
    ("4x4 requeued as 3x4 (the survivors only)", after_loss(4, 4, {2})[:12], 12, 8, (BACK, "written by 16 ranks")),
    ("4x2, node0 lost: node1's local rank 0 (rank 2) holds the parameters", after_loss(4, 2, {0}), 8, 8,
     (USE, 9, nodes(1, 2, 3))),
    ("2x2, node1 lost, rank 0 wrote its random states but not the parameters",
     edited(after_loss(2, 2, {1}), 0, whole=False), 4, 8, (BACK, "no survivor kept the parameters")),
    ("someone saved ckpt-16 into the directory in between", after_loss(4, 4, {2}), 16, 16, (BACK, "older than")),
    ("back on the nodes of an earlier attempt's survivors (step 7), ckpt-12 since", after_loss(4, 4, {2}, 7), 16, 12,
     (BACK, "older than the checkpoint of step 12")),
    ("ranks 4-7 kept by node1 (an earlier attempt) and by node5 (this one)",
     after_loss(4, 4, {2}, 7)[:8] + [survivor(r, 4, 16, 9, node="node5") for r in range(4, 8)] + [None] * 4, 16, 4,
     (BACK, "claim the same rank")),
    ("node3 froze, retried in place: its own watchdog wrote too", after_loss(4, 4, set()), 16, 8,
     (USE, 9, nodes(0, 1, 2, 3))),
]


@pytest.mark.parametrize("entries,world,newest,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_lost_node_resumes_from_the_survivors_or_falls_back_saying_why(entries, world, newest, expected):
    verdict = peerload.decide(entries, world, newest)
    if expected[0] == NOTHING:
        assert verdict is None
    elif expected[0] == BACK:
        assert isinstance(verdict, str) and all(word in verdict for word in expected[1:]), verdict
    else:
        assert isinstance(verdict, peerload.Use), verdict
        assert verdict.step == expected[1] and sorted(verdict.nodes) == sorted(expected[2]), verdict
        states = peerload.random_states(entries)
        assert all(states.get(r) == rng(r, expected[1]) for r in range(world))  # every rank its own, true ones
        assert entries[verdict.source] is not None and entries[verdict.source]["whole"]  # (it sends them)
        if entries[verdict.source]["buffers"]:
            assert entries[verdict.source]["rank"] == 0  # DDP broadcasts rank 0's buffers: only its will do


# --- 2. real state files, read by the next attempt's ranks ---------------------------------------------------------

@pytest.fixture
def job(tmp_path, monkeypatch):
    """An isolated runtime: STATE, random states and the peer directory restored after; no run directory."""
    saved, rngs = dict(STATE), (torch.get_rng_state(), random.getstate())
    monkeypatch.setenv("CLUSTERDDP_PEER_DIR", str(tmp_path / "shm"))
    for name in ("CLUSTERDDP_PEER_HEAL", "CLUSTERDDP_RUN_DIR", "CLUSTERDDP_DRILL_DIR"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "shm").mkdir()
    (tmp_path / "shm" / f"clusterddp-{os.getuid()}").mkdir(mode=0o700)
    STATE.clear()
    STATE.update(control=types.SimpleNamespace(store=None, restart=0), device=torch.device("cpu"))
    yield tmp_path / "shm" / f"clusterddp-{os.getuid()}"
    STATE.clear()
    STATE.update(saved)
    torch.set_rng_state(rngs[0])
    random.setstate(rngs[1])


def be(monkeypatch, rank: int, world: int, per_node: int, node: str) -> None:
    STATE["env"] = types.SimpleNamespace(rank=rank, world_size=world, local_rank=rank % per_node,
                                         local_world_size=per_node, master_addr="127.0.0.1")
    monkeypatch.setenv("SLURMD_NODENAME", node)


def true_rng(rank: int) -> dict:
    torch.manual_seed(1000 + rank)
    random.seed(1000 + rank)
    return peerheal.unpack_rng(peerheal.pack_rng())


def write_state(top, run: str, at: str, rank: int, per_node: int, world: int, step: int, **fields) -> str:
    """A survivor's file as the docs describe it, written by hand: RUN/NODE/rank-R.pt in the private directory;
    the parameters and optimizer in a node's local rank 0's only."""
    shared = {"step": step, "model": {"weight": torch.full((1, 2), float(step)), "bias": torch.zeros(1)},
              "optimizer": None, "loader": {"batches_done": step}}
    state = {"run": run, "uid": os.getuid(), "node": at, "rank": rank, "world_size": world, "time": time.time(),
             "telemetry_steps": step, "rng": {str(r): true_rng(r) for r in (rank, (rank - per_node) % world)},
             "parameters_digest": f"p{step}", "buffers": False, "digest": peerheal.digest(shared), "step": step,
             "shared": shared if rank % per_node == 0 else None, **fields}
    where = top / peerpaths.run_key(run) / at
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    torch.save(state, where / f"rank-{rank}.pt")
    return str(where / f"rank-{rank}.pt")


def next_attempt(monkeypatch, run: str, placement: list, per_node: int, newest=None, as_rank=0, model=None,
                 mine=None):
    """Every rank of the next attempt (``placement``: its nodes in order) reads its node's state; the gathering is
    replaced by that list and the broadcast by the source's file; then ``load_latest``'s peer step runs as rank
    ``as_rank``. Returns (what it returned, the lines it printed, the gathered entries)."""
    world, gathered, shared = len(placement) * per_node, [], {}
    for new in range(world):
        be(monkeypatch, new, world, per_node, placement[new // per_node])
        state, note = peerload._mine(run)
        entry = json.loads(json.dumps(peerload._summary(state))) if state else None
        gathered.append({"entry": entry, "note": note, "newest": newest if new == 0 else None})
        shared[new] = state and state["shared"]
    said: list = []
    monkeypatch.setattr(peerload, "gather_json", lambda value: gathered)
    monkeypatch.setattr(peerload, "_broadcast", lambda state, source: shared[source])
    monkeypatch.setattr(peerload, "print0", lambda *a, **k: said.append(" ".join(map(str, a))))
    monkeypatch.setattr(peerload, "started", lambda *a, **k: None)
    be(monkeypatch, as_rank, world, per_node, placement[as_rank // per_node])
    paths = [f"ck/ckpt-{newest:010d}.pt"] if newest is not None else []
    return peerload.resume(run, lambda: paths, model, None, None, None, mine), said, [g["entry"] for g in gathered]


def test_a_spare_s_rank_resumes_from_the_survivors_files_with_its_own_random_states(job, monkeypatch):
    """2x2, node n2 (old ranks 2, 3) lost in step 8; the next attempt on n1 and the spare n3. New rank 2 (on the
    spare, reading nothing itself) gets step 7's parameters and old rank 2's random states, held by rank 0."""
    for r in (0, 1):
        write_state(job, "run-a", "n1", r, 2, 4, 7)
    model = torch.nn.Linear(2, 1)
    got, said, _ = next_attempt(monkeypatch, "run-a", ["n1", "n3"], 2, newest=4, as_rank=2, model=model)
    assert got["step"] == 7 and got["path"] is None and got["peer"] == ["n1"], got
    assert torch.equal(model.weight.detach(), torch.full((1, 2), 7.0))
    now = torch.get_rng_state(), random.getstate()
    torch.manual_seed(1002)
    random.seed(1002)
    assert torch.equal(now[0], torch.get_rng_state()) and now[1] == random.getstate()  # old rank 2's, from rank 0
    assert said == ["clusterddp: peer heal: resuming at step 7 from the memory of the ranks that survived on n1 "
                    "(digests agree); nothing read from the checkpoint directory"]


def values_of(rank: int) -> str:
    return json.dumps({"loss_sum": 0.25 * rank + 1 / 3, "seen": 7 + rank}, sort_keys=True)


def test_a_spare_s_rank_gets_its_per_rank_values_from_the_survivor_that_held_them(job, monkeypatch):
    """per_rank= values (a running loss of the rank's share) kept as the docs say: each survivor holds its own and its
    source's. The lost node's new rank gets old rank 2's values, held by rank 0, in the dict given to load_latest
    and in what it returns; where one survivor lacks its source's values (they never arrived), nothing is used."""
    for r in (0, 1):
        write_state(job, "run-v", "n1", r, 2, 4, 7, values={str(r): values_of(r), str(r + 2): values_of(r + 2)})
    mine = {"loss_sum": 0.0, "seen": 0, "dropped": "since"}
    got, said, _ = next_attempt(monkeypatch, "run-v", ["n1", "n3"], 2, newest=4, as_rank=2, mine=mine)
    assert got["step"] == 7 and got["per_rank"] == json.loads(values_of(2)), got
    assert mine == json.loads(values_of(2)) and got["per_rank"]["loss_sum"] == 0.5 + 1 / 3  # (restored exactly)
    write_state(job, "run-w", "n1", 0, 2, 4, 7, values={"0": values_of(0), "2": values_of(2)})
    write_state(job, "run-w", "n1", 1, 2, 4, 7, values={"1": values_of(1)})  # (rank 3's never came)
    got, said, _ = next_attempt(monkeypatch, "run-w", ["n1", "n3"], 2, newest=4, mine={})
    assert got is None and said == ["clusterddp: peer heal not used: no survivor holds the per_rank= values of "
                                    "rank(s) 3 (each rank's are held by its own node and the next one); resuming "
                                    "from the last checkpoint"], said
    for r in (0, 1):  # 4x1: rank 1's values held by itself and by rank 2, which holds an older frame
        write_state(job, "run-x", f"n{r}", r, 1, 4, 7, values={str(r): values_of(r), str(r - 1 + 4 * (r == 0)):
                                                                values_of(r - 1 + 4 * (r == 0))})
    write_state(job, "run-x", "n2", 2, 1, 4, 7, values={"2": values_of(2), "1": values_of(5)})
    got, said, _ = next_attempt(monkeypatch, "run-x", ["n0", "n1", "n2", "n4"], 1, newest=4, mine={})
    assert got is None and "the survivors disagree on the per_rank= values of rank(s) 1;" in said[0], said


def test_one_survivor_that_could_not_tell_its_state_makes_the_attempt_resume_from_the_checkpoint(job, monkeypatch):
    """Rank 0 kept step 7; rank 1, beside it, wrote why it could not (its scheduler changed after should_stop()):
    the others' states would cover every rank, yet none is used, and the reason is rank 1's."""
    write_state(job, "run-d", "n1", 0, 2, 4, 7)
    declined = {"run": "run-d", "uid": os.getuid(), "node": "n1", "rank": 1, "declined": "sched changed after ..."}
    torch.save(declined, job / peerpaths.run_key("run-d") / "n1" / "rank-1.pt")
    got, said, _ = next_attempt(monkeypatch, "run-d", ["n1", "n3"], 2, newest=4)
    assert got is None and said == ["clusterddp: peer heal not used: rank 1 on n1 kept no state: sched changed after "
                                    "...; resuming from the last checkpoint"], said


def test_eight_ranks_a_node_each_read_a_different_one_of_their_own_node_s_files(job, monkeypatch):
    """CLUSTERDDP_PEER_DIR on a shared filesystem, 2x8: node n1 (old ranks 8-15) reads its 8 files (rank-10 sorts
    before rank-8: every one is still read once) and none of n0's, written beside them."""
    for r in range(16):
        write_state(job, "run-b", f"n{r // 8}", r, 8, 16, 5)
    _, _, entries = next_attempt(monkeypatch, "run-b", ["n1", "n2"], 8)
    assert sorted(e["rank"] for e in entries if e) == list(range(8, 16))


def test_another_user_s_states_on_a_shared_node_are_never_used(job, monkeypatch):
    """Another user's job on this node kept the same run name's states in their own directory, and a file of
    theirs (or one claiming their uid) sits in ours: none is read; the fall-back says why."""
    other = job.parent / "clusterddp-4242"
    write_state(other, "run-c", "n1", 0, 1, 2, 9)
    assert next_attempt(monkeypatch, "run-c", ["n1", "n2"], 1)[0] is None
    write_state(job, "run-c", "n1", 0, 1, 2, 9, uid=os.getuid() + 4242)  # a file claiming another uid
    if os.getuid() == 0:  # (as root: a file another user owns, in our directory)
        os.chown(write_state(job, "run-c", "n2", 1, 1, 2, 9), 4242, 4242)
    got, said, entries = next_attempt(monkeypatch, "run-c", ["n1", "n2"], 1, newest=8)
    assert got is None and entries == [None, None]
    assert len(said) == 1 and said[0].startswith("clusterddp: peer heal not used: a kept state could not be used ")
    assert said[0].endswith("; resuming from the last checkpoint"), said


@pytest.mark.parametrize("planted", ["a link", "a truncated file", "another node's (copied)", "a dict of other keys"])
def test_a_state_file_that_is_not_what_it_claims_is_never_used(job, monkeypatch, planted):
    path = write_state(job, "run-d", "n1", 0, 1, 2, 9, **({"node": "n7"} if planted.startswith("another") else {}))
    if planted == "a dict of other keys":  # (the review: no "shared" key raised KeyError on one rank only)
        torch.save({"run": "run-d", "uid": os.getuid(), "node": "n1", "rank": 0}, path)
    if planted == "a link":
        os.rename(path, path + ".real")
        os.symlink(path + ".real", path)
    elif planted == "a truncated file":
        os.truncate(path, os.path.getsize(path) // 2)
    got, said, entries = next_attempt(monkeypatch, "run-d", ["n1", "n2"], 1, newest=8)
    assert got is None and entries == [None, None] and "peer heal not used" in said[0], said


def test_yesterday_s_run_of_the_same_script_is_not_read_and_its_states_go(job, monkeypatch):
    """A run id is new per job (the same across requeues only): yesterday's job of the same script left states
    on n1 and never came back. Today's job reads none of them, says nothing of peer heal, and removes the ones
    older than a day (not the hour-old states of another job of this user's still waiting for its requeue)."""
    write_state(job, "script-yesterday", "n1", 0, 1, 2, 30)
    write_state(job, "script-an-hour-ago", "n1", 0, 1, 2, 30)
    old = time.time() - 25 * 3600
    os.utime(job / peerpaths.run_key("script-yesterday"), (old, old))
    os.utime(job / peerpaths.run_key("script-an-hour-ago"), (time.time() - 3600,) * 2)
    got, said, entries = next_attempt(monkeypatch, "script-today", ["n1", "n2"], 1)
    assert got is None and said == [] and entries == [None, None]
    assert not (job / peerpaths.run_key("script-yesterday")).exists()
    assert (job / peerpaths.run_key("script-an-hour-ago")).exists()


def test_a_single_process_job_s_load_leaves_node_memory_alone(job, monkeypatch):
    """(docs: day-old states go at the next load by a job peer heal applies to; a one-process job is not one: it
    touches nothing there. A case found by this file: the docs said "any later load".)"""
    write_state(job, "script-yesterday", "n1", 0, 1, 2, 30)
    old = time.time() - 25 * 3600
    os.utime(job / peerpaths.run_key("script-yesterday"), (old, old))
    assert next_attempt(monkeypatch, "one-gpu-run", ["n1"], 1)[0] is None
    assert (job / peerpaths.run_key("script-yesterday")).exists()


# --- 3. one rank's training loop with the real keeping hooks (its buddy's link faked) -------------------------------

class Link:
    def __init__(self, *args, **kwargs):
        self.frames: dict = {}
        self.values: dict = {}

    def send(self, step, payload, values=False):
        # (as if its source had sent the same: the rank before it on the ring)
        (self.values if values else self.frames)[step] = payload

    def drain(self, wait_for=None, seconds=0.0, values=False):
        pass

    def close(self):
        pass


@pytest.fixture
def keeping(job, monkeypatch):
    """Old rank 2 (on n2) of a 2x2 job, or rank 0 (on n1: the one that speaks), keeping from a fresh start."""
    monkeypatch.setattr(peerheal, "Link", Link)

    def start(model=None, step=None, how="fresh", optimizer=torch.optim.SGD, rank=2, checked=False):
        be(monkeypatch, rank, 4, 2, f"n{1 + rank // 2}")
        STATE.pop("peer_models", None)  # (each start: a rank's process of its own)
        model = model or torch.nn.Linear(2, 1)
        opt = optimizer(model.parameters(), lr=0.1)
        peerload.started("run-k", model, opt, None, step, how, checked=checked)
        return model, opt, STATE["peer"]
    return start


def train(model, opt, steps: int, skip=()) -> None:
    for i in range(steps):
        opt.zero_grad()
        model(torch.ones(3, 2)).sum().backward()
        if i not in skip:  # (AMP's GradScaler skips optimizer.step() on inf gradients)
            opt.step()


LOST = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.3]:4")


def test_a_survivor_keeps_the_last_completed_step_from_the_first_save_on(keeping, job):
    model, opt, keeper = keeping()
    train(model, opt, 3)
    assert keeper.on_exception(LOST) is None  # before the run's first save: nothing kept
    peerheal.saved(3, {}, None)
    train(model, opt, 2)
    assert keeper.on_exception(ValueError("a bug of the script's")) is None  # not a lost peer: nothing kept
    path = keeper.on_exception(LOST)
    assert path == str(job / peerpaths.run_key("run-k") / "n2" / "rank-2.pt") and os.stat(job).st_mode & 0o777 == 0o700
    state, note = peerload._mine("run-k")
    assert note is None and (state["shared"]["step"], state["rank"], state["world_size"]) == (5, 2, 4)
    assert torch.equal(state["shared"]["model"]["weight"], model.weight.detach()) and set(state["rng"]) >= {"2"}
    assert keeper.on_hang() == path  # a frozen node's survivor: its hang watchdog writes the same


def test_a_node_keeps_one_copy_of_the_parameters_and_optimizer(keeping, job):
    """8 ranks a node each writing the model and Adam's state would put 8 copies in the node's memory: its local
    rank 0 writes them, the others their random states and digests (what the survivors compare)."""
    kept = {}
    for old in (3, 2):  # node n2 of a 2x2 job: local ranks 1 and 0
        net = torch.nn.Sequential(torch.nn.Linear(2, 256), torch.nn.Linear(256, 256))
        model, opt, keeper = keeping(model=net, rank=old, optimizer=torch.optim.Adam)
        peerheal.saved(0, {}, None)
        train(model, opt, 2)
        kept[old] = keeper.on_exception(LOST)
    assert os.path.getsize(kept[3]) * 10 < os.path.getsize(kept[2]), {r: os.path.getsize(p) for r, p in kept.items()}
    read = {}
    for local in (0, 1):  # the next attempt's ranks on n2: each reads one file
        STATE["env"].local_rank = local
        state, note = peerload._mine("run-k")
        assert note is None, note
        read[state["rank"]] = peerload._summary(state)
    assert (read[2]["whole"], read[3]["whole"]) == (True, False) and read[3]["step"] == read[2]["step"] == 2
    assert set(read[3]["rng"]) >= {"3"} and read[3]["parameters_digest"] != read[2]["parameters_digest"]


def test_a_rank_inside_its_optimizer_step_keeps_nothing(keeping):
    class Stuck(torch.optim.SGD):
        def step(self, closure=None):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    model, opt, keeper = keeping(optimizer=Stuck)
    peerheal.saved(0, {}, None)
    with pytest.raises(RuntimeError):
        train(model, opt, 1)
    assert keeper.on_hang() is None


@pytest.mark.parametrize("save,why", [
    ((1, {}, None), "save() was given step 1 after 10 optimizer steps"),  # an epoch count
    ((40, {}, None), "save() was given step 40 after 10 optimizer steps"),  # micro-batches (accumulation of 4)
    ((10, {"epoch": 1}, None), "save() keeps extra= values (epoch), which only a save records (pass the object "),
    ((10, {}, {"loss": 0.5}), "save() keeps per_rank= values"),
    ((10, {"ema": torch.optim.swa_utils.AveragedModel(torch.nn.Linear(1024, 512))}, None),
     "save()'s extra= object(s) ema hold more than 1 MB"),  # (an EMA copy: too much to copy at each step)
])
def test_a_save_peer_heal_cannot_stand_for_turns_it_off_once_saying_why(keeping, capsys, save, why):
    model, opt, keeper = keeping(rank=0)
    train(model, opt, 10)
    peerheal.saved(*save)
    peerheal.saved(*save)
    out = capsys.readouterr().out
    assert out.count("clusterddp: peer heal is off for this run: ") == 1 and why in out, out
    assert out.rstrip().endswith("; a lost node resumes from the last checkpoint")
    assert keeper.on_exception(LOST) is None


def test_a_scheduler_given_as_an_object_is_kept_as_it_was_at_the_last_step_s_end(keeping):
    """Issue 55, the Checkpointer's extra state: save(..., sched=sched) gives the object; its state is taken at each
    step's end (should_stop()), so a lost peer in the next step's collectives keeps the scheduler of the last
    completed step. A peer lost between an optimizer step and its should_stop() (a loss all-reduce there) would
    pair that step's parameters with the step before's scheduler: nothing is kept (the checkpoint then)."""
    model, opt, keeper = keeping(rank=0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9 ** s)

    def step(end=True):
        train(model, opt, 1)
        sched.step()
        if end:
            keeper.ended()  # (what should_stop() calls)

    peerheal.saved(0, {"sched": sched}, None)
    for _ in range(3):
        step()
    opt.zero_grad()
    model(torch.ones(3, 2)).sum().backward()  # step 4's backward: a peer lost in its all-reduce
    kept = torch.load(keeper.on_exception(LOST), weights_only=True)["shared"]
    assert kept["step"] == 3 and kept["extra"]["sched"]["last_epoch"] == 3, kept["extra"]
    step(end=False)  # step 4's optimizer step, then a peer lost before its should_stop()
    assert keeper.on_exception(LOST) is None
    keeper.ended()
    kept = torch.load(keeper.on_exception(LOST), weights_only=True)["shared"]
    assert kept["step"] == 4 and kept["extra"]["sched"]["last_epoch"] == 4


def test_extras_that_change_without_an_optimizer_step_are_not_kept_until_the_next_one(keeping):
    """(The review: a GradScaler that skips optimizer.step() on inf gradients halves its scale with no optimizer
    step, so that state belongs to no step the parameters are at: a resume from it would redo the batch with the
    halved scale and take a step the run never took.)"""
    model, opt, keeper = keeping(rank=0)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    scaler.scale(torch.ones(()))  # (its scale is made at its first use)
    peerheal.saved(0, {"scaler": scaler}, None)
    train(model, opt, 1)
    keeper.ended()
    keeper.ended()  # (should_stop() per micro-batch: which count the script keeps is told at its next save)
    assert keeper.on_exception(LOST) is None and "the step the script counts is not known" in keeper.declined()
    peerheal.saved(1, {"scaler": scaler}, None)  # the optimizer's: the calls with no step since are not counted
    assert keeper.numbering == "optimizer" and keeper.trusted
    keeper.ended()
    assert torch.load(keeper.on_exception(LOST), weights_only=True)["shared"]["extra"]["scaler"]["scale"] == 8.0
    scaler.update(4.0)  # a skipped step: the scale halved, no optimizer step
    keeper.ended()
    assert keeper.on_exception(LOST) is None
    keeper.ended()  # (and so until an optimizer step)
    assert keeper.on_exception(LOST) is None
    train(model, opt, 1)
    keeper.ended()  # (the count was the optimizer's so far: whether the script counts the skip, its next save says)
    assert keeper.on_exception(LOST) is None and "the step the script counts is not known" in keeper.declined()
    peerheal.saved(2, {"scaler": scaler}, None)  # it does not
    kept = torch.load(keeper.on_exception(LOST), weights_only=True)["shared"]
    assert kept["step"] == 2 and kept["extra"]["scaler"]["scale"] == 4.0


@pytest.mark.parametrize("order, said", [
    ("update, should_stop, save", None),
    ("should_stop, update, save", "sched changed between step 1's should_stop() and its save()"),
    ("save, update, should_stop", "sched changed between step 1's save() and its should_stop()"),
])
def test_a_step_s_save_and_its_should_stop_must_see_the_same_extras_from_the_first_save_on(keeping, capsys, order,
                                                                                          said):
    """A practitioner's case: sched.step() after should_stop(). The checkpoints (saved after the update) are right;
    peer heal's copy, taken at should_stop(), is a step behind, and a node lost in that should_stop()'s collective
    cannot show it. So a step's save() and should_stop() are compared, from the first save on (load_latest's objects
    are watched from the start): where they differ, peer heal goes off, once, saying why (the checkpoint then)."""
    model, opt, _ = keeping(rank=0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9 ** s)
    peerload.started("run-k", model, opt, None, 0, "fresh", objects={"sched": sched})
    keeper = STATE["peer"]
    train(model, opt, 1)
    for part in order.split(", "):
        {"update": sched.step, "should_stop": keeper.ended,
         "save": lambda: peerheal.saved(1, {"sched": sched}, None)}[part]()
    out = capsys.readouterr().out
    if said is None:
        assert keeper.trusted and "peer heal is off" not in out, out
    else:
        assert keeper.trusted is False and out.count("peer heal is off for this run: " + said) == 1, out
        assert "so the state peer heal copies at should_stop() is not the checkpoint's" in out


def test_a_survivor_that_cannot_tell_its_extras_keeps_why_and_the_next_attempt_says_it(keeping, job):
    """The scheduler changed after the last completed step's should_stop() with no optimizer step since (stepped at
    a step's start, or after should_stop() on steps without a save): which state that step ended with cannot be told.
    The survivor writes why instead of a state, and the next attempt's line says it."""
    model, opt, _ = keeping()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9 ** s)
    peerload.started("run-k", model, opt, None, 0, "fresh", objects={"sched": sched})
    keeper = STATE["peer"]
    train(model, opt, 1)
    sched.step()
    keeper.ended()
    peerheal.saved(1, {"sched": sched}, None)
    train(model, opt, 1)
    sched.step()
    keeper.ended()
    assert keeper.declined() is None
    sched.step()  # at the next step's start; then a peer lost in its backward
    assert keeper.on_exception(LOST) is None
    state, note = peerload._mine("run-k")
    assert state is None and note == ("rank 2 on n2 kept no state: sched changed after step 2's should_stop() with "
                                      "no optimizer step since, so which state that step ended with cannot be told "
                                      "(update it before should_stop(), as the checkpoints are saved)"), note


def test_per_rank_values_updated_in_place_are_kept_as_they_were_at_the_last_step_s_end(keeping, capsys):
    """The README example's running loss: load_latest(per_rank=mine) and save(per_rank=mine), mine updated in place
    each step. Its values are taken at each should_stop() and sent to the buddy; a peer lost in the next step keeps
    those of the last completed step (not the next step's running sum, updated before its all-reduce), its source's
    beside them. After a skipped step (a should_stop() with no optimizer step), none are kept until the next step's
    should_stop(): they hold a batch no completed step took."""
    model, opt, _ = keeping()
    mine = {"sum": 0.0, "n": 0}
    peerload.started("run-k", model, opt, None, 0, "fresh", mine=mine)
    keeper = STATE["peer"]

    def step(loss, optimizer_step=True):
        train(model, opt, 1, skip={0} if not optimizer_step else ())
        mine["sum"] += loss
        mine["n"] += 1
        keeper.ended()

    step(0.5)
    peerheal.saved(1, {}, mine)
    step(0.25)
    mine["sum"] += 99.0  # step 3's running sum, before its backward: a peer lost there
    state = torch.load(keeper.on_exception(LOST), weights_only=True)
    assert state["step"] == 2 and json.loads(state["values"]["2"]) == {"sum": 0.75, "n": 2}, state["values"]
    assert state["values"]["0"] == state["values"]["2"]  # (the fake link: the source sent what this rank sent)
    mine["sum"] -= 99.0
    step(0.125, optimizer_step=False)  # a skipped step (GradScaler): the batch's loss counted, no optimizer step
    assert keeper.on_exception(LOST) is None and keeper.declined()
    step(0.5)
    peerheal.saved(4, {}, mine)  # (the script counts the skipped step: its save says so)
    state = torch.load(keeper.on_exception(LOST), weights_only=True)
    assert state["step"] == 4 and json.loads(state["values"]["2"]) == {"sum": 1.375, "n": 4}, state["values"]
    mine["n"] = 0  # (the review: reset at an epoch's extra should_stop(), no batch drawn: the buddy holds the first)
    keeper.ended()
    assert keeper.on_exception(LOST) is None and keeper.declined().startswith(
        "the per_rank= values changed at a should_stop() after optimizer step 4 with no optimizer step since (a "
        "skipped step, a micro-batch, or a second should_stop() of the step)"), keeper.declined()
    out = capsys.readouterr().out
    assert "peer heal is off" not in out, out


@pytest.mark.parametrize("save,why", [
    ("a new dict", "save() keeps per_rank= values, which only a save records (keep them in one dict, updated in place"),
    ("none", "a save was given no per_rank= values while load_latest was given per_rank= (pass them to every save)"),
    ("updated after should_stop", "per_rank changed between step 1's should_stop() and its save()"),
    ("not JSON", "the per_rank= values are not JSON"),
    ("too large", "the per_rank= values take 35024 bytes as JSON, more than the 32768 sent at every step"),
])
def test_per_rank_values_peer_heal_cannot_stand_for_turn_it_off_saying_why(keeping, capsys, save, why):
    model, opt, _ = keeping(rank=0)
    mine = {"sum": 0.0}
    peerload.started("run-k", model, opt, None, 0, "fresh", mine=mine)
    keeper = STATE["peer"]
    train(model, opt, 1)
    mine["sum"] += 1.0
    if save == "not JSON":
        mine["when"] = object()
    if save == "too large":  # (a list of every batch's loss: the checkpoint holds it, the link would not)
        mine["losses"] = [0.125] * 5000
    keeper.ended()
    if save == "updated after should_stop":
        mine["sum"] += 1.0
    peerheal.saved(1, {}, {"a new dict": dict(mine), "none": None}.get(save, mine))
    out = capsys.readouterr().out
    assert keeper.trusted is False and out.count("peer heal is off for this run: ") == 1 and why in out, out
    with pytest.raises(TypeError, match=r"load_latest\(per_rank=...\) was given a list: pass the dict"):
        peerstate.check_objects({}, [1.0])
    with pytest.raises(TypeError, match=r"save\(per_rank=...\)'s entry 'acc' is not JSON \(Object of type Tensor "
                       r"is not JSON serializable\): .* as \.item\(\)"):  # (a practitioner's: was json's traceback)
        peerstate.check_values({"loss": 0.5, "acc": torch.tensor(0.25)})


def test_a_resume_keeps_at_once_only_where_load_latest_was_given_the_state_s_extra_objects(keeping):
    model, opt, _ = keeping()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9 ** s)
    held = {"sched": sched.state_dict()}
    peerload.started("run-k", model, opt, None, 8, "peer", held=held)  # restored by hand: not known to be kept
    assert not STATE["peer"].trusted
    peerload.started("run-k", model, opt, None, 8, "peer", objects={"sched": sched}, held=held)
    assert STATE["peer"].trusted and STATE["peer"].live == {"sched": sched}
    peerload.started("run-k", model, opt, None, 8, "peer", held=["per_rank"])  # values held, no dict to keep them
    assert not STATE["peer"].trusted
    peerload.started("run-k", model, opt, None, 8, "peer", held=["per_rank"], mine={})
    assert STATE["peer"].trusted
    with pytest.raises(TypeError, match=r"load_latest\(sched=...\) was given a dict, which has no state_dict"):
        peerstate.check_objects(held)


def test_an_object_the_state_does_not_hold_is_left_as_given_and_said(capsys):
    opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    sched, fresh = (torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9 ** s) for _ in range(2))
    for _ in range(3):
        opt.step()
        sched.step()
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    peerstate.restore_objects({"sched": fresh, "scaler": scaler}, {"sched": sched.state_dict()}, "checkpoint ck-3")
    assert fresh.last_epoch == 3 and scaler.get_scale() == 8.0
    assert capsys.readouterr().out == ("clusterddp: checkpoint ck-3 holds no extra= entry scaler: load_latest left it "
                                       "as given (saved before it was passed to save()?)\n")


def test_fp16_training_with_a_skipped_step_counts_iterations_not_optimizer_steps(keeping, capsys):
    model, opt, keeper = keeping(rank=0)
    train(model, opt, 4, skip={2})
    peerheal.saved(4, {}, None)
    assert "save() was given step 4 after 3 optimizer steps" in capsys.readouterr().out
    assert keeper.on_exception(LOST) is None


def test_fp16_iterations_counted_across_skipped_steps_are_learnt_at_a_save_and_kept_after(keeping, capsys):
    """A practitioner's drill (GradScaler, an inf loss at step 6, the script counting iterations): the kill right
    after the skip resumed at the optimizer's count, one step short of the script's, and the run differed. A
    should_stop() with no optimizer step since the one before now leaves the count unknown (nothing kept) until a
    save tells it; then each such call moves it, and a state is kept at the script's step."""
    model, opt, keeper = keeping(rank=0)

    def iterations(n, skip=()):
        for i in range(n):
            train(model, opt, 1, skip={0} if i in skip else ())
            keeper.ended()

    iterations(2)
    peerheal.saved(2, {}, None)
    iterations(3, skip={0})  # step 3 skipped, then a peer lost after step 5
    assert keeper.on_exception(LOST) is None and "1 should_stop() call(s) since the last save" in keeper.declined()
    peerheal.saved(5, {}, None)  # 4 optimizer steps, 5 iterations: the script counts iterations
    assert keeper.numbering == "iterations" and keeper.trusted and "peer heal is off" not in capsys.readouterr().out
    kept = torch.load(keeper.on_exception(LOST), weights_only=True)  # lost right after that save: step 5, renumbered
    assert kept["step"] == 5 and torch.equal(kept["shared"]["model"]["weight"], model.weight.detach())
    iterations(2, skip={0})  # step 6 skipped, step 7 taken
    assert torch.load(keeper.on_exception(LOST), weights_only=True)["step"] == 7
    peerheal.saved(7, {}, None)
    assert keeper.trusted and keeper.declined() is None
    peerheal.saved(8, {}, None)  # neither count
    said = capsys.readouterr().out
    assert not keeper.trusted and "save() was given step 8 after 7 optimizer steps and skipped ones" in said


class Batches:
    """runtime.loader's position as peer heal reads it (its epoch and the batches handed out)."""

    def __init__(self):
        self.epoch, self.batches_done = 0, 0

    def state_dict(self):
        return {"epoch": self.epoch, "batches_done": self.batches_done}


def test_skips_are_numbered_where_they_happen_around_saves_and_an_epoch_s_extra_should_stop(keeping):
    """(The review of the skip counting.) A loop that draws a batch, steps unless the step is skipped, and asks
    should_stop(); saves before or after that question; an extra should_stop() at an epoch's end (no batch drawn) is
    no skip. Each time, a state kept is the last completed step's, numbered as the script numbers it."""
    model, opt, _ = keeping(rank=0)
    batches = Batches()
    peerload.started("run-k", model, opt, batches, 0, "fresh")
    keeper = STATE["peer"]

    def iteration(skip=False, ask=True):
        batches.batches_done += 1
        train(model, opt, 1, skip={0} if skip else ())
        if ask:
            keeper.ended()

    def kept():
        state = torch.load(keeper.on_exception(LOST), weights_only=True)
        return state["step"], state["shared"]["loader"]["batches_done"]

    iteration(), iteration()
    keeper.ended()  # an epoch's end asked again: no batch drawn, no skip
    peerheal.saved(2, {}, None)
    assert keeper.trusted and keeper.numbering is None and kept() == (2, 2)
    iteration(skip=True)
    peerheal.saved(3, {}, None)  # after the skipped step's should_stop(): the script counts it
    assert keeper.numbering == "iterations" and keeper.trusted
    assert kept() == (2, 2)  # the last completed step is still 2 (it was numbered 3 before the review)
    iteration()
    assert kept() == (4, 4)
    iteration(skip=True, ask=False)
    peerheal.saved(5, {}, None)  # before the skipped step's should_stop(): it will count it
    keeper.ended()
    assert keeper.trusted and kept() == (4, 4)
    iteration()
    assert kept() == (6, 6)
    # (the review: what a save learnt is kept, in the checkpoint and in the state, for the attempt resumed from it)
    assert peerheal.checked() == "iterations"
    assert torch.load(keeper.on_exception(LOST), weights_only=True)["shared"]["numbering"] == "iterations"
    peerload.started("run-k", model, opt, batches, 6, "checkpoint", checked="iterations")
    assert STATE["peer"].trusted and STATE["peer"].numbering == "iterations"
    peerload.started("run-k", model, opt, batches, 6, "checkpoint", checked="planted")
    assert not STATE["peer"].trusted and STATE["peer"].numbering is None


def test_a_resume_from_a_checked_checkpoint_keeps_at_once_and_from_an_unchecked_one_after_the_next_save(keeping):
    """(A case found by this file: after any resume from a checkpoint nothing was kept until that attempt's first
    save, so a second node lost within a checkpoint interval of a requeue went back to the checkpoint. A checkpoint
    saved with the step count checked now says so, and a resume from it keeps at once.)"""
    model, opt, keeper = keeping(step=8, how="checkpoint", checked=True)  # ckpt-8 saved with the count checked
    assert keeper.trusted and peerheal.checked()  # (and a save now records it again)
    train(model, opt, 2)
    kept = keeper.on_exception(LOST)
    assert kept is not None and torch.load(kept, weights_only=True)["shared"]["step"] == 10
    model, opt, keeper = keeping(step=8, how="checkpoint")  # one of an older clusterddp, or saved unchecked
    train(model, opt, 2)
    assert keeper.on_exception(LOST) is None
    peerheal.saved(10, {}, None)
    assert peerheal.checked()  # (what the next checkpoint's payload records)
    train(model, opt, 1)
    assert keeper.on_exception(LOST) is not None


def test_a_language_model_with_tied_embeddings_has_no_buffers(keeping):
    """(A case found by this file: a tied weight, listed once by named_parameters(), was read as a buffer, so a
    tied-embedding model losing rank 0's node fell back saying "rank 0's buffers (BatchNorm ...)".)"""
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = torch.nn.Embedding(4, 2), torch.nn.Linear(2, 4, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x):
            return self.head(x)

    model, opt, keeper = keeping(model=Tied())
    peerheal.saved(0, {}, None)
    assert not keeper.state()["buffers"]


def test_a_batchnorm_model_s_state_says_it_has_buffers(keeping):
    model, opt, keeper = keeping(model=torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)))
    peerheal.saved(0, {}, None)
    assert keeper.state()["buffers"]


@pytest.mark.parametrize("lost_node_left_states", [False, True])
def test_a_load_leaves_no_empty_directory_of_its_run_in_node_memory(job, monkeypatch, lost_node_left_states):
    """Each node's local rank 0 removes its node's states of the run once read, and the run's directory with them
    when no other node's are left in it (the test cluster's nodes share one /dev/shm: node2's, the lost node's,
    stay, as on a real node that came back, until a day old)."""
    for r in (0, 1):
        write_state(job, "run-z", "n1", r, 2, 4, 7)
        if lost_node_left_states:
            write_state(job, "run-z", "n2", r + 2, 2, 4, 7)
    got, _, _ = next_attempt(monkeypatch, "run-z", ["n1", "n3"], 2, newest=4, as_rank=0, model=torch.nn.Linear(2, 1))
    assert got["step"] == 7
    run_dir = job / peerpaths.run_key("run-z")
    assert not (run_dir / "n1").exists()
    assert run_dir.exists() == lost_node_left_states and (run_dir / "n2").exists() == lost_node_left_states


# --- 4. found by a practitioner's reading (2026-12-07): said, not silent; the next step's true start -------------

def test_a_node_lost_before_the_attempt_s_first_save_is_said_and_the_next_attempt_says_why(keeping, job,
                                                                                              monkeypatch, capsys):
    """A script that saves once an epoch, its node lost in the first epoch: nothing can be kept (the step count is
    checked at the first save), and both the survivor and the next attempt say so, where they said nothing."""
    model, opt, keeper = keeping(rank=0)  # (on n1; n2 lost, the spare n3 next)
    train(model, opt, 3)
    assert keeper.on_exception(LOST) is None
    said = capsys.readouterr().out
    assert "rank 0 kept no state: a peer was lost (or hung) before this attempt's first save()" in said, said
    got, said, _ = next_attempt(monkeypatch, "run-k", ["n1", "n3"], 2)
    assert got is None and any("peer heal not used: rank 0 on n1 kept no state: a peer was lost (or hung)" in line
                               for line in said), said


def test_draws_after_an_optimizer_step_are_kept_as_the_next_step_s_start(job, monkeypatch):
    """An evaluation between steps with a plain DataLoader (its iter() draws a base seed from torch's generator):
    the kept random states are those at the next batch, where the next step starts, not those at the optimizer
    step (a resume would start the step a draw behind: every later dropout mask different)."""
    from clusterddp import runtime

    monkeypatch.setattr(peerheal, "Link", Link)
    be(monkeypatch, 2, 4, 2, "n2")
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = runtime.loader(torch.utils.data.TensorDataset(torch.ones(64, 2)), batch_size=2)
    peerload.started("run-k", model, opt, data, None, "fresh")
    keeper = STATE["peer"]
    peerheal.saved(0, {}, None)
    batches = iter(data)
    for _ in range(3):
        (x,) = next(batches)
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        list(torch.utils.data.DataLoader([1, 2]))  # the evaluation
        start = torch.get_rng_state()
        if _ == 1:
            torch.rand(3)  # and a draw of its own (a random sample to log)
            start = torch.get_rng_state()
    next(batches)  # the next step's batch
    torch.rand(5)  # its forward's dropout, then a second micro-batch (gradient accumulation): that step's own draws
    next(batches)  # (its all-reduce then fails)
    assert keeper.on_exception(LOST) is not None
    state, _ = peerload._mine("run-k")
    assert state["step"] == 3 and state["rng"]["2"]["torch"] == base64.b64encode(start.numpy().tobytes()).decode()


def test_a_second_checkpointer_turns_peer_heal_off_and_says_so_once(job, monkeypatch, capsys):
    """A GAN's two networks (two Checkpointers, one optimizer each), or an EMA's Checkpointer before the model's:
    peer heal keeps one model, and the next attempt's first load_latest would take its state for whichever model
    it is given (the same shapes: the wrong weights, silently). So it is off for the run, said once; load_latest
    called again for the same model keeps it on."""
    monkeypatch.setattr(peerheal, "Link", Link)
    be(monkeypatch, 0, 4, 2, "n1")

    def load_latest(model, optimizer):
        peerload.started("run-k", model, optimizer, None, None, "fresh")
        return STATE.get("peer")

    gen, disc = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt_g, opt_d = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (gen, disc))
    assert load_latest(gen, opt_g) is not None and load_latest(gen, opt_g) is not None
    assert load_latest(disc, opt_d) is None and load_latest(gen, opt_g) is None
    assert capsys.readouterr().out.count("peer heal is off for this run: load_latest was called for two models") == 1
    for key in ("peer_models", "peer_two_said"):  # (a new process: an EMA's Checkpointer, with no optimizer, first)
        STATE.pop(key)
    ema = torch.optim.swa_utils.AveragedModel(gen)
    assert load_latest(ema, None) is None and load_latest(gen, opt_g) is None
    assert "load_latest was called for two models" in capsys.readouterr().out


def test_a_plain_data_loader_is_a_clear_error_at_load_latest_not_a_traceback_at_the_first_save(tmp_path, job):
    """A DataLoader cannot tell where it is in its epoch: load_latest and save say so and what to pass, at once
    (before, load_latest took it silently and the first save, hours later, failed inside clusterddp)."""
    from clusterddp.runtime import Checkpointer

    model = torch.nn.Linear(2, 1)
    plain = torch.utils.data.DataLoader(list(range(4)))
    ckpt = Checkpointer(str(tmp_path / "ck"))
    for call in (lambda: ckpt.load_latest(model, None, plain), lambda: ckpt.save(1, model, None, plain)):
        with pytest.raises(TypeError, match=r"(load_latest|save)\(loader=...\) was given a DataLoader, which cannot "
                                            r"tell where it is in its epoch .*pass runtime.loader\(dataset"):
            call()
    assert not (tmp_path / "ck").exists() or not list((tmp_path / "ck").glob("ckpt-*"))


def test_a_resume_from_the_survivors_of_a_static_graph_model_says_what_a_checkpoint_s_says(job, monkeypatch, capsys):
    """static_graph=True at 3+ ranks cannot resume exactly (DDP lays out its buckets again): load_latest said so
    from a checkpoint only; from the survivors it said "digests agree" alone."""
    for r in (0, 1):
        write_state(job, "run-s", "n1", r, 2, 4, 7)
    model = torch.nn.Linear(2, 1)
    model.static_graph = True  # (what DDP(static_graph=True) holds; runtime.wrap's model is one)
    got, _, _ = next_attempt(monkeypatch, "run-s", ["n1", "n3"], 2, newest=4, as_rank=0, model=model)
    assert got["step"] == 7 and "wrapped with static_graph=True" in capsys.readouterr().out


def test_ranks_on_nccl_keep_nothing_yet_and_say_so_and_explain_says_it(job, monkeypatch, capsys):
    """Under NCCL the gradient all-reduce completes on the GPU after the CPU has gone on to the optimizer step (its
    hooks): "the last completed step" cannot be told from the CPU, and no GPU has verified a design yet. So ranks on
    NCCL keep nothing (a lost node resumes from the checkpoint), said once; explain says so for GPU jobs."""
    from clusterddp.job.explain import peer_heal
    from clusterddp.job.spec import JobSpec

    monkeypatch.setattr(peerheal, "Link", Link)
    be(monkeypatch, 0, 4, 2, "n1")
    STATE["backend"] = "nccl"
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        peerload.started("run-n", model, opt, None, None, "fresh")
        assert STATE.get("peer") is None
    assert capsys.readouterr().out.count("peer heal is off for this run: under NCCL") == 1
    STATE["backend"] = "gloo"
    peerload.started("run-n", model, opt, None, None, "fresh")
    assert STATE.get("peer") is not None
    gpus = JobSpec("train.py", nodes=2, gpus_per_node=4)
    assert "from the last checkpoint where the ranks use NCCL" in peer_heal(gpus)
    assert "NCCL" not in peer_heal(JobSpec("train.py", nodes=2, procs_per_node=2))


def test_an_evaluation_after_an_epoch_is_before_the_next_epoch_s_first_step(job, monkeypatch):
    """The loop's last look at an epoch (the loader's end) is no step's start: an evaluation after the epoch draws,
    and the next epoch's first batch is where the completed step's random states are taken (found by a review: the
    end's look took them, and the first batch then did not)."""
    from clusterddp import runtime

    monkeypatch.setattr(peerheal, "Link", Link)
    be(monkeypatch, 2, 4, 2, "n2")
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = runtime.loader(torch.utils.data.TensorDataset(torch.ones(16, 2)), batch_size=2)  # (2 batches a rank)
    peerload.started("run-k", model, opt, data, None, "fresh")
    keeper = STATE["peer"]
    peerheal.saved(0, {}, None)
    for epoch in range(2):
        for (x,) in data:
            if epoch == 1:
                break  # (epoch 1's first batch is in: its all-reduce fails)
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        else:
            list(torch.utils.data.DataLoader([1, 2]))  # the epoch's evaluation
            start = torch.get_rng_state()
    assert keeper.on_exception(LOST) is not None
    state, _ = peerload._mine("run-k")
    assert state["step"] == 2 and state["rng"]["2"]["torch"] == base64.b64encode(start.numpy().tobytes()).decode()


# Issue 79: these local jobs test what the ranks do, not their cold start (conftest.warm_start).
pytestmark = pytest.mark.usefixtures("warm_start")
