"""The all-reduce's time in the step telemetry (telemetry.py): a DDP communication hook that runs DDP's own (or the
script's) unchanged and times how long this rank waited for the others after its backward."""
from __future__ import annotations

from typing import Any, Callable

from .. import contract
from ..errors import RuntimeEnvError
from .telemetry import clock as _now
from .telemetry import current


def timed(inner: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A DDP comm hook that runs ``inner`` unchanged and times the wait from the last bucket's launch (the rank's
    backward is done then) to its result: how long this rank waited for the others."""
    import torch

    def hook(state: Any, bucket: Any) -> Any:
        fut = inner(state, bucket)
        steps = current()
        if steps is None or not bucket.is_last():
            return fut
        if bucket.buffer().is_cuda:  # a CUDA future completes at enqueue: events on the stream tell the real wait
            begun = torch.cuda.Event(enable_timing=True)
            begun.record()

            def ended(f: Any) -> Any:
                done = torch.cuda.Event(enable_timing=True)
                done.record()
                steps.pending.append((begun, done))
                return f.value()
            return fut.then(ended)
        began = _now()

        def done(f: Any) -> Any:
            steps.add("comm", _now() - began)
            return f.value()
        return fut.then(done)

    hook.__name__ = hook.__qualname__ = f"clusterddp_timed_{getattr(inner, '__name__', 'hook')}"
    hook.__annotations__ = {}  # DDP checks them, and they are strings here (from __future__ import annotations)
    return hook


def attach(ddp: Any) -> None:
    """Time ``ddp``'s gradient all-reduce: DDP's default hook (or one the script registers before its first forward
    pass) wrapped by ``timed``, registered at the first forward pass (DDP takes one comm hook, once)."""
    if current() is None:
        return
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    original = ddp.register_comm_hook
    taken = [False]

    def register_comm_hook(state: object, hook: Callable[..., Any]) -> None:
        if taken[0]:
            raise RuntimeEnvError("register_comm_hook after the model's first forward pass: clusterddp's step "
                                  "telemetry registered its timed all-reduce then (DDP takes one hook); register "
                                  "yours before the first forward pass (it is then timed), or set "
                                  f"{contract.TELEMETRY}=0")
        ddp._check_comm_hook(hook)
        taken[0] = True
        original(state, timed(hook))

    def first_forward(module: Any, args: Any) -> None:
        if not taken[0]:
            taken[0] = True
            original(ddp.process_group, timed(allreduce_hook))
        handle.remove()

    ddp.register_comm_hook = register_comm_hook
    handle = ddp.register_forward_pre_hook(first_forward)
