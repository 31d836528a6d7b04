"""What a peer state is made of (issue 55): the digest the survivors compare, a rank's random states as bytes (sent
to its buddy at every step), and the Checkpointer's stateful extra= values (objects with state_dict and
load_state_dict: an LR scheduler, a GradScaler), whose state peer heal takes at each step's end (should_stop()).
"""
from __future__ import annotations

import array
import copy
import ctypes
import hashlib
import json
from typing import Any, Dict, List, Mapping, Optional

from . import rngraw
from .ckptstate import numpy_module
from .group import unwrap
from .state import STATE, rank

#: A stateful extra= value whose state is larger than this (an EMA copy of the model) is not copied at each step:
#: peer heal is off for such a run (the checkpoint holds it).
EXTRA_LIMIT_BYTES = 1 << 20


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
    elif isinstance(obj, ScalerState):
        _feed(h, obj.plain())
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


def pack_rng() -> bytes:
    """This rank's random states (ckptstate.rng_state's content) as bytes: a small JSON head, then the torch, CUDA,
    Python and NumPy words, in a few us (Python's and NumPy's read as their memory: rngraw.py), the same bytes object
    where nothing changed since the last call: it runs at every optimizer step."""
    import torch

    if not _RAW:
        numpy = numpy_module()
        _RAW[:] = [rngraw.PythonRaw(), rngraw.NumpyRaw(numpy) if numpy is not None else None]
    python, numpy_state = _RAW[0].read(), _RAW[1].read() if _RAW[1] is not None else None
    dev = STATE.get("device")  # (as ckptstate.rank_device(), without its import and lookups: ~20 us a step)
    blobs = [_raw(torch.get_rng_state()), b"",
             _raw(torch.cuda.get_rng_state(dev)) if dev is not None and dev.type == "cuda" else b""]
    key = (python, numpy_state, blobs[0], blobs[2])
    if key == _LAST.get("key"):
        return _LAST["packed"]
    version, blobs[1], gauss = _RAW[0].decode(python)
    head_numpy = None
    if numpy_state is not None:
        keys, head_numpy = _RAW[1].decode(numpy_state)
        blobs.append(keys)
    head = json.dumps({"v": version, "g": gauss, "n": head_numpy, "l": [len(b) for b in blobs]}).encode()
    _LAST["key"], _LAST["packed"] = key, len(head).to_bytes(4, "little") + head + b"".join(blobs)
    return _LAST["packed"]


_RAW: List[Any] = []  # pack_rng's readers of Python's and NumPy's states (made at its first call)
_LAST: Dict[str, Any] = {}  # pack_rng's last reading, by part


def unpack_rng(data: bytes) -> Dict[str, Any]:
    """pack_rng's bytes in ckptstate.rng_state's JSON form (what restore reads)."""
    import base64

    size = int.from_bytes(data[:4], "little")
    head = json.loads(data[4:4 + size])
    blobs, at = [], 4 + size
    for length in head["l"]:
        blobs.append(data[at:at + length])
        at += length
    state: Dict[str, Any] = {"python": [head["v"], list(array.array("I", blobs[1])), head["g"]],
                             "torch": base64.b64encode(blobs[0]).decode()}
    if blobs[2]:
        state["cuda"] = base64.b64encode(blobs[2]).decode()
    if head["n"] is not None:
        name, pos, has_gauss, cached = head["n"]
        state["numpy"] = [name, list(array.array("I", blobs[3])), pos, has_gauss, cached]
    return state


def _raw(tensor: Any) -> bytes:
    t = tensor.contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def stateful(value: Any) -> bool:
    """An extra= value given as an object to save and restore (``state_dict`` and ``load_state_dict``), not a value."""
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def extra_values(extra: Mapping[str, Any]) -> Dict[str, Any]:
    """What a checkpoint records of ``extra``: a stateful object's state_dict(), any other value as it is."""
    return {name: value.state_dict() if stateful(value) else value for name, value in extra.items()}


