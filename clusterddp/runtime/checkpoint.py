"""Checkpoints that make an interrupted job continue exactly where it stopped: model, optimizer, the loader's
position and every rank's random number states, written atomically by rank 0, each with a manifest (step, size,
SHA-256, the run that wrote it) that a load checks: a file changed after it was written is damaged, and an older one
is loaded; a checkpoint of another run (a sweep's other trial in a shared directory) is never resumed unless the
user names it (``start_from``)."""
from __future__ import annotations

import os
import re
import stat
from typing import Any, Dict, List, Optional, Tuple

from .. import contract
from ..errors import RuntimeEnvError
from . import ckptfile, ckptowner, drill, peerheal, peerload, peerstate, rundir, telemetry, writer
from .ckptstate import check_payload, cpu_copy, restore, rng_state, saved_rng
from .collect import broadcast_json, gather_json
from .group import barrier, is_main, print0, rank, unwrap, world_size


class Checkpointer:
    """Checkpoints that make an interrupted job continue exactly where it stopped.

        ckpt = runtime.Checkpointer(os.path.join(os.environ.get("CLUSTERDDP_RUN_DIR", "."), "checkpoints"))
        state = ckpt.load_latest(model, optimizer, loader)     # None on a fresh start; every rank loads the same
        ...
        if runtime.should_stop():
            ckpt.save(step, model, optimizer, loader); return

    ``save`` is collective: rank 0 writes model, optimizer, the loader's position and every rank's RNG states
    atomically (temp file + rename) and keeps the last ``keep`` checkpoints.

    ``background=True``: ``save`` returns once rank 0 holds a copy in memory (CPU) and writes it on a thread while
    training goes on, so frequent checkpoints cost little. The next ``save``, ``should_stop()`` when it says stop,
    ``wait()``, ``latest()`` and ``runtime.shutdown()`` wait for that write; one that failed raises on every rank
    there (the checkpoints before it are untouched). Memory: one more copy of the model and optimizer state.

    Each checkpoint records the run that wrote it (``owner()``: the job, or a sweep's trial), and ``load_latest``
    resumes only this run's own: another run's checkpoint in the same directory is named and passed over, unless
    ``start_from`` (or CLUSTERDDP_START_FROM) names it and the run has none of its own yet.
    """

    def __init__(self, directory: str, keep: int = 3, background: bool = False) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory, self.keep, self.background = directory, keep, bool(background)
        self._owner: Optional[ckptowner.Owner] = None  # (not asked yet) rank 0's answer

    @property
    def owner(self) -> ckptowner.Owner:
        """Who this run is, for the checkpoints it writes and resumes (asked once)."""
        if self._owner is None:
            self._owner = ckptowner.owner()
        return self._owner

    @property
    def run(self) -> Optional[str]:
        return self.owner.run

    def _own(self, path: str, record: Optional[Dict[str, Any]]) -> bool:
        """This run continues from that checkpoint (ckptowner.resumable)."""
        return ckptowner.resumable(self.owner, record)

    def _begin(self) -> None:
        """Rank 0, once, before the first step: this run's stale temp files go; other runs writing here are named."""
        if getattr(self, "_begun", False):
            return
        self._begun = True
        ckptfile.remove_stale(rundir.at(self.directory), self.run)
        # (outside a job there is one process: no run to tell apart)
        others = ckptowner.claim(self.directory, self.run) if self.run is not None else []
        if others:
            print0(f"clusterddp: warning: checkpoint directory {self.directory} is written by another run at the same "
                   f"time: {'; '.join(others[:3])}; both write ckpt-<step>.pt there and replace each other's files. "
                   "Give each run its own directory (under $CLUSTERDDP_RUN_DIR: a requeued or retried job keeps it, "
                   "each sweep trial has its own)")

    def _paths(self) -> List[str]:
        """This job's checkpoints, oldest first: regular files of this user's only. In a directory others can
        write, one planted with a higher step is neither loaded nor a reason to delete the job's own; a FIFO
        there would hang the load."""
        try:
            names = os.listdir(rundir.at(self.directory))
        except FileNotFoundError:
            return []
        steps = []
        for name in names:
            # ckpt-STEP.pt, or ckpt-STEP.TAG.pt where another run's checkpoint held the plain name (_name)
            m = re.fullmatch(r"ckpt-(\d{1,12})(\.[0-9a-f]{12})?\.pt", name)
            try:
                info = os.lstat(rundir.at(os.path.join(self.directory, name))) if m else None
            except OSError:
                continue
            if m and info is not None and stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
                steps.append((int(m.group(1)), info.st_mtime, name))
        return [os.path.join(self.directory, n) for _, _, n in sorted(steps)]

    def _name(self, step: int) -> str:
        """Rank 0: where checkpoint ``step`` goes: ckpt-STEP.pt, unless that name holds another run's checkpoint
        (a directory shared with a sweep's other trial): then ckpt-STEP.TAG.pt, this run's tag, never theirs."""
        path = os.path.join(self.directory, f"ckpt-{int(step):010d}.pt")
        if os.path.lexists(rundir.at(path)) and not self._own(path, ckptfile.manifest(rundir.at(path))):
            return os.path.join(self.directory, f"ckpt-{int(step):010d}.{ckptfile.tag(self.run)}.pt")
        return path

    def _own_paths(self) -> List[str]:
        return [p for p in self._paths() if self._own(p, ckptfile.manifest(rundir.at(p)))]

    def _prune(self) -> None:
        """This run's checkpoints past the last ``keep`` (never another run's), and this run's temp files left by a
        write killed half-way (a node lost, SIGKILL): none of this run's is in flight now."""
        for old in self._own_paths()[:-self.keep]:
            os.unlink(rundir.at(old))
            try:
                os.unlink(rundir.at(ckptfile.manifest_of(old)))
            except FileNotFoundError:
                pass
        ckptfile.remove_stale(rundir.at(self.directory), self.run)

    def save(self, step: int, model: Any, optimizer: Any = None, loader: Any = None,
             per_rank: Optional[Dict[str, Any]] = None, **extra: Any) -> str:
        """Write checkpoint ``step`` (collective: call it on every rank); returns its path (in the background:
        the path it will have once written; rank 0's answer is exact, the others' the plain ckpt-STEP.pt).
        ``extra``: rank 0's values; ``per_rank``: values each rank has its own of (JSON: a running loss of the
        rank's share), gathered from every rank and given back to each by ``load_latest`` as ``per_rank``."""
        peerstate.check_values(per_rank)
        peerstate.check_loader(loader, "save")
        peerheal.saved(step, extra, per_rank)
        with telemetry.phase("ckpt"):  # the time training waited for it (a background write: the copy only)
            return self._save(step, model, optimizer, loader, extra, per_rank)

    def _save(self, step: int, model: Any, optimizer: Any, loader: Any, extra: Dict[str, Any],
              per_rank: Optional[Dict[str, Any]] = None) -> str:
        if self.background:
            writer.used()
            writer.settle()  # one write in flight at most; a failed one raises here, on every rank
        states = [saved_rng(state) for state in gather_json(rng_state())]
        path = os.path.join(self.directory, f"ckpt-{int(step):010d}.pt")
        if is_main():
            self._begin()
            path = self._name(step)
            if self.run is not None:
                ckptowner.renew(self.directory, self.run)
        drill.record({"e": "save", "step": int(step), "path": os.path.abspath(path)})
        who = self.owner if is_main() else ckptowner.Owner(None)
        payload = {"step": int(step), "run": who.run, "trial": who.trial, "model": unwrap(model).state_dict(),
                   "optimizer": optimizer.state_dict() if optimizer is not None else None,
                   "loader": loader.state_dict() if loader is not None else None,
                   "rng": states, "world_size": world_size(), "extra": peerstate.extra_values(extra),
                   "peer_checked": peerheal.checked(),
                   "per_rank": gather_json(per_rank) if per_rank is not None else None}
        steps = telemetry.current()
        if steps is not None:  # steps done, counted across resumes: a resumed run's redone steps are known
            payload["telemetry_steps"] = steps.position()
        if not self.background:
            if is_main():
                ckptfile.write(payload, rundir.at(path))
                self._prune()
            barrier()
        elif is_main():
            # The previous copy's write is settled (above): its memory is reused.
            copy = self._copy = cpu_copy(payload, getattr(self, "_copy", None))

            def write() -> None:
                ckptfile.write(copy, rundir.at(path))
                self._prune()

            writer.start(path, write)
        return path

    def wait(self) -> None:
        """Until the background write in flight is on disk (collective); raises on every rank if it failed."""
        if self.background:
            writer.settle()

    def latest(self) -> Optional[str]:
        """The newest checkpoint's path, as rank 0 sees it (every rank gets the same answer)."""
        self.wait()
        paths = self._own_paths() if is_main() else []
        return broadcast_json(paths[-1] if paths else None)

    def _newest_loadable(self, weights_only: bool, start_from: Optional[str]) -> Tuple[Dict[str, Any], Any]:
        """Rank 0: this run's newest checkpoint that loads (a damaged one, a write cut short on a full disk, is passed
        over with a warning: the older ones are tried), else ``start_from``'s; and its payload. Another run's
        checkpoints are passed over and named."""
        self._begin()
        found: Dict[str, Any] = {"path": None, "skipped": [], "refused": None, "foreign": [], "started": None}
        own = []
        for candidate in self._paths():
            record = ckptfile.manifest(rundir.at(candidate))
            if self._own(candidate, record):
                own.append((candidate, record))
            else:
                found["foreign"].append([candidate, str(record["run"])[:200] if record else None])
        payload = self._first_loadable(reversed(own), weights_only, found)
        by = dict(own).get(found["path"]) if found["path"] else None
        found["by"] = by["run"] if by and by.get("run") not in (None, self.run) else None
        if found["path"] is None and not found["refused"] and start_from:
            payload = self._start_from(start_from, weights_only, found)
        return found, payload

    def _start_from(self, start_from: str, weights_only: bool, found: Dict[str, Any]) -> Any:
        """The checkpoint the user named (a file, or a directory: its newest that loads, whoever wrote it)."""
        where = os.path.abspath(start_from)
        if os.path.isdir(where):
            candidates = [(p, ckptfile.manifest(rundir.at(p))) for p in reversed(Checkpointer(where)._paths())]
            runs = {str(r.get("run")) if r else "an older clusterddp's run": p for p, r in reversed(candidates)}
            if len(runs) > 1:  # whose to take is the user's choice, not ours
                found["refused"] = (f"start_from {start_from!r} holds checkpoints of {len(runs)} runs ("
                                    + "; ".join(f"{run}: newest {p}" for run, p in list(runs.items())[:4])
                                    + "): name the checkpoint file to start from")
                return None
        elif os.path.isfile(where):
            candidates = [(where, ckptfile.manifest(where))]
        else:
            found["refused"] = (f"start_from {start_from!r} (or ${contract.START_FROM}) is neither a checkpoint file "
                                "nor a directory of checkpoints: give the path of a ckpt-<step>.pt or of its directory")
            return None
        payload = self._first_loadable(iter(candidates), weights_only, found)
        if found["path"] is not None:
            record = dict(candidates)[found["path"]]
            found["started"] = str(record.get("run")) if record else "an older clusterddp's run"
        elif not found["refused"] and not found["skipped"]:
            found["refused"] = f"start_from {start_from!r} holds no checkpoint (ckpt-<step>.pt) of yours"
        return payload

    def _first_loadable(self, candidates: Any, weights_only: bool, found: Dict[str, Any]) -> Any:
        import pickle

        import torch

        payload = None
        for candidate, record in candidates:
            try:
                ckptfile.verify(rundir.at(candidate), record)
                payload = torch.load(rundir.at(candidate), map_location="cpu", weights_only=weights_only)
                check_payload(payload)
                found["path"] = candidate
                return payload
            except pickle.UnpicklingError as exc:
                if not re.search(r"GLOBAL|global|[Cc]lass", str(exc)):  # (torch: no code asked for) damaged
                    found["skipped"].append(f"{candidate} ({type(exc).__name__}: {str(exc)[:120]})")
                    continue
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                found["refused"] = (
                    f"checkpoint {candidate} holds more than tensors and plain data, so it was not loaded "
                    f"(unpickling it could run code: {first[:200]}); if you wrote it yourself (an object in "
                    "extra=, or a checkpoint of an older clusterddp), load it with load_latest(..., "
                    "weights_only=False)")
                return None
            except Exception as exc:  # damaged: truncated, not a checkpoint, a key missing
                payload = None
                found["skipped"].append(f"{candidate} ({type(exc).__name__}: {str(exc)[:120]})")
        return None

    def _say_found(self, found: Dict[str, Any]) -> Dict[str, Any]:
        """What rank 0 found and passed over, said (every rank: a refusal raises on each)."""
        if found["foreign"]:
            self._say_foreign(found)
        if found["refused"]:
            raise RuntimeEnvError(found["refused"])
        for skipped in found["skipped"]:
            print0(f"clusterddp: checkpoint {skipped} is damaged and was passed over"
                   + (f"; loading {found['path']}" if found["path"] else ""))
        return found

    def _say_foreign(self, found: Dict[str, Any]) -> None:
        """The line about another run's checkpoints passed over (rank 0's findings, on rank 0)."""
        path, run = found["foreign"][-1]
        more = len(found["foreign"]) - 1
        print0(f"clusterddp: {os.path.basename(path)} in {self.directory} was written by run {run}, not this one "
               f"({self.run if is_main() else 'this job'}): not loaded"
               + (f" (nor {more} more of other runs)" if more else "")
               + (f"; starting from {found['path']}, as start_from asks" if found["started"] else
                  "; this run starts afresh" if found["path"] is None else f"; resuming this run's {found['path']}")
               + ". To start from another run's checkpoint, pass start_from=PATH to load_latest (or set "
               f"{contract.START_FROM}); to keep runs apart, checkpoint under $CLUSTERDDP_RUN_DIR")

    def load_latest(self, model: Any = None, optimizer: Any = None, loader: Any = None,
                    weights_only: bool = True, start_from: Optional[str] = None,
                    per_rank: Optional[Dict[str, Any]] = None, **objects: Any) -> Optional[Dict[str, Any]]:
        """Restore this run's newest checkpoint into the given objects; returns it (step, extra, ...) or None.

        Only this run's own checkpoints are resumed (a requeue or retry of the job, a rerun of a sweep trial):
        another run's in the same directory is named and passed over. ``start_from`` (default: the environment's
        CLUSTERDDP_START_FROM): a checkpoint file, or a directory whose newest checkpoint is taken, of any run,
        loaded when this run has none of its own yet (fine-tuning; a new job continuing a finished one).

        Loaded with ``weights_only=True``: tensors and plain data only, since a run directory may be shared and a
        planted checkpoint would otherwise run code at load. What ``save`` writes is all of that kind (random
        states included); ``weights_only=False`` for a checkpoint of your own that holds other objects in
        ``extra``. ``objects``: save()'s stateful extra= objects by name (sched=sched), restored from it.
        ``per_rank``: the dict of this rank's own values that the script updates in place and gives every save,
        updated with those the checkpoint holds (peer heal then keeps them too: docs/node-failure.md)."""
        import torch

        self.wait()
        peerstate.check_objects(objects, per_rank)
        peerstate.check_loader(loader, "load_latest")
        healed = peerload.resume(self.run, self._paths, model, optimizer, loader, objects, per_rank)  # issue 55
        if healed is not None:
            return healed
        if start_from is None:
            start_from = os.environ.get(contract.START_FROM) or None
        found, payload = self._newest_loadable(weights_only, start_from) if is_main() else ({}, None)
        found = self._say_found(broadcast_json(found))
        path = found["path"]
        if path is None:
            if found["skipped"]:
                raise RuntimeEnvError(f"no checkpoint in {self.directory} could be loaded (every one of them is "
                                      "damaged); move them aside to start afresh")
            drill.record({"e": "load", "step": None})
            peerload.started(self.run, model, optimizer, loader, None, "fresh", objects=objects, mine=per_rank)
            return None
        if payload is None:
            payload = torch.load(rundir.at(path), map_location="cpu", weights_only=weights_only)
        restore(payload, path, model, optimizer, loader)
        peerstate.restore_objects(objects, payload.get("extra"), f"checkpoint {path}")
        payload["path"] = path
        ranks = payload.get("per_rank")  # this rank's own (none when the world size changed)
        payload["per_rank"] = ranks[rank()] if isinstance(ranks, list) and len(ranks) == world_size() else None
        peerstate.restore_values(per_rank, payload["per_rank"], f"checkpoint {path}")
        if found.get("by"):  # another job of yours that wrote into this directory: its work continues, said
            print0(f"clusterddp: resuming {path} (step {payload['step']}), written by run {found['by']}: another job "
                   "with this checkpoint directory")
        if found["started"]:
            print0(f"clusterddp: starting from {path} (step {payload['step']}, written by run {found['started']}), as "
                   "start_from asks: this run's own checkpoints will be resumed from now on")
        given = {"model": model, "optimizer": optimizer, "loader": loader}
        drill.record({"e": "load", "step": payload["step"], "path": os.path.abspath(path),
                      "restored": sorted(k for k, v in given.items() if v is not None and payload.get(k) is not None),
                      "held": sorted(k for k in given if payload.get(k) is not None)})
        peerload.started(self.run, model, optimizer, loader, payload["step"], "checkpoint",
                         checked=payload.get("peer_checked"), objects=objects, mine=per_rank,
                         held=list(payload.get("extra") or {}) + (["per_rank"] if payload["per_rank"] else []))
        return payload
