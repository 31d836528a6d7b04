"""Inside the job: DDP in one line. Runs on compute nodes; imports torch lazily and never click or jinja2.

    from clusterddp import runtime
    env = runtime.init()                 # process group from torchrun / srun / spawn variables
    model = runtime.wrap(model)          # instead of nn.DataParallel(model)
    data = runtime.loader(dataset, batch_size=64)   # DistributedSampler; set_epoch done for you
    runtime.print0("loss", runtime.all_reduce_mean(loss))

``DistEnv.from_env(environ)`` is a pure function of the environment; every side effect lives in ``init``.
"""
from __future__ import annotations

import gc
import os
import re
import signal
import socket
import tempfile
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Dict, List, Mapping, Optional

from .errors import RuntimeEnvError
from .hostlist import HostlistError, first as first_host
from .spec import default_port

DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job. ``source`` names the launcher the values came from."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    source: str = "single"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # `with runtime.init() as env:` shuts the process group down at the end.
    def __enter__(self) -> "DistEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        shutdown()

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, allow_single: bool = False) -> "DistEnv":
        """Read the rank layout from torchrun, the spawn launcher or srun (task variables).

        Raises RuntimeEnvError naming the variables seen when they are missing or contradict each other. A
        one-process run (rank 0 of 1) only with ``allow_single=True``, never as a silent fallback.
        """
        env = dict(os.environ if environ is None else environ)
        # The spawn launcher runs inside an srun step too (one task per node): its explicit marker goes first.
        for reader in (_from_torchrun, _from_spawn, _from_srun):
            found = reader(env)
            if found is not None:
                _check_rendered_world(found, env)
                return found
        if "SLURM_PROCID" in env and "SLURM_STEP_ID" not in env and not allow_single:
            raise RuntimeEnvError(
                f"running in the batch script of Slurm job {env.get('SLURM_JOB_ID', '?')} without srun: "
                f"SLURM_NTASKS={env.get('SLURM_NTASKS', '?')} ranks were requested but only this process runs; "
                "launch through srun or torchrun (clusterddp submit does), or pass allow_single=True")
        if allow_single:
            return cls(0, 0, 1, 1, 0, 1, env.get("MASTER_ADDR", "127.0.0.1"),
                       _int(env, "MASTER_PORT") if "MASTER_PORT" in env else 0, "single")
        raise RuntimeEnvError(
            "no distributed environment found: none of RANK/WORLD_SIZE (torchrun), SLURM_PROCID with "
            "SLURM_STEP_ID (srun) or CLUSTERDDP_LAUNCHER=spawn with LOCAL_RANK is set; start this script with "
            "clusterddp submit (or --local), torchrun or srun, or pass allow_single=True for one process")


def _int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    try:
        return int(str(value))
    except ValueError:
        raise RuntimeEnvError(f"{name}={value!r} is not an integer") from None


def _seen(env: Mapping[str, str], names: List[str]) -> str:
    return ", ".join(f"{n}={env[n]}" for n in names if n in env)