def nbytes(obj: Any) -> int:
    """The bytes of the tensors in a state (what a copy at every step would cost)."""
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return int(obj.element_size() * obj.numel())
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0


def unkeepable(extra: Mapping[str, Any], per_rank: Any, mine: Any) -> Optional[str]:
    """Why peer heal cannot hold what a save keeps beside the model, optimizer and loader (None: it can).
    ``mine``: the per_rank= dict load_latest was given (the script updates it in place: its values are kept at each
    step's end); a save's ``per_rank`` must be that very dict, and given whenever it is."""
    if per_rank is not None and per_rank is not mine:
        return ("save() keeps per_rank= values, which only a save records (keep them in one dict, updated in place, "
                "and pass it to load_latest(..., per_rank=mine) and to every save: its values are then kept at each "
                "step's end)")
    if per_rank is None and mine is not None:
        return "a save was given no per_rank= values while load_latest was given per_rank= (pass them to every save)"
    plain = sorted(name for name, value in extra.items() if not stateful(value))
    if plain:
        return (f"save() keeps extra= values ({', '.join(plain)}), which only a save records (pass the object "
                "itself, e.g. sched=sched, and to load_latest too: its state is then kept at each step's end)")
    large = sorted(name for name, value in extra.items() if nbytes(value.state_dict()) > EXTRA_LIMIT_BYTES)
    if large:
        return (f"save()'s extra= object(s) {', '.join(large)} hold more than {EXTRA_LIMIT_BYTES >> 20} MB (an EMA "
                "model?), too much to copy at every step")
    return None


def snapshot(extra: Mapping[str, Any]) -> Dict[str, Any]:
    """The stateful extras' states now, copied (a scheduler's: ~5 us; a GradScaler's on its device: read when used)."""
    return {name: ScalerState(value) if ScalerState.takes(value) else copy.deepcopy(value.state_dict())
            for name, value in extra.items()}


def plain(states: Mapping[str, Any]) -> Dict[str, Any]:
    """snapshot()'s states as their objects' state_dict() gives them (what a checkpoint holds)."""
    return {name: value.plain() if isinstance(value, ScalerState) else value for name, value in states.items()}


class ScalerState:
    """A GradScaler's state_dict(), taken without reading its device: state_dict() reads the scale and the growth
    tracker with .item(), a GPU synchronisation at every step's end (the optimizer step's kernels waited for before
    the next step's are queued). Here both are copied on the device (asynchronous) and read only where used: a
    digest (a step's save, a skipped step) or the state a lost peer leaves."""

    FIELDS = ("growth_factor", "backoff_factor", "growth_interval")

    def __init__(self, scaler: Any) -> None:
        import torch

        self.scale, self.tracker = scaler._scale.clone(), scaler._growth_tracker.clone()
        self.fields = {name: getattr(scaler, f"_{name}") for name in self.FIELDS}
        # The copies are queued on this thread's current stream, maybe a side stream of the script's: the read
        # waits for them by an event (not a device-wide synchronize, which would also wait for NCCL's streams).
        self.ready = None
        if self.scale.is_cuda:
            self.ready = torch.cuda.Event()
            self.ready.record()

    @staticmethod
    def takes(value: Any) -> bool:
        """torch's own GradScaler (its state_dict() not replaced), enabled, past its first scale() (before it, its
        state_dict() reads nothing from the device)."""
        import torch

        kind = getattr(getattr(torch, "amp", None), "GradScaler", None)
        read = ("state_dict", "get_scale", "_get_scale_async", "_get_growth_tracker", "is_enabled")
        return (kind is not None and isinstance(value, kind)
                and all(getattr(type(value), m, None) is getattr(kind, m, None) and m not in vars(value) for m in read)
                and value.is_enabled() and getattr(value, "_scale", None) is not None
                and getattr(value, "_growth_tracker", None) is not None
                and all(hasattr(value, f"_{name}") for name in ScalerState.FIELDS))

    def plain(self) -> Dict[str, Any]:
        if self.ready is not None:
            self.ready.synchronize()
        return {"scale": self.scale.item(), **self.fields, "_growth_tracker": self.tracker.item()}


