"""Peer heal (issue 55), the resuming half: at the next attempt's ``load_latest``, the states the survivors kept on
their nodes (peerheal.py) are read where they were written, compared by digest, and one survivor's is broadcast to
every rank (the replacement node's included): nothing is read from the checkpoint directory. Any doubt (survivors
that disagree, a rank whose random states were lost with two nodes, a state older than the newest checkpoint, another
run's or user's) falls back to the checkpoint, saying why."""
from __future__ import annotations

import ctypes
import io
import json
import os
import re
import shutil
import stat
import time
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Union

from .. import contract
from . import drill, peerheal, peerpaths, peerstate, rundir, telemetry
from .ckptstate import saved_rng, set_rng_state, static_graph_note
from .collect import gather_json
from .group import print0, unwrap
from .peerlink import LinkDown
from .state import STATE, channel, rank, world_size


class Use(NamedTuple):
    """Resume from the survivors' state: ``source`` (a rank of this attempt) broadcasts it."""

    source: int
    step: int
    digest: str
    nodes: List[str]


def decide(entries: Sequence[Optional[Dict[str, Any]]], world: int, newest_checkpoint: Optional[int]) \
        -> Union[Use, str, None]:
    """What the gathered summaries (one per rank of this attempt: the state it read, or None) allow: ``Use``, a
    reason to fall back (str), or None where no state was kept at all (a fresh start, a fault with no survivor)."""
    held = [(new, e) for new, e in enumerate(entries) if e]
    if not held:
        return None
    sizes = sorted({e["world_size"] for _, e in held})
    if sizes != [world]:
        return f"the survivors' states were written by {'/'.join(map(str, sizes))} ranks, this attempt has {world}"
    olds = [e["rank"] for _, e in held]
    if len(set(olds)) != len(olds):
        return "two survivors' states claim the same rank"
    by_step: Dict[Any, List[int]] = {}
    for _, e in held:
        by_step.setdefault((e["step"], e["parameters_digest"]), []).append(e["rank"])
    if len(by_step) > 1:
        return "the survivors disagree: " + "; ".join(
            f"step {step} (digest {dig[:12]}) on old rank(s) {','.join(map(str, sorted(r)))}"
            for (step, dig), r in sorted(by_step.items()))
    missing = sorted(set(range(world)) - {int(r) for _, e in held for r in e["rng"]})
    if missing:
        return (f"no survivor holds the random states of rank(s) {','.join(map(str, missing))} (each rank's are "
                "held by its own node and the next one: two neighbouring nodes lost, or a survivor's state unusable)")
    if any(e.get("values") is not None for _, e in held):  # (the script keeps per_rank= values: every rank's needed)
        seen: Dict[int, set] = {}
        for _, e in held:
            for r, v in (e.get("values") or {}).items():
                if v:
                    seen.setdefault(int(r), set()).add(v)
        gone, torn = sorted(set(range(world)) - set(seen)), sorted(r for r, v in seen.items() if len(v) > 1)
        if gone or torn:
            return (f"no survivor holds the per_rank= values of rank(s) {','.join(map(str, gone))} (each rank's are "
                    "held by its own node and the next one)" if gone else
                    f"the survivors disagree on the per_rank= values of rank(s) {','.join(map(str, torn))}")
    step = held[0][1]["step"]
    if newest_checkpoint is not None and step < newest_checkpoint:
        return f"the survivors' state (step {step}) is older than the checkpoint of step {newest_checkpoint}"
    whole = [(new, e) for new, e in held if e.get("whole", True)]
    if not whole:
        return ("no survivor kept the parameters and optimizer state (each node's local rank 0 writes them: none of "
                "those survived)")
    source_new, source = min(whole, key=lambda item: item[1]["rank"])
    if source["buffers"] and source["rank"] != 0:
        return ("rank 0's buffers (BatchNorm statistics: DDP broadcasts rank 0's at every forward) were lost with "
                "its node")
    return Use(source_new, int(step), source["digest"], sorted({e["node"] for _, e in held}))


