"""spec -> sbatch script text. No Slurm contacted, no job files written: the output depends on the spec and the
templates only. (Compiled templates are cached under $XDG_CACHE_HOME or ~/.cache/clusterddp; a cache that cannot
be written is simply not used.)

Templates are looked up in the user's template directories first (``--template-dir``,
``CLUSTERDDP_TEMPLATE_DIR``), then in the shipped ``templates/``. The shipped ones are found through
importlib.resources (wheel, editable install) with a fallback to the source tree (plain checkout).
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jinja2

from ... import contract, dirs
from ...contract import PORT_BASE, PORT_SPAN
from ...errors import SpecError, TemplateError
from ...job.quoting import sbatch_quote, shell_quote, shown
from ...job.spec import JobSpec

TEMPLATE_SUFFIX = ".sh.j2"
#: Shipped templates that other templates include or extend; rendered alone they make no runnable script.
BUILDING_BLOCKS = ("base", "rendezvous")
ENV_TEMPLATE_DIR = "CLUSTERDDP_TEMPLATE_DIR"


def _shipped_dir() -> Any:
    """The shipped templates: a directory beside the package (an installed wheel: clusterddp/templates), else the
    source checkout's top-level templates/ (setuptools' editable installs too), else through importlib.resources
    (zip imports). Plain paths first: importlib.resources costs the CLI's start-up a few milliseconds."""
    package = Path(__file__).resolve().parents[2]
    for candidate in (package / "templates", package.parent / "templates"):
        if (candidate / ("base" + TEMPLATE_SUFFIX)).is_file():
            return candidate
    try:
        from importlib.resources import files

        root = files("clusterddp.templates")
        if root.joinpath("base" + TEMPLATE_SUFFIX).is_file():
            return root
    except (ImportError, ModuleNotFoundError, TypeError):
        pass
    return package.parent / "templates"


class _ResourceLoader(jinja2.BaseLoader):
    """Loads templates from an importlib.resources Traversable (works where PackageLoader does not)."""

    def __init__(self, root: Any) -> None:
        self.root = root

    def get_source(self, environment: jinja2.Environment,
                   template: str) -> Tuple[str, Optional[str], Callable[[], bool]]:
        node = self.root
        for piece in template.split("/"):
            if piece in ("", ".", ".."):
                raise jinja2.TemplateNotFound(template)
            node = node.joinpath(piece)
        if not node.is_file():
            raise jinja2.TemplateNotFound(template)
        return node.read_text(encoding="utf-8"), str(node), lambda: True

    def list_templates(self) -> List[str]:
        return sorted(p.name for p in self.root.iterdir() if p.name.endswith(TEMPLATE_SUFFIX))


def template_dirs(user_dirs: Sequence[str] = ()) -> List[str]:
    """User template directories in search order: explicit ones, then $CLUSTERDDP_TEMPLATE_DIR (os.pathsep list)."""
    dirs = [str(d) for d in user_dirs]
    dirs += [d for d in os.environ.get(ENV_TEMPLATE_DIR, "").split(os.pathsep) if d]
    for d in dirs:
        try:
            ok = Path(d).is_dir()
        except OSError as exc:  # a name too long for the file system, for one
            raise TemplateError(f"template directory {shown(d)}: {exc.strerror}") from None
        if not ok:
            raise TemplateError(f"template directory {shown(d)} does not exist (from --template-dir or "
                                f"{ENV_TEMPLATE_DIR})")
    return dirs


def environment(user_dirs: Sequence[str] = ()) -> jinja2.Environment:
    """The Jinja environment for these template directories (cached: compiled templates are reused)."""
    return _environment(tuple(template_dirs(user_dirs)))


class _BytecodeCache(jinja2.FileSystemBytecodeCache):
    """Compiled templates kept between runs (a CLI call compiles nothing twice); a cache that cannot be written
    is no cache, never an error."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except (OSError, EOFError, ValueError):
            pass

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _bytecode_cache() -> Optional[jinja2.BytecodeCache]:
    directory = str(dirs.base("cache") / f"jinja-{jinja2.__version__}")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        return None
    return _BytecodeCache(directory)


@functools.lru_cache(maxsize=16)
def _environment(dirs: Tuple[str, ...]) -> jinja2.Environment:
    shipped = _ResourceLoader(_shipped_dir())
    loaders: List[jinja2.BaseLoader] = [jinja2.FileSystemLoader(d) for d in dirs]
    # "clusterddp/<name>" always means the shipped template, so a site template may override a shipped one
    # by name and still {% extends "clusterddp/torchrun.sh.j2" %}.
    loaders += [shipped, jinja2.PrefixLoader({"clusterddp": shipped})]
    env = jinja2.Environment(loader=jinja2.ChoiceLoader(loaders), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False, trim_blocks=True, lstrip_blocks=True,
                             bytecode_cache=_bytecode_cache())
    env.filters["q"] = shell_quote  # for site templates: the same encoder as every shell word below
    return env


def available_templates(user_dirs: Sequence[str] = ()) -> List[str]:
    names = {n for n in environment(user_dirs).list_templates() if not n.startswith("clusterddp/")}
    parts = {name + TEMPLATE_SUFFIX for name in BUILDING_BLOCKS}
    return sorted(n[: -len(TEMPLATE_SUFFIX)] for n in names if n.endswith(TEMPLATE_SUFFIX) and n not in parts)


def directive_lines(spec: JobSpec) -> List[str]:
    """``--name="value"`` for each directive: the one place #SBATCH values are encoded."""
    return [f"--{name}" if value is None else f"--{name}={sbatch_quote(value)}"
            for name, value in spec.sbatch_directives()]


