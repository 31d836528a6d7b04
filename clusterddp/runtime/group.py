"""The process group of this process: init, shutdown, collectives, wrap (the state it keeps: state.py)."""
from __future__ import annotations

import gc
import os
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Dict, Mapping, Optional

from .. import contract
from ..errors import RuntimeEnvError
from . import commtime, drill, report, rundir, telemetry
from .ckptfile import atomic
from .control import heartbeat
from .env import DistEnv
from .rendezvous import await_store, free_port
from .state import STATE, channel, device, distributed, is_main, rank, world_size

__all__ = ["init", "shutdown", "wrap", "unwrap", "barrier", "device", "channel", "rank", "world_size", "is_main",
           "distributed", "all_reduce_mean", "print0", "save_on_main", "Joined", "ddp_arguments"]

DEFAULT_TIMEOUT_S = 300.0
#: torch's NCCL collective timeout (kProcessGroupNCCLDefaultTimeout): long stalls get it with the watchdog off.
TORCH_NCCL_DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Joined(DistEnv):
    """The DistEnv that ``init()`` returns: ``with runtime.init() as env:`` shuts the group down at the end."""

    def __enter__(self) -> "Joined":
        return self

    def __exit__(self, *exc: object) -> None:
        shutdown()


def select_device(env: DistEnv) -> Any:
    """The CUDA device for this rank, or CPU. Handles Slurm narrowing CUDA_VISIBLE_DEVICES per task."""
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 1:
        index = 0  # --gpus-per-task (or one GPU per node): every task sees its own GPU as device 0
    elif env.local_rank < count:
        index = env.local_rank
    else:
        raise RuntimeEnvError(f"local rank {env.local_rank} has no GPU: this task sees {count} GPUs "
                              f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}) for "
                              f"{env.local_world_size} ranks per node")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _job_device(env: DistEnv, environ: Mapping[str, str]) -> Any:
    """A job that asked for no GPUs (CLUSTERDDP_GPUS_PER_NODE=0) trains on the CPU with gloo, CUDA untouched, even
    on a GPU node whose GPUs Slurm did not mask (ConstrainDevices=no): they are another job's. A job that asked for
    GPUs where torch sees none is told so once (a CPU build of torch, a driver too old), then runs on the CPU."""
    import torch

    asked = environ.get(contract.GPUS_PER_NODE, "")
    if asked == "0":
        return torch.device("cpu")
    device = select_device(env)
    if device.type == "cpu" and asked.isdigit() and int(asked) > 0 and env.rank == 0 \
            and not environ.get(contract.LOCAL):
        print(f"clusterddp: this job asked for {asked} GPU(s) per node, but torch sees no usable CUDA device "
              f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}): training on the CPU with gloo",
              flush=True)
    return device


