"""Peer heal (issue 55), the keeping half: each rank holds the state of the last completed optimizer step, and when a
peer is lost (a collective fails under it) writes it to node-local memory, so that the next attempt starts from the
survivors' memory instead of the last checkpoint: at most the step in flight is redone.

Parameters and optimizer state need no copy: a failure in a step's collectives (the gradient all-reduce, or the
exchange below) comes before that step's optimizer step, so they still hold the last completed step. What the lost
ranks alone held, their random states, travels at every step: before its optimizer step, each rank sends its random
states (~12 KB) to its buddy, the rank of the same local rank on the next node (rank + ranks per node), and receives
its other neighbour's. One node lost: every rank's states are still held by a survivor. Two lost nodes, or a
survivor that holds no state, and the next attempt falls back to the checkpoint (peerload.py decides).

The state is written only when the exception that ends the rank is a lost peer's (torch's distributed errors, gloo's
"Connection closed by peer"), under /dev/shm/clusterddp-UID/ (mode 0700, checked: owner, no link), one directory per
run and node; the next attempt reads it, uses it or not, and removes it.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import stat
import time
from typing import Any, Dict, Mapping, Optional

from .. import contract
from .ckptstate import rng_state
from .group import print0, unwrap
from .state import STATE, channel, rank, world_size

EXCHANGE_BYTES = 1 << 16  # one rank's random states as JSON (python's 625 words, torch's 5 KB, numpy's) fit
STALE_S = 24 * 3600       # this user's states of other runs older than this are removed at the next load
_LOST_PEER = re.compile(r"Connection (closed|reset) by peer|Broken pipe|gloo|NCCL|c10d|[Ss]ocket|timed out")


def enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """On unless CLUSTERDDP_PEER_HEAL is 0 / off / false / no (``submit --no-peer-heal`` sets it)."""
    environ = os.environ if environ is None else environ
    return environ.get(contract.PEER_HEAL, "1").strip().lower() not in ("0", "off", "false", "no")


def node_name(environ: Optional[Mapping[str, str]] = None) -> str:
    """The node this rank runs on, as Slurm (or the local backend's emulation) names it: states are kept per node,
    and a rank reads only its own node's (several emulated or test-cluster nodes share one machine's /dev/shm)."""
    import socket

    environ = os.environ if environ is None else environ
    name = environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:64] or "node"


def root(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """This user's private directory of states (made 0700 when missing), or None where it cannot be trusted."""
    environ = os.environ if environ is None else environ
    base = environ.get(contract.PEER_DIR) or "/dev/shm"
    path = os.path.join(base, f"clusterddp-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None  # planted by someone else, a link, or readable by others: never used
    return path


def run_key(run: str) -> str:
    return hashlib.sha256(run.encode()).hexdigest()[:20]


def node_dir(run: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    top = root(environ)
    return None if top is None else os.path.join(top, run_key(run), node_name(environ))


def digest(state: Any) -> str:
    """SHA-256 of a state's content (tensors by their bytes, in key order): what survivors compare."""
    h = hashlib.sha256()
    _feed(h, state)
    return h.hexdigest()


def _feed(h: Any, obj: Any) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    elif isinstance(obj, dict):
        h.update(b"{")
        for key in sorted(obj, key=repr):
            h.update(repr(key).encode())
            _feed(h, obj[key])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for item in obj:
            _feed(h, item)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())


class Keeper:
    """The last completed step of one (model, optimizer, loader), kept by optimizer hooks (see the module)."""

    def __init__(self, run: str, model: Any, optimizer: Any, loader: Any, step: int) -> None:
        env = STATE["env"]
        self.run, self.model, self.optimizer, self.loader = run, model, optimizer, loader
        per_node = max(1, env.local_world_size)
        self.buddy, self.source = (rank() + per_node) % world_size(), (rank() - per_node) % world_size()
        self.offset, self.taken = int(step), 0  # the script's step count = offset + optimizer steps since
        self.trusted: Optional[bool] = None  # that count checked at a save (None: no save yet)
        self.off_why: Optional[str] = None
        self.stepping = False
        self.pending: Optional[Dict[str, Any]] = None
        self.done = self._completed(self._exchange(rng_state()))
        self.hooks = [optimizer.register_step_pre_hook(self._pre), optimizer.register_step_post_hook(self._post)]

    def _exchange(self, own: Dict[str, Any]) -> Dict[str, Any]:
        """This rank's random states to its buddy, its source's back: {rank: states} of both."""
        import torch
        import torch.distributed as dist

        data = json.dumps(own, separators=(",", ":")).encode()
        if len(data) + 8 > EXCHANGE_BYTES:
            raise ValueError(f"random states of {len(data)} bytes")
        out = torch.zeros(EXCHANGE_BYTES, dtype=torch.uint8)
        out[:8] = torch.tensor(list(len(data).to_bytes(8, "little")), dtype=torch.uint8)
        out[8:8 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        got = torch.zeros(EXCHANGE_BYTES, dtype=torch.uint8)
        works = [dist.isend(out, self.buddy, group=channel()), dist.irecv(got, self.source, group=channel())]
        for work in works:
            if work is not None:
                work.wait()
        size = int.from_bytes(bytes(got[:8].tolist()), "little")
        theirs = json.loads(bytes(got[8:8 + min(size, EXCHANGE_BYTES - 8)].tolist()))
        return {str(rank()): own, str(self.source): theirs}

    def _pre(self, *_: Any) -> None:
        if STATE.get("peer") is not self:
            return
        self.pending = self._exchange(rng_state())  # a lost peer raises here: the step below never happens
        self.stepping = True

    def _post(self, *_: Any) -> None:
        if STATE.get("peer") is not self or self.pending is None:
            return
        self.taken += 1
        self.done, self.pending, self.stepping = self._completed(self.pending), None, False

    def _completed(self, rngs: Dict[str, Any]) -> Dict[str, Any]:
        from . import telemetry

        steps = telemetry.current()
        return {"step": self.offset + self.taken, "rng": rngs,
                "loader": self.loader.state_dict() if self.loader is not None else None,
                "telemetry_steps": steps.position() if steps is not None else None}

    def saved(self, step: int, extra: Mapping[str, Any], per_rank: Any) -> None:
        """A checkpoint was saved at ``step``: the script's step count must be the optimizer's (else the step a
        peer state resumes at would not be the script's), and the state must be all that a save keeps."""
        if self.trusted is False:
            return
        if int(step) != self.offset + self.taken:
            self._off(f"save() was given step {step} after {self.offset + self.taken} optimizer steps (peer heal "
                      "resumes at the optimizer's step count: a count of micro-batches or epochs is not it)")
        elif extra or per_rank is not None:
            self._off("save() keeps extra= or per_rank= values, which only a save records")
        else:
            self.trusted = True

    def _off(self, why: str) -> None:
        self.trusted, self.off_why = False, why
        print0(f"clusterddp: peer heal is off for this run: {why}; a lost node resumes from the last checkpoint")

    def on_exception(self, exc: BaseException) -> Optional[str]:
        """The exception hook's part (control.py): a survivor of a lost peer writes its state; returns where."""
        if not lost_peer(exc):
            return None
        return self._write()

    def on_hang(self) -> Optional[str]:
        """The hang watchdog's part, from its thread while the main thread waits (on a lost or frozen peer)."""
        return self._write()

    def _write(self) -> Optional[str]:
        try:
            return write(self)
        except Exception as failed:  # a help: the checkpoint is still there
            print(f"clusterddp: peer heal: this rank's state was not kept ({type(failed).__name__}: {failed})",
                  flush=True)
            return None

    def state(self) -> Optional[Dict[str, Any]]:
        """The last completed step's state, or None where it cannot be told exactly."""
        if not self.trusted or self.stepping or self.done is None:
            return None
        shared = {"step": self.done["step"], "model": unwrap(self.model).state_dict(),
                  "optimizer": self.optimizer.state_dict(), "loader": self.done["loader"]}
        return {"run": self.run, "uid": os.getuid(), "node": node_name(), "rank": rank(), "world_size": world_size(),
                "time": time.time(), "telemetry_steps": self.done["telemetry_steps"], "rng": self.done["rng"],
                "parameters_digest": digest({**{k: v for k, v in shared.items() if k != "model"},
                                             "parameters": parameters(self.model)}),
                "buffers": len(shared["model"]) > len(parameters(self.model)), "digest": digest(shared),
                "shared": shared}


def parameters(model: Any) -> Dict[str, Any]:
    """What DDP keeps equal on every rank (buffers are rank 0's, broadcast at each forward)."""
    return {name: p for name, p in unwrap(model).named_parameters()}


def keep(run: Optional[str], model: Any, optimizer: Any, loader: Any, step: int, trusted: bool = False) -> None:
    """Start keeping (Checkpointer.load_latest, at a fresh start or after a resume), where it applies: a job of
    two nodes or more, a model and its optimizer, peer heal not turned off."""
    old = STATE.pop("peer", None)
    if old is not None:
        for hook in old.hooks:
            hook.remove()
    env = STATE.get("env")
    if (run is None or env is None or model is None or optimizer is None or not enabled()
            or world_size() <= max(1, env.local_world_size) or world_size() % max(1, env.local_world_size)):
        return
    STATE["peer"] = Keeper(run, model, optimizer, loader, step)
    if trusted:  # resumed from a state that was kept only where the step count was checked
        STATE["peer"].trusted = True


def saved(step: int, extra: Mapping[str, Any], per_rank: Any) -> None:
    keeper = STATE.get("peer")
    if keeper is not None:
        keeper.saved(step, extra, per_rank)


def lost_peer(exc: BaseException) -> bool:
    """The exception ending this rank is a lost peer's (what a survivor of a lost node meets)."""
    import torch.distributed as dist

    kinds = tuple(k for k in (getattr(dist, "DistError", None),) if k is not None)
    return bool(kinds and isinstance(exc, kinds)) or (isinstance(exc, RuntimeError) and bool(_LOST_PEER.search(
        str(exc)[:2000])))


def write(keeper: Keeper) -> Optional[str]:
    import torch

    state = keeper.state()
    where = node_dir(keeper.run)
    if state is None or where is None:
        return None
    os.makedirs(where, 0o700, exist_ok=True)
    path = os.path.join(where, f"rank-{rank()}.pt")
    temp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        torch.save(state, fh)
    os.replace(temp, path)
    print(f"clusterddp: peer heal: rank {rank()} kept the state of step {state['shared']['step']} in {path}",
          flush=True)
    return path
