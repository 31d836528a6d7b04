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

import json
import os
import time
from typing import Any, Dict, Mapping, Optional, Tuple

from . import drill, peerpaths, peerstate
from .group import print0, unwrap
from .peerlink import Link, LostPeer, lost_peer
from .peerpaths import node_name
from .peerstate import digest, pack_rng, unpack_rng
from .state import STATE, rank, world_size

STALE_S = 24 * 3600       # this user's states of other runs older than this are removed at the next load
VALUES_LIMIT = 32 * 1024  # per_rank= values larger than this as JSON turn peer heal off (sent at every step)


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
        self.stepping = self.began = False  # (began: the next step's first batch fetched: fetched())
        self.live: Dict[str, Any] = {}  # stateful extra= objects (save()'s), and their states at a step's end
        self.extras: Tuple[int, Dict[str, Any]] = (-1, {})
        # the per_rank= dict load_latest was given (kept in place by the script), its values (JSON) at that step's end
        self.mine: Optional[Dict[str, Any]] = None
        self.values: Optional[str] = None
        self.skipped = -1  # an optimizer step count at whose should_stop() the extras changed without a step
        self.at_save: Tuple[int, Dict[str, Any], Optional[str]] = (-1, {}, None)  # a save's before its should_stop()
        # should_stop() calls with no optimizer step since the one before (a GradScaler's skipped step, or one call
        # per micro-batch): whether the script counts them is told by a save ("iterations": they move the offset)
        # (idle: such calls since the last save, the numbering unknown; after: since the last optimizer step; seen:
        # the loader's position at the last should_stop(): a call with no batch drawn since, an epoch's end, is none)
        self.numbering: Optional[str] = None
        self.idle, self.after, self.at_end, self.seen, self.unsure = 0, 0, 0, self._position(), False
        STATE["peer_links"] = STATE.get("peer_links", 0) + 1  # (load_latest is collective: the same on every rank)
        self.link = Link(STATE["control"].store, f"clusterddp-peer/{STATE['peer_links']}", rank(), self.buddy,
                         self.source, env.master_addr, world_size())
        self.pending = self._send(self.offset)
        self.done = self._completed(self.pending)
        self.hooks = [optimizer.register_step_pre_hook(self._pre), optimizer.register_step_post_hook(self._post)]

    def _send(self, step: int) -> bytes:
        """This rank's random states now (the next step's start) to its buddy; what its source sent is read."""
        self.link.drain()
        own = pack_rng()
        self._wire(step, own)
        return own

    def _wire(self, step: int, payload: bytes, values: bool = False) -> None:
        try:
            self.link.send(step, payload, values=values)
        except OSError as exc:  # the buddy is gone: a lost peer (the step below never happens)
            raise LostPeer(f"peer heal: rank {self.buddy}, this rank's buddy, is gone ({exc})") from exc

    def _pre(self, *_: Any) -> None:
        if STATE.get("peer") is not self:
            return
        self.pending = self._send(self.offset + self.taken + 1)
        self.stepping = True

    def _post(self, *_: Any) -> None:
        if STATE.get("peer") is not self or not self.stepping:
            return
        self.taken += 1
        self.done, self.stepping, self.after, self.began = self._completed(self.pending), False, 0, False

    def fetched(self) -> bool:
        """The loader's first batch after an optimizer step (EpochLoader): what drew since that step's hook (an
        evaluation, a plain DataLoader's iter()) is before the next step's start: the completed step's random states
        again. (A later batch before the next optimizer step is a micro-batch's: its draws are that step's own.)
        True where this look took them: a look that finds the epoch's end gives that back (what an evaluation after
        the epoch draws comes before the next epoch's first batch)."""
        if self.stepping or self.began or self.done is None or STATE.get("peer") is not self:
            return False
        self.began = True
        own = pack_rng()  # (the same bytes object where nothing drew: most steps)
        if own is not self.done["own"] and own != self.done["own"]:
            self.done["own"] = own
            self._wire(self.done["step"], own)
        return True

    def _position(self) -> Any:
        return (getattr(self.loader, "epoch", None), getattr(self.loader, "batches_done", None), self.taken) \
            if self.loader is not None else None

    def _idle_now(self) -> bool:
        """A batch drawn since the last should_stop() and no optimizer step (a skipped one, or a micro-batch)."""
        return self.taken == self.at_end and (self.loader is None or self._position() != self.seen)

    def _completed(self, own: bytes) -> Dict[str, Any]:
        from . import telemetry

        steps = telemetry.current()
        return {"step": self.offset + self.taken, "own": own,
                "loader": self.loader.state_dict() if self.loader is not None else None,
                "telemetry_steps": steps.position() if steps is not None else None}

    def held(self) -> Dict[str, Any]:
        """{rank: random states} this rank holds for the last completed step: its own, and its source's where they
        arrived (waited for up to 2 s: a lost source's never come; the send to a lost buddy is not needed here)."""
        step = self.done["step"]
        self.link.drain(wait_for=step, seconds=2, values=self.mine is not None)  # (sent after the random states)
        out = {str(rank()): unpack_rng(self.done["own"])}
        if step in self.link.frames:
            out[str(self.source)] = unpack_rng(self.link.frames[step])
        return out

    def held_values(self) -> Optional[Dict[str, str]]:
        """{rank: per_rank= values (JSON)} this rank holds for the last completed step (its own, its source's where
        they arrived: held() waited for them); None where the script gave load_latest no per_rank= dict."""
        if self.mine is None:
            return None
        out = {str(rank()): self.values or ""}
        got = self.link.values.get(self.done["step"])
        if got is not None:
            out[str(self.source)] = got.decode()
        return out

    def saved(self, step: int, extra: Mapping[str, Any], per_rank: Any) -> None:
        """A checkpoint was saved at ``step``: the script's step count must be peer heal's (else a peer state would
        resume at another step), and the state all that a save keeps (stateful extras: taken at each step's end)."""
        if self.trusted is False:
            return
        why, count, idle, self.idle, self.unsure = peerstate.unkeepable(extra, per_rank, self.mine), \
            self.offset + self.taken, self.idle, 0, False
        pending = int(self.loader is not None and self._idle_now())  # (a skip this step's should_stop() will count)
        if idle + pending and int(step) in (count, count + idle + pending) and self.numbering is None:
            self.numbering = "optimizer" if int(step) == count else "iterations"  # (iterations: the skips count)
            if self.numbering == "iterations":
                self._renumber(idle)
                count = self.offset + self.taken
        count += pending if self.numbering == "iterations" else 0
        if int(step) != count:
            skips = " and skipped ones" if self.numbering == "iterations" else ""
            self._off(f"save() was given step {step} after {count} optimizer steps{skips} (peer heal resumes at that "
                      "count, a skipped step counted where the script counts it: micro-batches or epochs are not it)")
        elif why:
            self._off(why)
        else:
            self.trusted, self.live = True, dict(extra)
            now, values = peerstate.snapshot(self.live), self._values()
            if self.trusted is False:  # (the values are not JSON, or too large: said)
                return
            if self.extras[0] == int(step):  # this step's should_stop() came first
                self._agree(int(step), (self.extras[1], self.values), (now, values), "should_stop()", "save()")
            else:
                self.at_save = (int(step), now, values)  # compared at its should_stop() (ended)

    def _renumber(self, by: int) -> None:
        """The script counts the skipped steps: what is numbered so far moves with them (the last completed step,
        its extras, the random states held for it; a frame still in flight keeps its old number: not used)."""
        self.offset += by
        by -= self.after  # (the skips since the last optimizer step come after it)
        if by and self.done is not None:
            self.done = dict(self.done, step=self.done["step"] + by)
            self.extras = (self.extras[0] + by, self.extras[1]) if self.extras[0] >= 0 else self.extras
            self.link.frames = {k + by: v for k, v in self.link.frames.items()}
            self.link.values = {k + by: v for k, v in self.link.values.items()}

    def _values(self) -> Optional[str]:
        """The per_rank= dict's values now, as JSON (None: no such dict; a value JSON cannot hold turns peer heal
        off: a save could not record it either)."""
        if self.mine is None:
            return None
        try:
            text = json.dumps(self.mine)
        except (TypeError, ValueError) as exc:
            self._off(f"the per_rank= values are not JSON ({exc})")
            return None
        if len(text) > VALUES_LIMIT:
            self._off(f"the per_rank= values take {len(text)} bytes as JSON, more than the {VALUES_LIMIT} sent at "
                      "every step (a list that grows each step?)")
            return None
        return text

    def _agree(self, step: int, at_stop: Tuple[Dict[str, Any], Optional[str]],
               at_save: Tuple[Dict[str, Any], Optional[str]], first: str, then: str) -> None:
        """A step's save() and its should_stop() must see the same extras' states and per_rank= values: peer heal
        resumes exactly what a checkpoint of that step would, or not at all."""
        changed = peerstate.changed(at_stop[0], at_save[0]) + (["per_rank"] if at_stop[1] != at_save[1] else [])
        if changed:
            why = (f"{', '.join(changed)} changed between step {step}'s {first} and its {then} (a sched.step(), "
                   "scaler.update() or a per_rank= value updated between them)")
            drill.record({"e": "order", "why": why})  # (the drill's verdict names it)
            self._off(f"{why}, so the state peer heal copies at should_stop() is not the checkpoint's; update them "
                      "before both")

    def ended(self) -> None:
        """A step ended (should_stop()): the stateful extras' states now are the last completed step's, where no
        optimizer step is in flight (a failure before the next should_stop() leaves them behind: not used). Where
        they changed with no optimizer step since (a GradScaler that skipped one: its scale halved, the batch
        consumed), they belong to no optimizer step: none are kept until the next one."""
        if self.stepping:
            return
        idle = self._idle_now()
        self.at_end, self.seen = self.taken, self._position()
        skip = self._extras_at_end(self.offset + self.taken, idle) \
            if (self.live or self.mine is not None) and self.trusted is not False else False
        self.after += idle
        if idle and self.numbering == "iterations":
            self.offset += 1  # a skipped optimizer step: the script counted it
        elif idle and self.numbering is None:
            self.idle += 1
        elif idle and skip:  # counted as optimizer steps so far, yet a skipped one: is it counted? the next save says
            self.unsure = True

    def _extras_at_end(self, step: int, idle: bool) -> bool:
        """The extras' states and per_rank= values at this step's end, the values sent to the buddy; True where the
        extras changed with no optimizer step (a skip). After a call with no optimizer step (``idle``) the values
        hold a batch no completed step took: none are kept until the next one's should_stop()."""
        now, values = peerstate.snapshot(self.live), self._values()
        if self.at_save[0] == step:
            saved, self.at_save = self.at_save, (-1, {}, None)
            self._agree(step, (now, values), saved[1:], "save()", "should_stop()")
        skip = step == self.extras[0] and digest(now) != digest(self.extras[1])
        # (values that changed at another should_stop() of the same step, an epoch's extra one: which are the step's
        # cannot be told, and the buddy may hold the first: none kept until the next step's)
        moved = self.mine is not None and (idle or (step == self.extras[0] and values != self.values))
        if skip or step == self.skipped or moved:
            self.extras, self.skipped, self.values = (-1, {}), step, None
        else:
            self.extras, self.values = (step, now), values
            if values is not None:
                self._wire(step, values.encode(), values=True)
        return skip

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
            return peerpaths.write(self, self.declined())
        except Exception as failed:  # a help: the checkpoint is still there
            print(f"clusterddp: peer heal: this rank's state was not kept ({type(failed).__name__}: {failed})",
                  flush=True)
            return None

    def declined(self) -> Optional[str]:
        """Why the last completed step's state cannot be told exactly, at a lost peer (None: it can, or peer heal
        is off, said when it was turned off)."""
        if self.trusted is None and self.done is not None:
            return "a peer was lost (or hung) before this attempt's first save(), where the step count is checked"
        if not self.trusted or self.done is None:
            return None
        if self.stepping:
            return "the peer was lost inside an optimizer step"
        if self.idle or self.unsure:
            return (f"{self.idle or 1} should_stop() call(s) since the last save came with no optimizer step since the "
                    "one before (a skipped optimizer step, or one call per micro-batch), so the step the script "
                    "counts is not known until its next save")
        if not self.live and self.mine is None:
            return None
        if self.extras[0] != self.done["step"]:
            kept = ([f"the states of {', '.join(sorted(self.live))}"] if self.live else []) + \
                (["the per_rank= values"] if self.mine is not None else [])
            if self.skipped == self.done["step"]:
                return (f"{' and '.join(kept)} changed at a should_stop() after optimizer step {self.done['step']} "
                        "with no optimizer step since (a skipped step, a micro-batch, or a second should_stop() of "
                        "the step), so which ones that step ended with cannot be told until the next step's")
            return (f"the peer was lost after optimizer step {self.done['step']} and before its should_stop(), where "
                    f"{' and '.join(kept)} are taken")
        changed = peerstate.changed(self.extras[1], peerstate.snapshot(self.live))
        if changed:  # (sched.step() after should_stop(): the copy is a step behind; at a step's start: it is right)
            return (f"{', '.join(changed)} changed after step {self.done['step']}'s should_stop() with no optimizer "
                    "step since, so which state that step ended with cannot be told (update it before "
                    "should_stop(), as the checkpoints are saved)")
        return None

    def state(self) -> Optional[Dict[str, Any]]:
        """The last completed step's state, or None where it cannot be told exactly (``declined`` says why)."""
        if not self.trusted or self.done is None or self.declined() is not None:
            return None
        shared = {"step": self.done["step"], "model": unwrap(self.model).state_dict(), "numbering": self.numbering,
                  "optimizer": self.optimizer.state_dict(), "loader": self.done["loader"],
                  "extra": peerstate.plain(self.extras[1])}
        whole = not STATE["env"].local_rank  # one copy a node (local rank 0's): the others keep what is theirs
        return {"run": self.run, "uid": os.getuid(), "node": node_name(), "rank": rank(), "world_size": world_size(),
                "step": self.done["step"], "time": time.time(), "telemetry_steps": self.done["telemetry_steps"],
                "rng": self.held(), "values": self.held_values(),
                "parameters_digest": digest({**{k: v for k, v in shared.items() if k != "model"},
                                             "parameters": peerstate.parameters(self.model)}),
                "buffers": peerstate.buffered(self.model, shared["model"]), "digest": digest(shared) if whole else None,
                "shared": shared if whole else None}


NUMBERINGS = ("optimizer", "iterations")


def checked() -> Any:
    """The step count was checked at a save of this attempt (a checkpoint saved now says so: a resume from it keeps
    at once), and how the script counts skipped steps where a save told it (NUMBERINGS) in place of True."""
    keeper = STATE.get("peer")
    return (keeper.numbering or True) if keeper is not None and keeper.trusted is True else False


def saved(step: int, extra: Mapping[str, Any], per_rank: Any) -> None:
    keeper = STATE.get("peer")
    if keeper is not None:
        keeper.saved(step, extra, per_rank)