def init(backend: Optional[str] = None, timeout: Optional[float] = None, allow_single: bool = False,
         environ: Optional[Mapping[str, str]] = None) -> Joined:
    """Initialise the process group from the launcher's variables; returns the DistEnv.

    NCCL when CUDA is available, else gloo. ``timeout`` (seconds, default $CLUSTERDDP_TIMEOUT or 300) bounds the
    rendezvous: when a rank never arrives, the ranks that did name it (rank and node) and the job ends with exit
    code 78. Collectives are bounded by the hang watchdog ($CLUSTERDDP_HANG_TIMEOUT, default 900 s; 0 = off),
    which names the rank that stopped advancing and ends the job with exit code 79; they get torch's own timeout
    two minutes later (or ``timeout`` with the watchdog off). Beside the training group, a gloo group on the CPU
    carries the control traffic (``should_stop()``), so it never synchronises the GPU."""
    import torch
    import torch.distributed as dist

    from . import stop
    from .control import Control

    if dist.is_available() and dist.is_initialized() and "env" in STATE:
        return STATE["env"]
    environ = os.environ if environ is None else environ
    env = DistEnv.from_env(environ, allow_single=allow_single)
    seconds = timeout if timeout is not None else _seconds(environ.get(contract.TIMEOUT), DEFAULT_TIMEOUT_S)
    control = Control(env, rundir.hold(environ.get(contract.RUN_DIR)), seconds, environ)
    torch_seconds = collective_timeout(seconds, control.hang_timeout)
    device = _job_device(env, environ)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if env.source == "single" and env.master_port == 0:
        env = DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", free_port(), "single")
    # torchrun's workers share the agent's store (TORCHELASTIC_USE_AGENT_STORE): env:// knows how to join it.
    init_method = "env://" if env.source == "torchrun" else f"tcp://{env.master_addr}:{env.master_port}"
    if dist.is_available() and dist.is_initialized():
        raise RuntimeEnvError("a process group is already initialised in this process (torch.distributed."
                              "init_process_group?): call clusterddp.runtime.init() instead of it, not after it")
    control.start()
    try:
        if init_method.startswith("tcp://") and env.rank != 0:  # (torchrun's workers: the agent's store is up)
            await_store(env.master_addr, env.master_port, seconds)
        dist.init_process_group(backend=backend, init_method=init_method, rank=env.rank,
                                world_size=env.world_size, timeout=timedelta(seconds=torch_seconds + 30))
        # The control channel: stop agreement on the CPU, never on the training device's stream.
        channel = dist.new_group(backend="gloo", timeout=timedelta(seconds=torch_seconds))
    except Exception as exc:
        control.stop()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        from .control import rendezvous_report

        raise RuntimeEnvError(f"{rendezvous_report(env, control.run_dir, time.monotonic() - control.started, environ)}"
                              f" ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc
    control.joined(dist.distributed_c10d._get_default_store())
    telemetry.start(env.rank, env.world_size, env.local_world_size, control.restart, control.run_dir, environ)
    report.export_run_id()
    joined = Joined(**{f: getattr(env, f) for f in env.__dataclass_fields__})
    STATE.update(env=joined, device=device, backend=backend, wrapped=weakref.WeakSet(), control=control,
                  channel=channel)
    stop.install()
    from .checkmode import count_steps
    count_steps()  # (migrate --check only)
    if device.type == "cpu" and "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
    return joined


def shutdown() -> None:
    """Destroy the process group and forget every piece of runtime state (idempotent)."""
    import torch.distributed as dist

    from . import stop, writer

    failed = None
    if "writer" in STATE:  # background checkpoints were saved: the last one is written before the group goes
        try:
            writer.settle(peers_may_be_gone=True)
        except RuntimeEnvError as exc:  # raised once everything below is released
            failed = exc
    if "wrapped" in STATE:  # migrate --check: were the ranks' models kept in step?
        from .checkmode import check_models
        check_models(STATE["wrapped"], rank())
    # A DDP reducer that outlives its process group can abort the process at exit ("terminate called without
    # an active exception", seen with gloo under mp.spawn): release the reducers of wrapped models first.
    for model in list(STATE.get("wrapped", ())):
        if getattr(model, "reducer", None) is not None:
            model.reducer = None
    gc.collect()  # reference cycles (autograd hooks) holding reducer state go now, not at interpreter exit
    stop.uninstall()
    if "control" in STATE:
        STATE["control"].stop()
    telemetry.stop()  # (after the control thread, which writes the files too)
    report.close_boards()  # (TensorBoard's metrics the control thread had not written yet: telemetry off too)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    STATE.clear()
    if failed is not None:
        raise failed


def collective_timeout(rendezvous_s: float, hang_s: float) -> float:
    """torch's own timeout for collectives and the store: 2 min after the watchdog's longest limit (start-up included),
    so users see the report naming the stuck rank, never torch's abort; watchdog off: NCCL's 10 min at least."""
    if hang_s > 0:
        return max(rendezvous_s, hang_s * contract.HANG_STARTUP_FACTOR + 120)
    return max(rendezvous_s, TORCH_NCCL_DEFAULT_TIMEOUT_S)


def _seconds(text: Optional[str], default: float) -> float:
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e9:
        raise RuntimeEnvError(f"{contract.TIMEOUT}={text!r}: expected seconds (the rendezvous timeout, e.g. 300)")
    return value


def barrier() -> None:
    """Wait until every rank gets here (no-op without a process group)."""
    import torch.distributed as dist
    heartbeat("setup")
    if dist.is_available() and dist.is_initialized():
        if STATE.get("backend") == "nccl":
            dist.barrier(device_ids=[STATE["device"].index])
        else:
            dist.barrier()


def print0(*args: Any, **kwargs: Any) -> None:
    """print() on rank 0 only."""
    if is_main():
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def log(*args: Any, **kwargs: Any) -> None:
    """print() on every rank, prefixed with ``[rank R/W]``."""
    kwargs.setdefault("flush", True)
    print(f"[rank {rank()}/{world_size()}]", *args, **kwargs)


def all_reduce_mean(value: Any) -> Any:
    """Mean over ranks of a tensor or a number (the same kind back), or of a dict, list or tuple of them; metrics."""
    import torch
    import torch.distributed as dist

    if isinstance(value, (dict, list, tuple)):  # a metrics dict: each number or tensor's mean, in its order
        pairs = value.items() if isinstance(value, dict) else enumerate(value)
        kept = {k: all_reduce_mean(v) if isinstance(v, (int, float, torch.Tensor)) else v for k, v in pairs}
        return dict(kept) if isinstance(value, dict) else type(value)(*kept.values()) if hasattr(value, "_fields") \
            else type(value)(kept.values())
    heartbeat("setup")  # (progress, but no step: it ends no start-up window)
    is_tensor = isinstance(value, torch.Tensor)
    t = value.detach().clone() if is_tensor else torch.tensor(float(value), dtype=torch.float64)
    if distributed():
        target = STATE["device"] if STATE.get("backend") == "nccl" else torch.device("cpu")
        moved = t.to(target)
        dist.all_reduce(moved, op=dist.ReduceOp.SUM)
        t = (moved / world_size()).to(t.device)
    return drill.value(t if is_tensor else float(t.item()))


def wrap(model: Any, **ddp_kwargs: Any) -> Any:
    """Move ``model`` to this rank's device and wrap it in DistributedDataParallel (extra kwargs go to DDP)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = device()
    sparse_on_nccl(STATE.get("backend"), model)
    model = model.to(dev)
    if not any(p.requires_grad for p in model.parameters()):  # (DDP refuses it: nothing of it to average)
        print0(f"clusterddp: runtime.wrap: {type(model).__name__} has no parameter that trains: not wrapped in DDP")
        return model
    ddp_kwargs = ddp_arguments(dev, ddp_kwargs)
    wrapped = DDP(model, **ddp_kwargs)
    STATE["wrapped"].add(wrapped)
    wrapped.register_forward_pre_hook(_beat_hook)  # every forward pass is progress for the hang watchdog
    commtime.attach(wrapped)
    if ddp_kwargs.get("find_unused_parameters") or ddp_kwargs.get("static_graph"):
        return wrapped
    if any(_sparse_gradient(m) for m in wrapped.module.modules()):
        # A zero backward would give these parameters dense gradients, which DDP's reducer refuses.
        print0("clusterddp: this model has sparse gradients (nn.Embedding(sparse=True)): DDP lays out its gradient "
               "buckets after the first step, so with 3 or more ranks a resumed run can differ from an "
               "uninterrupted one in the last bits")
        return wrapped
    _fix_bucket_layout(wrapped)
    # (the zero step above already counted: DDP would refuse it with a message about the training loop)
    wrapped._set_static_graph = _static_graph_too_late  # type: ignore[method-assign]
    return wrapped


def ddp_arguments(dev: Any, given: Mapping[str, Any]) -> Dict[str, Any]:
    """DDP's keyword arguments for a model on ``dev``: the rank's own GPU unless the caller chose ``device_ids``
    (``device_ids=None``: no output_device either, since DDP refuses one without device ids; a default of the
    device index would pass on cuda:0 only, a failure on some ranks and a hang on the others)."""
    out = dict(given)
    if dev.type == "cuda" and "device_ids" not in out:
        out["device_ids"] = [dev.index]
        out.setdefault("output_device", dev.index)
    return out


def sparse_on_nccl(backend: Optional[str], model: Any) -> None:
    """Refuse a model with sparse gradients on NCCL before anything is built: NCCL cannot all-reduce sparse
    tensors, so DDP's first backward would fail on every rank (torch 2.11 on an H100: "NCCL does not support
    all_reduce with sparse tensors"; make gpu-check)."""
    if backend != "nccl":
        return
    names = [name or type(model).__name__ for name, m in model.named_modules()
             if _sparse_gradient(m) and any(p.requires_grad for p in m.parameters())]  # (frozen: never reduced)
    if names:
        raise RuntimeEnvError(f"runtime.wrap(): {', '.join(repr(n) for n in names[:3])} "
                              f"{'has' if len(names) == 1 else 'have'} sparse gradients (sparse=True), and NCCL "
                              "cannot all-reduce sparse tensors, so the first backward would fail on every rank. "
                              "Make it dense (nn.Embedding(..., sparse=False), and an optimizer such as Adam "
                              "instead of SparseAdam), or train on the CPU with gloo (--gpus 0)")


def _sparse_gradient(module: Any) -> bool:
    """DDP's own test (torch/nn/parallel/distributed.py, produces_sparse_gradient)."""
    import torch

    return isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and bool(module.sparse)


def _static_graph_too_late() -> None:
    raise RuntimeEnvError("_set_static_graph() after runtime.wrap(): wrap lays out DDP's buckets with a first "
                          "(zero) step, after which DDP refuses it; use runtime.wrap(model, static_graph=True)")


def _fix_bucket_layout(ddp: Any) -> None:
    """Lay out DDP's gradient buckets now, once, so that every step reduces in the same layout.

    Why (a resumed run was not bit-identical at 3+ ranks): a new DDP reduces its first backward in one bucket in
    registration order, then rebuilds its buckets in the order gradients became ready. The first step after a
    resume therefore reduced a differently laid-out buffer than the same step of the uninterrupted run, and with
    3+ ranks the ring all-reduce then sums each element in another order (with 2 ranks a + b == b + a hides it).
    A backward pass of zeros here records the ready order (last-registered first, as DDP's own heuristic and a
    real backward give) and lets DDP rebuild at the first forward; no RNG, data or buffer is touched.
    """
    import torch

    params = [p for p in ddp.module.parameters() if p.requires_grad]
    if not params or not torch.is_grad_enabled():
        return
    ddp.reducer.prepare_for_forward()
    ddp.reducer.prepare_for_backward([])
    sum(p.sum() * 0.0 for p in params).backward()  # an all-reduce of zeros on every rank (wrap is collective)
    for p in params:
        p.grad = None


def _beat_hook(module: Any, args: Any) -> None:
    heartbeat("forward")
    telemetry.began()


def unwrap(model: Any) -> Any:
    """The plain module inside a DDP wrapper (for saving state dicts without the 'module.' prefix)."""
    return getattr(model, "module", model)


def save_on_main(obj: Any, path: str, wait: bool = True) -> None:
    """torch.save on rank 0, atomically (temp file in the same directory, then rename); all ranks wait for it.
    ``wait=False``: no waiting (a collective), for a save only some ranks reach (under a test of their own values)."""
    if is_main():
        atomic_save(obj, path)
    if wait:
        barrier()


def atomic_save(obj: Any, path: str) -> None:
    """torch.save to a temp file in the same directory, fsync, rename: a reader sees the old file or the new one."""
    import torch

    atomic(rundir.at(path), lambda fh: torch.save(obj, fh))