def check_values(per_rank: Any) -> None:
    """save()'s per_rank=: a dict of JSON values (a usage error names the entry that is not)."""
    if per_rank is None:
        return
    if not isinstance(per_rank, dict):
        raise TypeError(f"save(per_rank=...) was given a {type(per_rank).__name__}: pass a dict of this rank's own "
                        "values (JSON: numbers, strings, lists, dicts)")
    for name, value in per_rank.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"save(per_rank=...)'s entry {name!r} is not JSON ({exc}): per-rank values are saved "
                            "as JSON; a tensor's number goes in as .item(), its values as .tolist()") from None


def check_loader(loader: Any, where: str) -> None:
    """A loader given to save() or load_latest() tells where it is in its epoch (runtime.loader's does)."""
    if loader is not None and not stateful(loader):
        raise TypeError(f"{where}(loader=...) was given a {type(loader).__name__}, which cannot tell where it is in "
                        "its epoch (no state_dict and load_state_dict): pass runtime.loader(dataset, batch_size) (it "
                        "resumes mid-epoch at the exact batch), or no loader")


def check_objects(objects: Mapping[str, Any], per_rank: Any = None) -> None:
    """load_latest's stateful extras: each one an object to restore into (a usage error names the one that is not);
    its per_rank= a dict to update in place."""
    if per_rank is not None and not isinstance(per_rank, dict):
        raise TypeError(f"load_latest(per_rank=...) was given a {type(per_rank).__name__}: pass the dict of this "
                        "rank's own values that the script updates in place and gives every save(per_rank=...)")
    for name, obj in objects.items():
        if not stateful(obj):
            raise TypeError(f"load_latest({name}=...) was given a {type(obj).__name__}, which has no state_dict and "
                            "load_state_dict: pass the object to restore (a scheduler, a GradScaler)")


def restore_objects(objects: Mapping[str, Any], extra: Optional[Mapping[str, Any]], where: str) -> None:
    """Each object given to load_latest from the state's extra= entry of its name; one that the state (``where``)
    does not hold is said, once (rank 0), and left as it is (a checkpoint saved before it was added)."""
    from .group import print0

    for name, obj in objects.items():
        if extra and name in extra:
            obj.load_state_dict(extra[name])
    missing = sorted(set(objects) - set(extra or {}))
    if missing:
        print0(f"clusterddp: {where} holds no extra= entry {', '.join(missing)}: load_latest left "
               f"{'it' if len(missing) == 1 else 'them'} as given (saved before it was passed to save()?)")


def restore_values(mine: Optional[Dict[str, Any]], values: Any, where: str) -> None:
    """load_latest's per_rank= dict made this rank's values in the state (``where``), exactly; where it holds none
    (saved without them, or by another world size), left as given and said (every rank: each its own)."""
    if mine is None:
        return
    if isinstance(values, dict):
        mine.clear()
        mine.update(values)
    else:
        print(f"clusterddp: {where} holds no per_rank= values for rank {rank()} (saved without them, or by another "
              "world size): load_latest left them as given", flush=True)


def changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> List[str]:
    """The extras, of those both hold, whose states differ (by digest)."""
    before, after = plain(before), plain(after)
    return sorted(k for k in set(before) & set(after) if digest(before[k]) != digest(after[k]))


def buffered(model: Any, state: Mapping[str, Any]) -> bool:
    """The model's state holds more than its parameters (BatchNorm statistics): a tied weight, listed once by
    named_parameters() and twice by state_dict(), is no buffer."""
    return bool(set(state) - {name for name, _ in unwrap(model).named_parameters(remove_duplicate=False)})


def parameters(model: Any) -> Dict[str, Any]:
    """What DDP keeps equal on every rank (buffers are rank 0's, broadcast at each forward)."""
    return {name: p for name, p in unwrap(model).named_parameters()}