def _words(values: Sequence[str]) -> str:
    return " ".join(shell_quote(v) for v in values)


def _trials(spec: JobSpec) -> List[Dict[str, Any]]:
    """A sweep's case arms: per trial its exports, its arguments and its trial.json, each a shell word."""
    if spec.sweep is None:
        return []
    q = shell_quote
    return [{"index": t.index,
             "exports": " ".join(f"{n}={q(v)}" for n, v in [(contract.TRIAL, str(t.index)), *t.exports]),
             "args": _words(t.args), "record": q(t.record)} for t in spec.sweep.trials]


def supervisor_options(spec: JobSpec) -> List[str]:
    """The job's policy for ``python -m clusterddp.healing next`` (healing/supervise.py's Policy)."""
    words = ["--nodes", str(spec.nodes), "--per-node", str(spec.tasks_per_node), "--retries", str(spec.retries),
             "--max-requeues", str(spec.max_requeues), "--launcher", spec.launcher]
    words += ["--requeues"] if spec.requeues else []
    words += ["--gate"] if spec.retries and (spec.health_check or spec.spare_nodes) else []
    return words + (["--exclude", ",".join(spec.exclude)] if spec.exclude else [])


def _exports(spec: JobSpec) -> List[str]:
    """The batch shell's environment lines: what every rank is promised, then the user's -e values (quoted)."""
    lines = ["# Set here, not inherited: a stop file (or a drill's variables) from the submitting shell would stop "
             "these ranks.", "unset CLUSTERDDP_STOP_FILE CLUSTERDDP_DRILL_DIR CLUSTERDDP_DRILL_STOP_AT",
             "export PYTHONUNBUFFERED=1"] + [f"export {name}={shell_quote(value)}" for name, value in spec.promised_env]
    lines.append(f"export OMP_NUM_THREADS={spec.cpus_per_task or 1}")
    if not spec.gpus_per_node:
        lines += ["# A CPU job: no GPU of this node is its own (where Slurm does not mask devices, they belong to "
                  "other jobs).", "export CUDA_VISIBLE_DEVICES="]
    return lines + [f"export {name}={shell_quote(value)}" for name, value in spec.env]


def _flight_lines(spec: JobSpec) -> List[str]:
    """NCCL jobs: the flight recorder's variables (less those the user set with -e) and its directory."""
    if not (spec.gpus_per_node and spec.flight_recorder):
        return []
    return ["# NCCL: PyTorch's flight recorder keeps every rank's last collectives and writes them here when one times "
            "out", "# (or the hang watchdog ends the job); a failed collective aborts the job instead of hanging it.",
            "# (--no-flight-recorder leaves these out; a value given with -e is kept.)"] + [
        f"export {name}={value}" for name, value in contract.flight_recorder(
            f'"$RUN_DIR/{contract.NCCL_TRACE_DIR}/rank_"', spec.env)] + [
        f'mkdir -p -- "$RUN_DIR/{contract.NCCL_TRACE_DIR}"']