def _from_torchrun(env: Mapping[str, str]) -> Optional[DistEnv]:
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
             "MASTER_PORT"]
    missing = [n for n in ("LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if n not in env]
    if missing:
        raise RuntimeEnvError(f"RANK and WORLD_SIZE are set but {', '.join(missing)} not ({_seen(env, names)}): "
                              "a launcher set only part of the torch.distributed variables")
    rank, world, local = _int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK")
    local_world = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
    if not (0 <= rank < world and 0 <= local < local_world <= world):
        raise RuntimeEnvError(f"inconsistent ranks ({_seen(env, names)}): need 0 <= RANK < WORLD_SIZE and "
                              "0 <= LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE")
    if world % local_world:
        raise RuntimeEnvError(f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world} "
                              f"({_seen(env, names)}): nodes run different numbers of ranks")
    node = _int(env, "GROUP_RANK") if "GROUP_RANK" in env else (
        _int(env, "NODE_RANK") if "NODE_RANK" in env else rank // local_world)
    source = "torchrun" if "TORCHELASTIC_RUN_ID" in env else env.get("CLUSTERDDP_LAUNCHER", "env")
    return DistEnv(rank, local, world, local_world, node, world // local_world, env["MASTER_ADDR"],
                   _int(env, "MASTER_PORT"), source)


def _tasks_per_node(text: str) -> List[int]:
    """Slurm's compact tasks-per-node form: ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: List[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise RuntimeEnvError(f"cannot read SLURM tasks per node {text!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _from_srun(env: Mapping[str, str]) -> Optional[DistEnv]:
    # SLURM_PROCID is also set in the batch shell; only a job step (srun) has SLURM_STEP_ID.
    if "SLURM_PROCID" not in env or "SLURM_STEP_ID" not in env:
        return None
    names = ["SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS",
             "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NODELIST",
             "SLURM_JOB_NODELIST", "SLURM_JOB_ID"]
    need = ["SLURM_LOCALID", "SLURM_NODEID"]
    missing = [n for n in need if n not in env]
    if missing:
        raise RuntimeEnvError(f"srun task variables incomplete, missing {', '.join(missing)} ({_seen(env, names)})")
    ntasks_name = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    nnodes_name = "SLURM_STEP_NUM_NODES" if "SLURM_STEP_NUM_NODES" in env else "SLURM_JOB_NUM_NODES"
    if ntasks_name not in env or nnodes_name not in env:
        raise RuntimeEnvError(f"srun task variables incomplete: need SLURM_NTASKS and SLURM_JOB_NUM_NODES "
                              f"({_seen(env, names)})")
    rank, local, node = _int(env, "SLURM_PROCID"), _int(env, "SLURM_LOCALID"), _int(env, "SLURM_NODEID")
    world, nodes = _int(env, ntasks_name), _int(env, nnodes_name)
    if world % nodes:
        raise RuntimeEnvError(f"{ntasks_name}={world} is not a multiple of {nnodes_name}={nodes} "
                              f"({_seen(env, names)}): likely --ntasks-per-node does not match the GPUs per node")
    per_node_name = "SLURM_STEP_TASKS_PER_NODE" if "SLURM_STEP_TASKS_PER_NODE" in env else "SLURM_TASKS_PER_NODE"
    local_world = world // nodes
    if per_node_name in env:
        counts = _tasks_per_node(env[per_node_name])
        if len(set(counts)) > 1:
            raise RuntimeEnvError(f"{per_node_name}={env[per_node_name]}: nodes run different numbers of tasks; "
                                  "DDP needs the same number per node (use --ntasks-per-node)")
    if not (0 <= rank < world and 0 <= local < local_world and 0 <= node < nodes):
        raise RuntimeEnvError(f"inconsistent srun variables ({_seen(env, names)})")
    if "MASTER_ADDR" in env:
        addr = env["MASTER_ADDR"]
    else:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise RuntimeEnvError(f"no MASTER_ADDR and no SLURM_JOB_NODELIST to take it from ({_seen(env, names)})")
        try:
            addr = first_host(nodelist)  # never `scontrol` through a shell (CVE-2024-27763)
        except HostlistError as exc:
            raise RuntimeEnvError(f"cannot take MASTER_ADDR from the node list: {exc}") from None
    if "MASTER_PORT" in env:
        port = _int(env, "MASTER_PORT")
    elif "SLURM_JOB_ID" in env:
        port = default_port(_int(env, "SLURM_JOB_ID"))
    else:
        raise RuntimeEnvError(f"no MASTER_PORT and no SLURM_JOB_ID to derive it from ({_seen(env, names)})")
    return DistEnv(rank, local, world, local_world, node, nodes, addr, port, "srun")


def _from_spawn(env: Mapping[str, str]) -> Optional[DistEnv]:
    if env.get("CLUSTERDDP_LAUNCHER") != "spawn" or "LOCAL_RANK" not in env:
        return None
    names = ["LOCAL_RANK", "NODE_RANK", "CLUSTERDDP_NNODES", "CLUSTERDDP_PROCS_PER_NODE", "MASTER_ADDR", "MASTER_PORT"]
    missing = [n for n in names if n not in env]
    if missing:
        raise RuntimeEnvError(f"spawn launcher variables incomplete, missing {', '.join(missing)} ({_seen(env, names)})")
    local, node = _int(env, "LOCAL_RANK"), _int(env, "NODE_RANK")
    per_node, nodes = _int(env, "CLUSTERDDP_PROCS_PER_NODE"), _int(env, "CLUSTERDDP_NNODES")
    if not (0 <= local < per_node and 0 <= node < nodes):
        raise RuntimeEnvError(f"inconsistent spawn variables ({_seen(env, names)})")
    return DistEnv(node * per_node + local, local, nodes * per_node, per_node, node, nodes, env["MASTER_ADDR"],
                   _int(env, "MASTER_PORT"), "spawn")


def _check_rendered_world(found: DistEnv, env: Mapping[str, str]) -> None:
    """The world size the job was rendered for (CLUSTERDDP_WORLD_SIZE) must match what the launcher started."""
    if "CLUSTERDDP_WORLD_SIZE" in env and _int(env, "CLUSTERDDP_WORLD_SIZE") != found.world_size:
        raise RuntimeEnvError(
            f"the job was rendered for CLUSTERDDP_WORLD_SIZE={env['CLUSTERDDP_WORLD_SIZE']} ranks "
            f"(nodes x GPUs per node) but the {found.source} launcher started {found.world_size} "
            f"({found.num_nodes} node(s) x {found.local_world_size}): likely ntasks-per-node does not match GPUs")


# --- side effects: one process group per process -------------------------------------------------------------
_STATE: Dict[str, Any] = {}
_WRAPPED: "weakref.WeakSet[Any]" = weakref.WeakSet()  # DDP modules made by wrap(), for shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def init(backend: Optional[str] = None, timeout: Optional[float] = None, allow_single: bool = False,
         environ: Optional[Mapping[str, str]] = None) -> DistEnv:
    """Initialise the process group from the launcher's variables; returns the DistEnv.

    NCCL when CUDA is available, else gloo. ``timeout`` (seconds, default $CLUSTERDDP_TIMEOUT or 300) bounds the
    rendezvous and collectives: a missing rank fails the job instead of hanging it until the time limit.
    """
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return _STATE["env"]
    env = DistEnv.from_env(environ, allow_single=allow_single)
    seconds = timeout if timeout is not None else float(os.environ.get("CLUSTERDDP_TIMEOUT", DEFAULT_TIMEOUT_S))
    device = select_device(env)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if env.source == "single" and env.master_port == 0:
        env = DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", _free_port(), "single")
    if env.source == "torchrun":
        # torchrun's workers share the agent's store (TORCHELASTIC_USE_AGENT_STORE): env:// knows how to join it.
        init_method = "env://"
    else:
        init_method = f"tcp://{env.master_addr}:{env.master_port}"
    dist.init_process_group(backend=backend, init_method=init_method, rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(seconds=seconds))
    _STATE.update(env=env, device=device, backend=backend)
    _install_stop_handlers()
    if device.type == "cpu" and "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
    return env


def shutdown() -> None:
    """Destroy the process group (idempotent)."""
    import torch.distributed as dist

    # A DDP reducer that outlives its process group can abort the process at exit ("terminate called without
    # an active exception", seen with gloo under mp.spawn): release the reducers of wrapped models first.
    for model in list(_WRAPPED):
        if getattr(model, "reducer", None) is not None:
            model.reducer = None
    _WRAPPED.clear()
    gc.collect()  # reference cycles (autograd hooks) holding reducer state go now, not at interpreter exit
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _STATE.clear()


def _env() -> DistEnv:
    if "env" not in _STATE:
        raise RuntimeEnvError("clusterddp.runtime.init() has not been called in this process")
    return _STATE["env"]


def device() -> Any:
    _env()
    return _STATE["device"]


def rank() -> int:
    return _STATE["env"].rank if "env" in _STATE else 0


def world_size() -> int:
    return _STATE["env"].world_size if "env" in _STATE else 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        if _STATE.get("backend") == "nccl":
            dist.barrier(device_ids=[_STATE["device"].index])
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
    """Mean over ranks of a tensor or a number (returns the same kind). For metrics, not gradients."""
    import torch
    import torch.distributed as dist

    is_tensor = isinstance(value, torch.Tensor)
    t = value.detach().clone() if is_tensor else torch.tensor(float(value), dtype=torch.float64)
    if dist.is_initialized() and world_size() > 1:
        target = _STATE["device"] if _STATE.get("backend") == "nccl" else torch.device("cpu")
        moved = t.to(target)
        dist.all_reduce(moved, op=dist.ReduceOp.SUM)
        t = (moved / world_size()).to(t.device)
    return t if is_tensor else float(t.item())


def wrap(model: Any, **ddp_kwargs: Any) -> Any:
    """Move ``model`` to this rank's device and wrap it in DistributedDataParallel (extra kwargs go to DDP)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = device()
    model = model.to(dev)
    if dev.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [dev.index])
        ddp_kwargs.setdefault("output_device", dev.index)
    wrapped = DDP(model, **ddp_kwargs)
    _WRAPPED.add(wrapped)
    return wrapped


def unwrap(model: Any) -> Any:
    """The plain module inside a DDP wrapper (for saving state dicts without the 'module.' prefix)."""
    return getattr(model, "module", model)


def loader(dataset: Any, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
           **kwargs: Any) -> Any:
    """A DataLoader over this rank's share of ``dataset`` (DistributedSampler); each new iteration advances the
    sampler's epoch, so shuffling differs per epoch without calling set_epoch. ``batch_size`` is per rank.

    It remembers where it is (``state_dict()``: epoch and batches done), so a Checkpointer can resume mid-epoch
    at the exact batch.
    """
    import itertools

    from torch.utils.data import DataLoader, DistributedSampler

    class ResumableSampler(DistributedSampler):
        skip = 0  # indices to drop at the start of the next epoch (resuming mid-epoch)

        def __iter__(self):  # type: ignore[override]
            skip, self.skip = self.skip, 0
            return itertools.islice(super().__iter__(), skip, None)

    class EpochLoader(DataLoader):
        """DataLoader whose every ``iter()`` starts the next epoch of its DistributedSampler."""

        next_epoch = 0
        epoch = -1
        batches_done = 0
        _skip_batches = 0
        _active = False  # inside an epoch's iteration (a `break` out of the loop ends it)

        def set_epoch(self, epoch: int) -> None:
            """Start the next iteration at ``epoch``."""
            self.next_epoch = epoch

        def __iter__(self):  # type: ignore[override]
            self.epoch, self.next_epoch = self.next_epoch, self.next_epoch + 1
            self.sampler.set_epoch(self.epoch)
            if own_generator:
                # Each iter() draws a worker base seed; from a generator of its own, seeded per epoch, that draw
                # neither moves the global RNG nor depends on where a resumed run started.
                self.generator.manual_seed(seed * 1_000_003 + self.epoch)
            self.sampler.skip = self._skip_batches * self.batch_size
            self.batches_done, self._skip_batches = self._skip_batches, 0
            self._active = True
            try:
                for batch in super().__iter__():
                    self.batches_done += 1  # counted when handed out: a checkpoint after the step includes it
                    yield batch
            finally:
                self._active = False

        def state_dict(self) -> Dict[str, int]:
            """Where to resume: mid-epoch while an epoch is being iterated, else at the next epoch."""
            if self._active and self.batches_done < len(self):
                return {"epoch": self.epoch, "batches_done": self.batches_done}
            return {"epoch": self.next_epoch, "batches_done": 0}

        def load_state_dict(self, state: Mapping[str, int]) -> None:
            self.next_epoch, self._skip_batches = int(state["epoch"]), int(state["batches_done"])

    import torch

    own_generator = "generator" not in kwargs
    if own_generator:
        kwargs["generator"] = torch.Generator()
    sampler = ResumableSampler(dataset, num_replicas=world_size(), rank=rank(), shuffle=shuffle, seed=seed,
                               drop_last=drop_last)
    return EpochLoader(dataset, batch_size=batch_size, sampler=sampler, **kwargs)


def save_on_main(obj: Any, path: str) -> None:
    """torch.save on rank 0, atomically (temp file in the same directory, then rename); all ranks wait for it."""
    import torch

    if is_main():
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as fh:
                torch.save(obj, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    barrier()


# --- stopping early: time limits and preemption ------------------------------------------------------------
_STOP: Dict[str, Any] = {"signal": None, "polled": False}


def _install_stop_handlers() -> None:
    """SIGUSR2 and SIGTERM ask the job to stop at the next should_stop(). A script that never calls should_stop()
    keeps the default meaning of those signals."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGUSR2, signal.SIGTERM):
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            if not _STOP["polled"]:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            _STOP["signal"] = signum

        signal.signal(sig, handler)


def should_stop() -> bool:
    """True on every rank at the same call once a stop was requested (the time-limit warning, SIGUSR2, SIGTERM,
    or the job's stop file): checkpoint and return. The ranks agree collectively, so none runs ahead."""
    _STOP["polled"] = True
    stop_file = os.environ.get("CLUSTERDDP_STOP_FILE")
    local = _STOP["signal"] is not None or bool(stop_file and os.path.exists(stop_file))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and world_size() > 1:
        import torch

        flag = torch.tensor([1 if local else 0], dtype=torch.int32)
        if _STATE.get("backend") == "nccl":
            flag = flag.to(_STATE["device"])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
    return local


def _rng_state() -> Dict[str, Any]:
    import random

    import torch

    state: Dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    import random

    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])


class Checkpointer:
    """Checkpoints that make an interrupted job continue exactly where it stopped.

        ckpt = runtime.Checkpointer(os.path.join(os.environ.get("CLUSTERDDP_RUN_DIR", "."), "checkpoints"))
        state = ckpt.load_latest(model, optimizer, loader)     # None on a fresh start; every rank loads the same
        ...
        if runtime.should_stop():
            ckpt.save(step, model, optimizer, loader); return

    ``save`` is collective: rank 0 writes model, optimizer, the loader's position and every rank's RNG states
    atomically (temp file + rename) and keeps the last ``keep`` checkpoints.
    """

    def __init__(self, directory: str, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory, self.keep = directory, keep

    def _paths(self) -> List[str]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        steps = sorted((int(m.group(1)), n) for n in names if (m := re.fullmatch(r"ckpt-(\d+)\.pt", n)))
        return [os.path.join(self.directory, n) for _, n in steps]

    def save(self, step: int, model: Any, optimizer: Any = None, loader: Any = None, **extra: Any) -> str:
        import torch.distributed as dist

        states: List[Any] = [_rng_state()]
        if dist.is_available() and dist.is_initialized() and world_size() > 1:
            states = [None] * world_size()
            dist.all_gather_object(states, _rng_state())
        path = os.path.join(self.directory, f"ckpt-{int(step):010d}.pt")
        payload = {"step": int(step), "model": unwrap(model).state_dict(),
                   "optimizer": optimizer.state_dict() if optimizer is not None else None,
                   "loader": loader.state_dict() if loader is not None else None,
                   "rng": states, "world_size": world_size(), "extra": extra}
        save_on_main(payload, path)  # atomic, then a barrier
        if is_main():
            for old in self._paths()[:-self.keep]:
                os.unlink(old)
        return path

    def latest(self) -> Optional[str]:
        """The newest checkpoint's path, as rank 0 sees it (every rank gets the same answer)."""
        import torch.distributed as dist

        found = [self._paths()[-1] if self._paths() else None]
        if dist.is_available() and dist.is_initialized() and world_size() > 1:
            dist.broadcast_object_list(found, src=0)
        return found[0]

    def load_latest(self, model: Any = None, optimizer: Any = None, loader: Any = None) -> Optional[Dict[str, Any]]:
        """Restore the newest checkpoint into the given objects; returns it (step, extra, ...) or None."""
        import torch

        path = self.latest()
        if path is None:
            return None
        payload = torch.load(path, map_location="cpu", weights_only=False)
        if model is not None:
            unwrap(model).load_state_dict(payload["model"])
        if optimizer is not None and payload["optimizer"] is not None:
            optimizer.load_state_dict(payload["optimizer"])
        if loader is not None and payload["loader"] is not None:
            loader.load_state_dict(payload["loader"])
        if payload["world_size"] == world_size():
            _set_rng_state(payload["rng"][rank()])
        else:
            print0(f"clusterddp: checkpoint {path} was written by {payload['world_size']} ranks, this job has "
                   f"{world_size()}: random number states not restored (results will differ from an "
                   "uninterrupted run)")
        payload["path"] = path
        return payload


def spawn(fn: Any, nprocs: Optional[int] = None, args: tuple = ()) -> None:
    """torch.multiprocessing.spawn for the spawn launcher: sets LOCAL_RANK in each worker so that ``init()``
    finds its rank, then calls ``fn(local_rank, *args)``."""
    import torch.multiprocessing as mp

    n = nprocs or int(os.environ.get("CLUSTERDDP_PROCS_PER_NODE", "1"))
    mp.spawn(_spawned, nprocs=n, args=(fn, args))


def _spawned(local_rank: int, fn: Any, args: tuple) -> None:
    os.environ["LOCAL_RANK"] = str(local_rank)
    fn(local_rank, *args)


__all__ = ["DistEnv", "init", "shutdown", "wrap", "unwrap", "loader", "is_main", "print0", "log", "barrier",
           "all_reduce_mean", "save_on_main", "device", "rank", "world_size", "select_device", "spawn",
           "should_stop", "Checkpointer"]