def random_states(entries: Sequence[Optional[Dict[str, Any]]], key: str = "rng") -> Dict[int, Any]:
    """Every rank's random states (or with ``key`` "values" its per_rank= values) at the step resumed, from the
    survivors that hold them (its own or its buddy's)."""
    return {int(k): v for e in entries if e for k, v in (e.get(key) or {}).items()}


#: What every state file holds ("shared": the parameters and optimizer, or None where another rank of the node has
#: them; "step" in the files of this version, else in "shared").
REQUIRED = {"run", "uid", "node", "rank", "world_size", "rng", "parameters_digest", "buffers", "shared"}


def _read(path: str) -> Dict[str, Any]:
    """One state file of this user's (no link, a regular file, its digest right), loaded as tensors and data."""
    import torch

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise ValueError("not a regular file of this user's")
        state = torch.load(fh, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("declined"), str):
        return state  # a survivor that could not tell its state, and why (peerheal.write)
    shared = state.get("shared") if isinstance(state, dict) else None
    if not isinstance(state, dict) or not REQUIRED <= state.keys() or not isinstance(shared, (dict, type(None))) \
            or not isinstance(state.get("step", (shared or {}).get("step")), int):
        raise ValueError("not a state of peer heal's")
    if state["shared"] is not None and peerheal.digest(state["shared"]) != state.get("digest"):
        raise ValueError("its digest does not match its content")  # (None: not a node's local rank 0's)
    return state


def _mine(run: str) -> tuple:
    """The state this rank reads (its node's, by local rank), with a note where one was there but unusable."""
    where = peerpaths.node_dir(run)
    if where is None or not os.path.isdir(where):
        return None, None
    names = sorted(n for n in os.listdir(where) if n.startswith("rank-") and n.endswith(".pt"))
    local = STATE["env"].local_rank
    if local >= len(names):
        return None, None
    path = os.path.join(where, names[local])
    try:
        state = _read(path)
    except Exception as exc:
        return None, f"{path}: {type(exc).__name__}: {str(exc)[:200]}"
    if state.get("run") != run or state.get("uid") != os.getuid() or state.get("node") != peerpaths.node_name():
        return None, f"{path}: another run's, user's or node's"
    if "declined" in state:
        return None, f"rank {state.get('rank')} on {state['node']} kept no state: {state['declined'][:400]}"
    return state, None


def _summary(state: Dict[str, Any]) -> Dict[str, Any]:
    return {**{k: state[k] for k in ("rank", "world_size", "parameters_digest", "digest", "rng", "node", "buffers")},
            "values": state.get("values"),
            "step": state["step"] if "step" in state else state["shared"]["step"],
            "whole": state["shared"] is not None,
            "telemetry_steps": state.get("telemetry_steps")}


def _clean(run: str) -> None:
    """This run's states on this node go (every rank of the node has read its own: a collective came before), and
    this user's states of other runs left for a day (an attempt that never came)."""
    where = peerpaths.node_dir(run)
    if where is not None and STATE["env"].local_rank == 0:
        shutil.rmtree(where, ignore_errors=True)
        try:
            os.rmdir(os.path.dirname(where))  # (the run's own directory, once no node's states are left in it)
        except OSError:
            pass
        top = peerpaths.root() or ""
        for name in os.listdir(top) if top else []:
            path = os.path.join(top, name)
            try:
                old = time.time() - os.lstat(path).st_mtime > peerheal.STALE_S
            except OSError:
                continue
            if old and name != peerpaths.run_key(run):
                shutil.rmtree(path, ignore_errors=True)


def _broadcast(state: Optional[Dict[str, Any]], source: int) -> Dict[str, Any]:
    """``source``'s shared state on every rank, over the CPU channel, loaded as tensors and data only."""
    import torch
    import torch.distributed as dist

    data = b""
    if rank() == source:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
    size = torch.tensor([len(data)], dtype=torch.int64)
    dist.broadcast(size, source, group=channel())
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
        torch.zeros(int(size.item()), dtype=torch.uint8)
    dist.broadcast(payload, source, group=channel())
    if rank() == source:
        return state  # type: ignore[return-value]
    received = ctypes.string_at(payload.data_ptr(), payload.numel())
    return torch.load(io.BytesIO(received), map_location="cpu", weights_only=True)