def context(spec: JobSpec) -> Dict[str, Any]:
    """Everything the templates lay out, computed here (templates do no arithmetic on user values).

    Every user value is a shell word made by shell_quote, or an #SBATCH value made by sbatch_quote; nothing else.
    """
    from ...version import __version__

    q = shell_quote
    entry = (["-m", spec.script] if spec.module else [spec.script]) if spec.script else []
    container = (["apptainer", "exec"] + (["--nv"] if spec.gpus_per_node else []) + [spec.apptainer]
                 if spec.apptainer else [])
    return {
        "spec": spec,
        "exit": contract.EXIT,
        "version": __version__,
        "directives": directive_lines(spec),
        # A sweep's trial gets its own arguments from the array task's case arm (CLUSTERDDP_ARGS).
        "program": _words(entry) + ' "${CLUSTERDDP_ARGS[@]}"' if spec.sweep else _words(entry + list(spec.args)),
        "python": q(spec.python),
        # spawn fills placeholders in the script's arguments only, never in the command that runs them.
        "command": _words(container + [spec.python] + entry),
        "command_words": len(container) + 1 + len(entry),
        "script_args": '"${CLUSTERDDP_ARGS[@]}"' if spec.sweep else _words(spec.args),
        "trials": _trials(spec),
        "env": [(name, q(value)) for name, value in spec.env],
        "exports": _exports(spec),
        # NCCL jobs: the flight recorder's variables, less those the user set with -e (the user's value wins).
        "flight_recorder": contract.flight_recorder(f'"$RUN_DIR/{contract.NCCL_TRACE_DIR}/rank_"', spec.env)
        if spec.gpus_per_node and spec.flight_recorder else [],
        "flight_lines": _flight_lines(spec),
        "setup": list(spec.setup),
        "setup_lines": (["# --setup lines, verbatim (they are shell code by design)"] + list(spec.setup)
                        if spec.setup else []),
        "run_dir": f"{q(spec.output_dir)}/{q(contract.run_dir(spec.file_stem, ''))}\"$SLURM_JOB_ID\"",
        "srun_cpus": spec.cpus_per_task is not None,
        # Each attempt's step: --nodes of the allocation's healthy nodes (with spares the job has more), and its own
        # task count (srun would take the job's).
        "step": (f"--nodes={spec.nodes} --ntasks={spec.nodes * spec.slurm_tasks_per_node} "
                 '--nodelist="$CLUSTERDDP_STEP_NODES"'),
        # The health gate's hook: shell code by design (the user wrote it), one word here, run by bash -c there.
        "health_check": q(spec.health_check or ""),
        # The supervisor's policy (python -m clusterddp.healing next): the spec's numbers, as words; a job requeued
        # after a node fault keeps the nodes it excluded at submission out too.
        "supervisor": _words(supervisor_options(spec)),
        # Containers: pyxis/enroot options go to srun; apptainer prefixes the command each task runs.
        "container_srun": (f"--container-image={q(spec.container_image)} --container-mounts=\"$PWD\" "
                           f"--container-workdir=\"$PWD\" " if spec.container_image else ""),
        "container_prefix": _words(container) + " " if container else "",
        "omp_threads": spec.cpus_per_task or 1,
        "log_kind": {"srun": "per-rank",
                     "torchrun": "per-node (rank-prefixed) and per-rank"}.get(spec.launcher, "per-node"),
        "allocations": contract.ALLOCATIONS_FILE,
        "port_base": PORT_BASE,
        "port_span": PORT_SPAN,
    }


#: Slurm's default max_script_size (SchedulerParameters): sbatch refuses a larger batch script.
MAX_SCRIPT_BYTES = 4 << 20


def render(spec: JobSpec, template: Optional[str] = None, template_dirs: Sequence[str] = ()) -> str:
    """The sbatch script for ``spec`` (template defaults to ``spec.template`` or the launcher's own)."""
    spec.require_entry_point()
    name = template or spec.template or spec.launcher
    if name in BUILDING_BLOCKS:
        raise TemplateError(f"template {name!r} is a building block of the job templates, not a job script: use "
                            f"one of {', '.join(available_templates(template_dirs))}, or a template of your own "
                            f"that extends it")
    return render_part(spec, name, template_dirs)


def render_part(spec: JobSpec, name: str, template_dirs: Sequence[str] = ()) -> str:
    """Render one template by name with the spec's context (also used for building blocks such as rendezvous)."""
    env = environment(template_dirs)
    try:
        tmpl = env.get_template(name + TEMPLATE_SUFFIX)
    except jinja2.TemplateNotFound as exc:  # (an OSError too: it goes first)
        valid = available_templates(template_dirs)
        raise TemplateError(f"unknown template {shown(name)} (missing {exc.name}): available templates are "
                            f"{', '.join(valid)}; add your own with --template-dir DIR") from None
    except OSError as exc:  # a name too long for the file system, for one
        raise TemplateError(f"template {shown(name)}: {exc.strerror}") from None
    try:
        text = tmpl.render(context(spec))
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"template {name!r} uses an undefined value: {exc.message}") from None
    except jinja2.TemplateError as exc:
        raise TemplateError(f"template {name!r} failed to render: {exc}") from None
    size = len(text.encode("utf-8"))
    if spec.sweep is not None and size > MAX_SCRIPT_BYTES:
        trials = len(spec.sweep.trials)
        fits = max(1, trials * MAX_SCRIPT_BYTES // size * 9 // 10)
        raise SpecError(f"this sweep's array script would be {size / 2 ** 20:.1f} MiB for {trials} trials: Slurm "
                        f"refuses batch scripts over {MAX_SCRIPT_BYTES >> 20} MiB (max_script_size, unless the site "
                        f"raised it); submit it as sweeps of at most about {fits} trials each")
    return text
