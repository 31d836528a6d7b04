"""What a checkpoint holds besides the model: every rank's random number states as plain data (exact, and loadable
with weights_only=True), a CPU copy of the state that a background write keeps, and the payload's shape check."""
from __future__ import annotations

import base64
from typing import Any, Dict, Mapping

from ..errors import RuntimeEnvError
from . import telemetry
from .group import print0, unwrap
from .state import rank, world_size


def rng_state() -> Dict[str, Any]:
    """This rank's random number states as JSON-able data (exact: ints, byte strings as base64, repr floats)."""
    import random

    import torch

    version, internal, gauss = random.getstate()
    state: Dict[str, Any] = {"python": [version, list(internal), gauss], "torch": b64(torch.get_rng_state())}
    dev = rank_device()
    if dev is not None:
        # This rank's own GPU only: the visible GPUs differ between layouts (gpus-per-task shows one, gpus-per-node
        # all of the node's), so a list restored by position would miss or cross devices on resume.
        state["cuda"] = b64(torch.cuda.get_rng_state(dev))
    numpy = numpy_module()
    if numpy is not None:
        name, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    return state


def rank_device() -> Any:
    """This rank's CUDA device, or None (CPU ranks, or no process group yet)."""
    from .group import device

    try:
        dev = device()
    except RuntimeEnvError:
        return None
    return dev if dev.type == "cuda" else None


def b64(tensor: Any) -> str:
    return base64.b64encode(bytes(tensor.tolist())).decode()


def numpy_module() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def saved_rng(state: Mapping[str, Any]) -> Dict[str, Any]:
    """The gathered JSON form as the checkpoint keeps it: tuples, ints, floats, strings and uint8 tensors."""
    import torch

    def tensor(text: str) -> Any:
        return torch.tensor(list(base64.b64decode(text)), dtype=torch.uint8)

    out: Dict[str, Any] = {"python": (state["python"][0], tuple(state["python"][1]), state["python"][2]),
                           "torch": tensor(state["torch"])}
    if "cuda" in state:
        out["cuda"] = tensor(state["cuda"])
    if "numpy" in state:
        out["numpy"] = tuple(state["numpy"])
    return out


def cpu_copy(obj: Any, old: Any = None) -> Any:
    """``obj`` with every tensor copied to CPU memory of its own (state dicts alias the live parameters and the
    optimizer's buffers, which the next step changes in place). ``old``: the previous copy, whose write is done:
    its tensors of the same shape and type are written over instead of allocated again (fresh memory costs page
    faults on every save)."""
    import torch

    if isinstance(obj, torch.Tensor):
        if (isinstance(old, torch.Tensor) and old.shape == obj.shape and old.dtype == obj.dtype
                and old.device.type == "cpu" and not old.is_sparse and not obj.is_sparse and obj.is_contiguous()):
            return old.copy_(obj.detach())
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        kept = old if isinstance(old, dict) else {}
        return obj.__class__((k, cpu_copy(v, kept.get(k))) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        items = old if isinstance(old, (list, tuple)) and len(old) == len(obj) else [None] * len(obj)
        return obj.__class__(cpu_copy(v, b) for v, b in zip(obj, items))
    return obj


def set_rng_state(state: Mapping[str, Any]) -> None:
    import random

    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    dev = rank_device()
    if "cuda" in state and dev is not None:
        if isinstance(state["cuda"], (list, tuple)):  # written before clusterddp kept one state per rank
            print0("clusterddp: this checkpoint keeps the CUDA random states of every visible GPU by position, not "
                   "of each rank's own: CUDA random states not restored")
        else:
            torch.cuda.set_rng_state(state["cuda"], dev)
    numpy = numpy_module() if "numpy" in state else None
    if numpy is not None:
        name, keys, *rest = state["numpy"]
        numpy.random.set_state((name, numpy.asarray(keys, dtype=numpy.uint32), *rest))


def check_payload(payload: Any) -> None:
    """What save writes is there (a file that unpickles to something else is damaged, for load_latest)."""
    missing = [k for k in ("step", "model", "optimizer", "loader", "rng", "world_size") if k not in payload] \
        if isinstance(payload, dict) else ["a dict"]
    if missing:
        raise KeyError(f"not a checkpoint of Checkpointer.save: no {', '.join(missing)}")


def static_graph_note(model: Any) -> None:
    """Said at a resume (from a checkpoint or from the survivors) of a model wrapped with static_graph=True."""
    if model is not None and getattr(model, "static_graph", False) and world_size() > 2:
        print0("clusterddp: this model is wrapped with static_graph=True, so DDP lays out its gradient buckets "
               "again after this first step: with 3 or more ranks the resumed run can differ from an "
               "uninterrupted one in the last bits (runtime.wrap without static_graph resumes exactly)")


def restore(payload: Dict[str, Any], path: str, model: Any, optimizer: Any, loader: Any) -> None:
    """The payload into the given objects, the random states and the step count."""
    if model is not None:
        unwrap(model).load_state_dict(payload["model"])
    if optimizer is not None and payload["optimizer"] is not None:
        optimizer.load_state_dict(payload["optimizer"])
    if loader is not None and payload["loader"] is not None:
        loader.load_state_dict(payload["loader"])
    if payload["world_size"] == world_size():
        set_rng_state(payload["rng"][rank()])
    else:
        print0(f"clusterddp: checkpoint {path} was written by {payload['world_size']} ranks, this job has "
               f"{world_size()}: random number states not restored (results will differ from an "
               "uninterrupted run)")
    static_graph_note(model)
    steps = telemetry.current()
    if steps is not None:
        done = payload.get("telemetry_steps")
        steps.resumed(done if isinstance(done, int) and not isinstance(done, bool) and done >= 0 else None)
