"""The Python API: submit DDP jobs from Python through submitit, from the same JobSpec.

    import clusterddp
    spec = clusterddp.JobSpec(nodes=2, gpus_per_node=8, time="02:00:00", partition="gpu")
    job = clusterddp.submit_function(train, spec, cfg)   # train(cfg) runs on every rank
    print(job.job_id, job.result())                      # rank 0's return value

Every rank is one Slurm task (the srun layout); inside it ``clusterddp.runtime.init()`` finds its rank, and
MASTER_ADDR/MASTER_PORT are chosen in the batch shell exactly as the sbatch templates do. Without Slurm
(``backend="local"``, or "auto" with no sbatch on PATH) submitit's local executor runs the same rank layout here.
submitit is imported only here, and only when a job is submitted.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from . import contract
from .errors import ClusterDDPError, JobFailed, SlurmError, SpecError
from .job import sbatch_options
from .job.quoting import shell_quote, shown
from .job.spec import JobSpec

BACKENDS = ("auto", "slurm", "local")


def executor_params(spec: JobSpec) -> Dict[str, Any]:
    """JobSpec -> submitit SlurmExecutor parameters (pure). One Slurm task per rank.

    Fields that have no meaning for a function job (script, args, launcher spawn, template) are refused, not
    ignored.
    """
    if spec.script or spec.args or spec.module:
        raise SpecError("submit_function runs a Python function: leave script/args/module empty "
                        "(use submit_script for a script)")
    if spec.launcher == "spawn":
        raise SpecError("the spawn launcher starts its own processes; submitit jobs run one task per rank: "
                        "use launcher='srun' (or leave the default)")
    if spec.template is not None:
        raise SpecError("templates do not apply to submitit jobs (submitit writes its own sbatch script)")
    if spec.requeue:
        raise SpecError("requeue=True is the sbatch templates' mechanism; submitit jobs checkpoint and requeue "
                        "through submitit's own checkpoint() protocol: leave requeue unset")
    params: Dict[str, Any] = {
        "job_name": spec.job_name, "nodes": spec.nodes, "ntasks_per_node": spec.tasks_per_node,
        "stderr_to_stdout": True, "signal_delay_s": spec.signal_seconds,
        # A rank that raises ends the step instead of leaving the others waiting for it.
        "srun_args": ["--kill-on-bad-exit=1"] + ([f"--cpus-per-task={spec.cpus_per_task}"]
                                                 if spec.cpus_per_task else []),
    }
    if spec.gpus_per_node:
        if spec.gpu_request == "gres":
            params["gres"] = f"gpu:{spec.gpus_per_node}"
        elif spec.gpu_request == "gpus-per-task":
            params["gpus_per_task"] = 1
        else:
            params["gpus_per_node"] = spec.gpus_per_node
    if spec.cpus_per_task:
        params["cpus_per_task"] = spec.cpus_per_task
    if spec.time is not None:
        seconds = spec.time_seconds
        if not seconds:
            raise SpecError("time=UNLIMITED cannot be expressed through submitit (it needs minutes): give a limit")
        params["time"] = math.ceil(seconds / 60)
    for name in ("mem", "partition", "account", "qos", "constraint"):
        value = getattr(spec, name)
        if value is not None:
            params[name] = value
    if spec.exclusive:
        params["exclusive"] = True
    if spec.exclude:
        params["exclude"] = ",".join(spec.exclude)
    # --ignore-pbs: sbatch would read #PBS/#BSUB lines near the top of submitit's script as options.
    extra: Dict[str, Any] = {"ignore_pbs": True}
    for arg in spec.sbatch_args:
        name, value = sbatch_options.resolve(arg)
        extra[name.replace("-", "_")] = True if value is None else value
    params["additional_parameters"] = extra
    # submitit writes #SBATCH values with shell quoting, and sbatch drops a backslash even inside single quotes.
    for key, value in [*params.items(), *extra.items()]:
        if isinstance(value, str) and "\\" in value:
            raise SpecError(f"{key} {shown(value)} contains a backslash, which sbatch would drop from the #SBATCH "
                            "line submitit writes; use the clusterddp CLI (its own encoder keeps it) or drop the '\\'")
    params["setup"] = setup_lines(spec)
    return params


def setup_lines(spec: JobSpec) -> List[str]:
    """Batch-shell lines before srun: the user's setup, environment, and the templates' rendezvous block."""
    from .backends.slurm.script import render_part

    lines = ["set -eo pipefail"]  # not -u: submitit's own lines may read unset variables
    lines += [f"export {name}={shell_quote(value)}" for name, value in spec.env]
    lines += list(spec.setup)
    values = dict(spec.promised_env, **{contract.LAUNCHER: "srun"})
    lines += ["export " + " ".join(f"{name}={value}" for name, value in values.items())]
    lines += render_part(spec, "rendezvous").rstrip("\n").splitlines()
    return lines


class _OnEveryRank:
    """The callable submitit runs in every task: rank variables for clusterddp.runtime, then the user's call."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict, per_node: int, port: Optional[int]) -> None:
        self.fn, self.args, self.kwargs, self.per_node, self.port = fn, args, kwargs, per_node, port

    def __call__(self) -> Any:
        import submitit

        env = submitit.JobEnvironment()
        rank, world = env.global_rank, env.num_tasks
        local = rank % self.per_node
        values = {"RANK": rank, "LOCAL_RANK": local, "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": self.per_node,
                  "NODE_RANK": rank // self.per_node}
        os.environ.update({k: str(v) for k, v in values.items()})
        if "MASTER_ADDR" not in os.environ:  # the local executor has no batch shell to set them
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(self.port)
        return self.fn(*self.args, **self.kwargs)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:  # submitit calls this on preemption
        return None


class Job:
    """A submitted DDP job: ``job_id``, ``state``, ``result()`` (rank 0's value), ``results()`` (every rank's)."""

    def __init__(self, job: Any, spec: JobSpec, backend: str) -> None:
        self.submitit_job, self.spec, self.backend = job, spec, backend

    @property
    def job_id(self) -> str:
        return str(self.submitit_job.job_id)

    @property
    def state(self) -> str:
        if self.backend == "slurm":
            from .backends.slurm import SlurmBackend

            return SlurmBackend().info(self.job_id).state  # squeue / sacct / scontrol: without accounting too
        return str(self.submitit_job.state)

    def cancel(self) -> None:
        self.submitit_job.cancel(check=False)

    def wait(self) -> str:
        """Until the job ends; returns its final state."""
        if self.backend == "slurm":
            from .backends.slurm import SlurmBackend

            return SlurmBackend().wait(self.job_id).state
        self.submitit_job.wait()
        return str(self.submitit_job.state)

    def results(self) -> List[Any]:
        """Every rank's return value, in rank order; JobFailed with the root-cause rank's traceback."""
        final = self.wait()
        job = self.submitit_job
        failures, values = [], []
        for rank in range(self.spec.world_size):
            task = job.task(rank)
            # submitit's own waiting asks sacct, which clusters without accounting lack: only read what exists.
            if not task.paths.result_pickle.exists():
                failures.append((rank, f"rank {rank} left no result (killed, or never started); job state {final}; "
                                       f"log: {task.paths.stdout}"))
                continue
            exc = task.exception()
            if exc is not None:
                failures.append((rank, str(exc)))
            else:
                values.append(task.result())
        if failures:
            raised = [f for f in failures if "left no result" not in f[1]]
            root = next((f for f in raised if not _secondary(f[1])), (raised or failures)[0])
            others = ", ".join(str(r) for r, _ in failures if r != root[0])
            raise JobFailed(f"job {self.job_id}: rank {root[0]} failed"
                            + (f" (ranks {others} too)" if others else "") + f":\n{root[1]}")
        return values

    def result(self) -> Any:
        """Rank 0's return value (waits for the job)."""
        return self.results()[0]

    def stdout(self, rank: int = 0) -> Optional[str]:
        return self.submitit_job.task(rank).stdout()

    def __repr__(self) -> str:
        return f"clusterddp.Job({self.job_id}, backend={self.backend})"


def _secondary(text: str) -> bool:
    from .healing.logscan import SECONDARY

    return any(s in text for s in SECONDARY)


def _backend(backend: str) -> str:
    if backend not in BACKENDS:
        from .job.parse import suggest

        raise SpecError(f"unknown backend {backend!r}{suggest(backend, BACKENDS)}: expected one of "
                        f"{', '.join(BACKENDS)}")
    if backend == "auto":
        from .backends.slurm.commands import configured_here

        kind = "slurm" if configured_here() else "local"
        if kind == "local":
            print("clusterddp: no Slurm configuration here: running on this machine (submitit's local executor)")
        return kind
    return backend


def _executor(spec: JobSpec, backend: str, folder: Optional[str], array_parallelism: Optional[int] = None) -> Any:
    import submitit

    folder = folder or os.path.join(spec.output_dir, f"{spec.file_stem}-submitit", "%j")
    if backend == "local":
        local = submitit.LocalExecutor(folder=folder)
        local.update_parameters(tasks_per_node=spec.world_size, nodes=1,
                                timeout_min=math.ceil((spec.time_seconds or 3600 * 24) / 60))
        return local
    executor = submitit.SlurmExecutor(folder=folder)
    params = executor_params(spec)
    if array_parallelism is not None:
        params["array_parallelism"] = array_parallelism
    try:
        executor.update_parameters(**params)
    except ValueError as exc:
        raise SpecError(f"submitit refused the parameters: {exc}") from None
    return executor


def _free_port() -> int:
    from .backends.local.plan import pick_port
    from .contract import default_port

    return pick_port(default_port(os.getpid()))


def _submit(call: Callable[[], Any], spec: JobSpec, backend: str) -> Any:
    hide_gpus = False
    if backend == "local" and spec.gpus_per_node:
        from .backends.local.plan import visible_gpus

        hide_gpus = len(visible_gpus()) < spec.world_size
        if hide_gpus:
            print(f"clusterddp: {spec.world_size} ranks need as many GPUs: running locally on CPU with gloo")
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        if hide_gpus:  # the local executor's processes inherit this environment (only while they start)
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        return call()
    except ClusterDDPError:
        raise
    except Exception as exc:  # submitit raises plain exceptions carrying sbatch's output
        raise SlurmError(f"submission failed: {type(exc).__name__}: {exc}") from exc
    finally:
        if hide_gpus:
            if saved is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved


def submit_function(fn: Callable, spec: JobSpec, *args: Any, backend: str = "auto", folder: Optional[str] = None,
                    **kwargs: Any) -> Job:
    """Run ``fn(*args, **kwargs)`` on every rank of a DDP job; returns a Job (``job.result()`` is rank 0's value)."""
    executor_params(spec)  # validate early, even for the local backend
    kind = _backend(backend)
    executor = _executor(spec, kind, folder)
    call = _OnEveryRank(fn, args, kwargs, spec.tasks_per_node, _free_port() if kind == "local" else None)
    return Job(_submit(lambda: executor.submit(call), spec, kind), spec, kind)


def submit_script(spec: JobSpec, script: str, args: Sequence[str] = (), backend: str = "auto",
                  folder: Optional[str] = None, python: Optional[str] = None) -> Job:
    """Run ``python script args`` on every rank (srun layout) through submitit, with a Python handle."""
    import sys

    import submitit

    if not os.path.isfile(script):
        from .backends.slurm.preflight import script_not_found

        raise SpecError(str(script_not_found(script)))
    command = [python or sys.executable, "-u", script, *args]
    function_spec = spec.replace(script="", args=(), module=False, launcher="srun")
    return submit_function(submitit.helpers.CommandFunction(command, verbose=False), function_spec,
                           backend=backend, folder=folder)


def map_array(fn: Callable, spec: JobSpec, configs: Iterable[Any], max_parallel: Optional[int] = None,
              backend: str = "auto", folder: Optional[str] = None, name: Optional[str] = None) -> List[Job]:
    """One DDP job per config as a Slurm job array (``fn(config)`` on every rank of each); at most
    ``max_parallel`` run at once (the array's % throttle). The configs are the trials of sweep ``name`` (default:
    the function's name): ``clusterddp sweep status NAME`` shows them, with what ``runtime.report`` recorded."""
    from .job.parse import slug
    from .sweeps import api as sweep_api
    from .sweeps.run import sweep_dir_for

    executor_params(spec)
    configs = list(configs)
    kind = _backend(backend)
    name = sweep_api.check_sweep_name(name or slug(getattr(fn, "__name__", "map_array")))
    executor = _executor(spec, kind, folder, array_parallelism=max_parallel)
    trials = sweep_api.plan(fn, configs)
    sweep_dir = sweep_dir_for(spec, name, False)
    calls = [sweep_api.TrialCall(_OnEveryRank(fn, (c,), {}, spec.tasks_per_node,
                                              _free_port() + i if kind == "local" else None), name, sweep_dir, t)
             for i, (c, t) in enumerate(zip(configs, trials))]

    def submit_all() -> List[Any]:
        with executor.batch():
            jobs = [executor.submit(c) for c in calls]
        return jobs

    jobs = [Job(j, spec, kind) for j in _submit(submit_all, spec, kind)]
    sweep_api.record(name, spec, trials, [j.job_id for j in jobs], kind == "local")
    return jobs


def job_attempts(job_id: str, cluster: Optional[str] = None) -> List[Any]:
    """Every attempt of a job submitted with `clusterddp submit` (its batch script's retry loop, requeues included),
    as `clusterddp status JOBID` shows them: clusterddp.healing.attempts.Attempt (nodes, start, end, exit, fault,
    fault_nodes, why, next). Its cluster is found from the records, as the CLI finds it. (Jobs of this API run no
    retry loop.)"""
    from . import backends
    from .backends.record import JobRecord, for_job
    from .healing.attempts import read
    from .job.clusters import by_name

    name = for_job(job_id, cluster).name
    record = JobRecord.load(job_id, name)
    if record is None:
        return []
    return read(Path(backends.get(by_name(name)).readable(record, reports_only=True).run_dir))


__all__ = ["submit_function", "submit_script", "map_array", "job_attempts", "executor_params", "Job", "JobFailed"]