def _newest(paths: Callable[[], List[str]]) -> Optional[int]:
    """The newest checkpoint's step, from the names alone (no checkpoint file is opened)."""
    steps = [int(m.group(1)) for m in (re.match(r"ckpt-(\d+)", os.path.basename(p)) for p in paths()) if m]
    return max(steps, default=None)


def resume(run: Optional[str], paths: Callable[[], List[str]], model: Any, optimizer: Any, loader: Any,
           objects: Optional[Dict[str, Any]] = None, mine: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """The payload ``load_latest`` returns when the survivors' memory seeds this attempt, else None (collective).
    ``paths``: the checkpoints' paths (rank 0 reads their names: a kept state older than the newest is not used);
    ``objects``: load_latest's stateful extras, restored from the state's; ``mine``: its per_rank= dict, updated
    with this rank's values from the state."""
    if run is None or not peerpaths.enabled() or world_size() < 2 or "env" not in STATE:
        return None
    state, note = _mine(run)
    gathered = gather_json({"entry": _summary(state) if state else None, "note": note,
                            "newest": _newest(paths) if rank() == 0 else None})
    entries, notes = [g["entry"] for g in gathered], [g["note"] for g in gathered if g["note"]]
    _clean(run)
    verdict = decide(entries, world_size(), gathered[0]["newest"])
    declines = [n for n in notes if " kept no state: " in n]
    if declines or verdict is None or isinstance(verdict, str):  # (one survivor that could not tell: none is used)
        why = (declines or [verdict])[0] or (f"a kept state could not be used ({notes[0]})" if notes else None)
        if why:
            print0(f"clusterddp: peer heal not used: {why}; resuming from the last checkpoint")
            drill.record({"e": "peer", "used": False, "why": why})
            STATE["peer_why"] = why
        return None
    shared = _broadcast(state["shared"] if state and rank() == verdict.source else None, verdict.source)
    if peerheal.digest(shared) != verdict.digest:
        raise RuntimeError("peer heal: the state received differs from the one the survivors agreed on")
    if model is not None:
        unwrap(model).load_state_dict(shared["model"])
    if optimizer is not None:
        optimizer.load_state_dict(shared["optimizer"])
    if loader is not None and shared["loader"] is not None:
        loader.load_state_dict(shared["loader"])
    extra = shared.get("extra") or {}
    objects = objects or {}
    peerstate.restore_objects(objects, extra, "the survivors' state")
    set_rng_state(saved_rng(random_states(entries)[rank()]))
    values = random_states(entries, "values").get(rank())
    per_rank = json.loads(values) if values else None
    peerstate.restore_values(mine, per_rank, "the survivors' state")
    static_graph_note(model)
    steps, done = telemetry.current(), entries[verdict.source]["telemetry_steps"]  # type: ignore[index]
    if steps is not None:
        steps.resumed(done if isinstance(done, int) and done >= 0 else None)
    print0(f"clusterddp: peer heal: resuming at step {verdict.step} from the memory of the ranks that survived on "
           f"{','.join(verdict.nodes)} (digests agree); nothing read from the checkpoint directory")
    given = sorted(k for k, v in {"model": model, "optimizer": optimizer, "loader": loader}.items() if v is not None)
    drill.record({"e": "load", "step": verdict.step, "path": None, "peer": verdict.nodes, "restored": given,
                  "held": given})
    started(run, model, optimizer, loader, verdict.step, "peer", verdict.nodes, checked=shared.get("numbering") or True,
            objects=objects, held=list(extra) + (["per_rank"] if per_rank is not None else []), mine=mine)
    return {"step": verdict.step, "path": None, "peer": verdict.nodes, "extra": extra, "per_rank": per_rank,
            "world_size": world_size()}


def started(run: Optional[str], model: Any, optimizer: Any, loader: Any, step: Optional[int], how: str,
            nodes: Optional[List[str]] = None, checked: Any = False, objects: Optional[Dict[str, Any]] = None,
            held: Any = (), mine: Optional[Dict[str, Any]] = None) -> None:
    """Where this attempt started (``how``: peer, checkpoint or fresh): rank 0 records it in the run directory
    (contract.RECOVERY_FILE: status and report show it per attempt); then the keeping starts, at once where the
    checkpoint it started from was saved with the step count checked (``checked``), else from this attempt's first
    save. ``held``: the names of what the state held beside the model (extras; "per_rank" for such values)."""
    run_dir = os.environ.get(contract.RUN_DIR)
    why = STATE.pop("peer_why", None)
    if run_dir and rank() == 0:
        restart = STATE["control"].restart if "control" in STATE else 0
        line = {"time": time.time(), "restart": restart, "how": how,
                "step": step, "why": why, "nodes": nodes}
        try:
            with open(rundir.at(os.path.join(run_dir, contract.RECOVERY_FILE)), "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")
        except OSError:
            pass  # a help for status; the run goes on
    known = checked in peerheal.NUMBERINGS  # (checked: True, or how the script counts skipped steps, as learnt)
    keep(run, model, optimizer, loader, step or 0, trusted=how == "peer" or checked is True or known,
                  objects=objects, held=held, numbering=checked if known else None, mine=mine)


def keep(run: Optional[str], model: Any, optimizer: Any, loader: Any, step: int, trusted: bool = False,
         objects: Optional[Mapping[str, Any]] = None, held: Any = (), numbering: Any = None,
         mine: Optional[Dict[str, Any]] = None) -> None:
    """Start keeping (Checkpointer.load_latest, at a fresh start or after a resume), where it applies: a job of
    two nodes or more, a model and its optimizer, peer heal not turned off. ``objects``: load_latest's stateful
    extras; ``held``: the extras' names in the state resumed from, and "per_rank" where it held such values (each
    must be given, as objects or as ``mine``: load_latest's per_rank= dict, to trust it at once)."""
    old = STATE.pop("peer", None)
    if old is not None:
        for hook in old.hooks:
            hook.remove()
        old.link.close()
    env = STATE.get("env")
    if (run is None or env is None or model is None or not peerpaths.enabled()
            or world_size() <= max(1, env.local_world_size) or world_size() % max(1, env.local_world_size)):
        return
    if _second_model(run, unwrap(model)) or optimizer is None:
        return
    if STATE.get("backend") == "nccl":
        if not STATE.get("peer_nccl_said"):  # (runtime/group.py picks nccl where the ranks have GPUs)
            STATE["peer_nccl_said"] = True
            print0("clusterddp: peer heal is off for this run: under NCCL the gradient all-reduce completes on the "
                   "GPU after the CPU has gone on to the optimizer step, so which step a survivor's GPU completed "
                   "cannot yet be told (not yet verified on a GPU); a lost node resumes from the last checkpoint")
        return
    try:
        keeper = STATE["peer"] = peerheal.Keeper(run, model, optimizer, loader, step)
    except LinkDown as down:  # (on every rank alike: an optional help never ends a job)
        print0(f"clusterddp: peer heal is off for this run: {down}; a lost node resumes from the last checkpoint")
        return
    keeper.numbering = numbering if numbering in peerheal.NUMBERINGS else None  # (as the state resumed from learnt)
    objects = dict(objects or {})
    keeper.mine = mine
    if not peerstate.unkeepable(objects, None, None):
        keeper.live = objects  # their states are taken from the first should_stop(): the first save compares them
        if trusted and set(held) <= set(objects) | ({"per_rank"} if mine is not None else set()):
            # resumed from a state that was kept only where the step count was checked, its extras given as objects
            keeper.trusted = True


def _second_model(run: str, model: Any) -> bool:
    """load_latest was called for a second model in this process (two Checkpointers: a GAN's two networks, an EMA,
    a best model): peer heal keeps one model and its optimizer, and the next attempt's first load_latest would take
    that state for whichever model it is given; so it is off for the run, said once."""
    seen = STATE.setdefault("peer_models", {}).setdefault(run, [])
    if not any(m is model for m in seen):
        seen.append(model)
    if len(seen) > 1 and not STATE.get("peer_two_said"):
        STATE["peer_two_said"] = True
        print0("clusterddp: peer heal is off for this run: load_latest was called for two models (two "
               "Checkpointers); peer heal keeps one model and its optimizer; a lost node resumes from the last "
               "checkpoint")
    return len(seen) > 1
