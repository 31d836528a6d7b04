"""``clusterddp render | submit | explain``: the job spec options (spelled like sbatch's, defaults from JobSpec),
options over profiles -> a validated JobSpec, then one library call."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

import click

from .cli_base import CLUSTER_OPTION, cli
from .contract import PORT_SCHEME
from .errors import SpecError
from .quoting import shown
from .spec import GPU_REQUESTS, LAUNCHERS, JobSpec, field_default, parse_env

EXAMPLES = """\b
Launchers (--launcher), world size = --nodes x --gpus (x --procs-per-node when --gpus 0):
  torchrun (default)  one torchrun agent per node starting one rank per GPU:
      clusterddp {cmd} --nodes 2 --gpus 8 train.py -- --epochs 10      # 16 ranks
  srun                one Slurm task per GPU; RANK/LOCAL_RANK/WORLD_SIZE set per task:
      clusterddp {cmd} --launcher srun --nodes 2 --gpus 4 train.py     # 8 ranks
  spawn               one task per node running a torch.multiprocessing.spawn script;
                      {{placeholders}} in its arguments are filled in per node:
      clusterddp {cmd} --launcher spawn --nodes 2 --gpus 8 main.py -- \\
          --dist-url 'tcp://{{master_addr}}:{{master_port}}' --world-size {{nnodes}} \\
          --rank {{node_rank}} --multiprocessing-distributed
  CPU only (gloo):
      clusterddp {cmd} --nodes 2 --gpus 0 --procs-per-node 4 train.py  # 8 ranks

\b
Everything after -- goes to the training script unchanged (quoted for the shell).
--setup lines are shell code run before the launch, verbatim (e.g. --setup 'module load cuda/12').
"""


D = field_default
def spec_options(f: Callable) -> Callable:
    """The job spec options shared by render and submit (spelled like sbatch's); defaults come from JobSpec."""
    options = [
        click.option("-N", "--nodes", type=int, default=D("nodes"), show_default=True, help="Number of nodes."),
        click.option("-G", "--gpus", "--gpus-per-node", "gpus_per_node", type=int, default=D("gpus_per_node"),
                     show_default=True,
                     help="GPUs per node = ranks per node (0: CPU-only job with gloo)."),
        click.option("--procs-per-node", type=int, help="Ranks per node for a CPU-only job (--gpus 0). [default: 1]"),
        click.option("-c", "--cpus-per-task", type=int, help="CPUs per rank (also sets OMP_NUM_THREADS)."),
        click.option("--mem", help="Memory per node, as sbatch (e.g. 64G; 0 = all)."),
        click.option("-t", "--time", help="Time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."),
        click.option("-p", "--partition", help="Slurm partition."),
        click.option("-A", "--account", help="Slurm account to charge."),
        click.option("-q", "--qos", help="Quality of service."),
        click.option("-C", "--constraint", help="Node features (sbatch --constraint)."),
        click.option("--exclusive", is_flag=True, help="Do not share nodes with other jobs."),
        click.option("-x", "--exclude", multiple=True, metavar="NODES",
                     help="Leave these nodes out: names or host lists, comma-separated (repeatable); nodes "
                          "quarantined after a fault are left out too (clusterddp nodes)."),
        click.option("--no-quarantine", is_flag=True,
                     help="Use the nodes quarantined after faults too (clusterddp nodes lists them)."),
        click.option("-J", "--job-name", help="Job name [default: the script's name]."),
        click.option("--output-dir", default=D("output_dir"), show_default=True,
                     help="Where scripts and logs go: <dir>/<name>-<jobid>.out and <dir>/<name>-<jobid>/."),
        click.option("-e", "--env", "env", multiple=True, metavar="NAME=VALUE",
                     help="Environment variable for every rank (repeatable)."),
        click.option("--setup", multiple=True, metavar="LINE",
                     help="Shell line run before the launch, verbatim (repeatable): module load, source venv."),
        click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="--OPT[=VALUE]",
                     help="Extra sbatch option, e.g. --sbatch-arg=--mail-type=END (repeatable)."),
        click.option("--gpu-request", default=D("gpu_request"), show_default=True,
                     help=f"How GPUs are requested: {', '.join(GPU_REQUESTS)} (gpus-per-task: srun launcher only)."),
        click.option("-L", "--launcher", default=D("launcher"), show_default=True,
                     help=f"DDP entry point: {', '.join(LAUNCHERS)}."),
        click.option("--master-port", type=int,
                     help=f"Rendezvous port [default: {PORT_SCHEME}, checked free on the head node]."),
        click.option("--python", default=D("python"), show_default=True,
                     help="Interpreter for the srun and spawn launchers."),
        click.option("--requeue/--no-requeue", default=None,
                     help="Before the time limit, ask every rank to checkpoint and stop, then requeue the job "
                          "[default: on when --time is given]."),
        click.option("--max-requeues", type=int, default=D("max_requeues"), show_default=True,
                     help="Requeue at most this often (SLURM_RESTART_COUNT)."),
        click.option("--retries", type=int, default=D("retries"), show_default=True,
                     help="After a node fault (a rank killed with no traceback, a lost node, a hang, ranks that never "
                          "arrived), run the job step again from its last checkpoint without the node at fault: on "
                          "a spare, or else requeued with that node excluded (0 = off). A Python exception is never "
                          "retried."),
        click.option("--spare-nodes", type=int, default=D("spare_nodes"), show_default=True, metavar="K",
                     help="Ask Slurm for --nodes + K nodes; each attempt runs on --nodes healthy ones, and a node at "
                          "fault is replaced by a spare without leaving the queue."),
        click.option("--health-check", metavar="CMD",
                     help="Shell code run on every candidate node before each attempt (verbatim, as --setup); a "
                          "non-zero exit keeps that node out. The gate also checks that the run directory is "
                          "writable there and, where nvidia-smi is, that the node's GPUs are visible. It runs "
                          "before every attempt with --health-check or --spare-nodes, else before retries."),
        click.option("--signal-before", "signal_seconds", type=int, default=D("signal_seconds"), show_default=True,
                     metavar="SECONDS", help="Ask for the stop signal this long before the time limit."),
        click.option("--stop-grace", type=int, default=D("stop_grace"), show_default=True, metavar="SECONDS",
                     help="How long ranks get to checkpoint after the signal before srun is ended."),
        click.option("--hang-timeout", default=D("hang_timeout"), show_default=True, metavar="TIME",
                     help="End the job when no rank has advanced for this long (minutes, or MM:SS, HH:MM:SS as "
                          "--time; 0 = off). The roll call of where every rank waits goes into the batch log. "
                          "Scripts using clusterddp.runtime only; the first step gets twice as long."),
        click.option("--flight-recorder/--no-flight-recorder", default=D("flight_recorder"), show_default=True,
                     help="NCCL jobs: PyTorch's flight recorder keeps each rank's last collectives and writes them "
                          "into the run directory on a timeout or hang (TORCH_NCCL_TRACE_BUFFER_SIZE)."),
        click.option("--container-image", metavar="IMAGE",
                     help="Run every task in this image through pyxis/enroot (srun --container-image)."),
        click.option("--apptainer", metavar="IMAGE", help="Run every task with apptainer exec [--nv] IMAGE."),
        click.option("--array", metavar="SPEC", help="A job array for sweeps, as sbatch: 0-9, 1,3,5, 0-99%10 "
                                                    "(at most 10 at once); $SLURM_ARRAY_TASK_ID tells them apart."),
        click.option("--after", multiple=True, metavar="JOBID",
                     help="Start only after JOBID completed successfully (afterok; repeatable)."),
        click.option("--template", help="Template name (default: the launcher's); see --template-dir."),
        click.option("--template-dir", "template_dirs", multiple=True, metavar="DIR",
                     help="Directory searched for templates before the shipped ones (also $CLUSTERDDP_TEMPLATE_DIR)."),
        click.option("-m", "--module", is_flag=True, help="SCRIPT is a module name run as python -m SCRIPT."),
        click.option("-P", "--profile", help="Defaults from [profiles.NAME] of clusterddp.toml / the user config "
                                             "(clusterddp config show --profile NAME)."),
        CLUSTER_OPTION,
        click.argument("script"),
        click.argument("args", nargs=-1, type=click.UNPROCESSED),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def build_spec(script: str, args: Sequence[str], template_dirs: Sequence[str] = (), profile: Optional[str] = None,
               local: bool = False, **opts: Any) -> Any:
    """Options as Click parsed them, over the configured defaults -> (validated JobSpec, template directories).

    An option given on the command line wins; otherwise a value from the profile/config/environment layers;
    otherwise the built-in default. --env merges with configured env, --setup and --sbatch-arg append.
    """
    from click.core import ParameterSource

    from .clusters import choose
    from .config import resolve, skip_warning

    ctx = click.get_current_context()
    cluster = choose(opts.pop("cluster", None), profile)
    no_quarantine = opts.pop("no_quarantine", False)
    skipped: list = []
    configured = {k: v for k, (v, _) in resolve(profile, skipped=skipped).items()}
    for path, why in skipped:
        click.echo(skip_warning(path, why), err=True)
    values: dict = {}
    for name, value in opts.items():
        given = ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
        if name == "env":
            values["env"] = tuple({**configured.get("env", {}), **dict(parse_env(value))}.items())
        elif name in ("setup", "sbatch_args"):
            values[name] = tuple(configured.get(name, [])) + tuple(value)
        elif name == "exclude":
            values[name] = tuple(configured.get(name, [])) + tuple(n for v in value for n in split_nodes(v))
        elif given or name not in configured:
            values[name] = value
        else:
            values[name] = configured[name]
    if not no_quarantine and not local:
        values["exclude"] = with_quarantine(values.get("exclude", ()), cluster.name)
    spec = JobSpec(script=script, args=tuple(args), **values)
    if not spec.module and not Path(script).is_file():
        from .preflight import script_not_found

        raise SpecError(str(script_not_found(script)))
    if cluster.remote:
        from .remote import job_spec

        spec = job_spec(spec, cluster)  # as it will run there (clusterddp's job modules come with the code)
    return spec, tuple(configured.get("template_dirs", [])) + tuple(template_dirs), cluster


def split_nodes(value: str) -> List[str]:
    """'node1,gpu[01-03,07],node9' -> its names and host lists (commas inside brackets belong to the list)."""
    parts, depth, current = [], 0, ""
    for ch in value:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [p for p in parts + [current] if p]


def with_quarantine(exclude: Sequence[str], cluster: str) -> Tuple[str, ...]:
    """``exclude`` and the nodes quarantined on ``cluster`` after faults (saying which, and why)."""
    from . import quarantine

    held = quarantine.active(cluster)
    new = [n for n in sorted(held) if n not in exclude]
    if new:
        click.echo("clusterddp: leaving out node(s) quarantined after a fault: " + "; ".join(
            f"{n} (job {held[n]['job']}: {held[n]['reason']})" for n in new)
            + f"; clusterddp nodes{'' if cluster == 'here' else ' --cluster ' + cluster} lists them, "
              "--no-quarantine uses them", err=True)
    return tuple(exclude) + tuple(new)


def _render(spec: JobSpec, template_dirs: Sequence[str]) -> str:
    from .render import render  # jinja2 is only needed once a script is rendered

    return render(spec, template_dirs=template_dirs)


def _print_script(text: str) -> None:
    # color=True: click strips escape sequences when stdout is not a terminal, and the printed script must be
    # byte for byte the one that would be submitted (a --setup line may hold one).
    click.echo(text, nl=False, color=True)


def _check_output_file(path: Path, spec: JobSpec) -> None:
    """-o never overwrites the training script, and says what is wrong with a path it cannot write."""
    parent = path.parent
    try:
        if not spec.module and path.exists() and Path(spec.script).exists() and path.samefile(spec.script):
            raise SpecError(f"-o {shown(str(path))} is the training script itself; write the job script "
                            "elsewhere (e.g. -o job.sbatch)")
        ok = parent.is_dir()
    except OSError as exc:  # a name too long for the file system, for one
        raise SpecError(f"cannot write -o {shown(str(path))}: {exc.strerror}") from None
    if not ok:
        raise SpecError(f"cannot write -o {shown(str(path))}: directory {shown(str(parent))} does not exist; "
                        "create it first")


def _summary(spec: JobSpec) -> str:
    per = f"{spec.gpus_per_node} GPU(s)" if spec.gpus_per_node else f"{spec.tasks_per_node} CPU rank(s)"
    return (f"{spec.nodes} node(s) x {per} = world size {spec.world_size} "
            f"({spec.launcher} launcher, {spec.backend})")


@cli.command("render", epilog=EXAMPLES.format(cmd="render"))
@spec_options
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write here instead of stdout.")
def render_command(script: str, args: Sequence[str], output: Optional[str], template_dirs: Sequence[str],
                   **opts: Any) -> None:
    """Print the sbatch script for SCRIPT [-- ARGS...] (or write it with -o FILE)."""
    spec, template_dirs, _ = build_spec(script, args, template_dirs, **opts)
    text = _render(spec, template_dirs)
    if output:
        _check_output_file(Path(output), spec)
    # sbatch cannot create the directory of --output: a job submitted by hand from this script would fail at
    # once without it, with no log to say why.
    if not Path(spec.output_dir).is_dir():
        try:
            Path(spec.output_dir).mkdir(parents=True)
            click.echo(f"clusterddp: created {spec.output_dir}/ for the job's logs", err=True)
        except OSError as exc:
            click.echo(f"clusterddp: warning: cannot create {spec.output_dir}/ ({exc.strerror}); sbatch needs it "
                       "for the job's log", err=True)
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"cannot write -o {shown(output)}: {exc.strerror}; choose a writable file") from None
        click.echo(f"clusterddp: wrote {output}: {_summary(spec)}", err=True)
    else:
        _print_script(text)


@cli.command("submit", epilog=EXAMPLES.format(cmd="submit"))
@spec_options
@click.option("--dry-run", is_flag=True, help="Print the script that would be submitted; submit nothing.")
@click.option("--wait", "wait_", is_flag=True, help="Follow the job to its end; exit with the job's exit code.")
@click.option("--on-interrupt", type=click.Choice(["ask", "cancel", "detach"]), default="ask", show_default=True,
              help="What Ctrl-C during --wait does (ask only when the terminal can answer).")
@click.option("--local", is_flag=True,
              help="Run on this machine instead of Slurm: --nodes x --gpus ranks, GPUs if there are enough, else "
                   "CPU with gloo. Exit code = the job's.")
@click.option("--quiet", is_flag=True, help="With --local: show only rank 0's output (all ranks are in the logs).")
@click.option("--no-check", is_flag=True,
              help="Skip the pre-flight checks (partition, GPUs, CPUs, memory and time limit against sinfo, then "
                   "sbatch --test-only).")
def submit_command(script: str, args: Sequence[str], dry_run: bool, wait_: bool, on_interrupt: str, local: bool,
           quiet: bool, no_check: bool, template_dirs: Sequence[str], **opts: Any) -> None:
    """Submit SCRIPT [-- ARGS...] as a DDP job: render, write the script, sbatch, print the job id.

    With --local, run the same job here, no Slurm needed (try it before you have a cluster).
    """
    spec, template_dirs, cluster = build_spec(script, args, template_dirs, local=local, **opts)
    if local:
        if cluster.remote:
            raise SpecError(f"--local runs on this machine; --cluster {cluster.name} submits to a remote cluster: "
                            "choose one")
        from .local import submit_local

        code = submit_local(spec, quiet=quiet, dry_run=dry_run, echo=click.echo,
                            note=lambda line: click.echo(line, err=True))
        sys.exit(code)
    if quiet:
        raise SpecError("--quiet only applies to --local runs (Slurm jobs write their output to logs)")
    if wait_ and spec.array:
        raise SpecError("--wait follows one job; an --array has one per task: submit without --wait and follow the "
                        "tasks with clusterddp status JOBID_TASK")
    if dry_run:
        _print_script(_render(spec, template_dirs))
        where = f" (for cluster {cluster.name})" if cluster.remote else ""
        click.echo(f"clusterddp: dry run, nothing submitted{where}: {_summary(spec)}", err=True)
        return
    from . import backends

    backend = backends.get(cluster)
    record = backend.submit(spec, template_dirs, check=not no_check,
                            note=lambda line: click.echo(f"clusterddp: {line}", err=True))
    job_id = record.job_id
    click.echo(job_id)
    where = f" on cluster {cluster.name}" if cluster.name != "here" else ""
    click.echo(f"clusterddp: submitted job {job_id}{where}: {_summary(spec)}\n"
               f"  script {record.script_path}\n  log    {record.batch_log}\n  ranks  {record.run_dir}/", err=True)
    if wait_:
        from .watch import wait

        sys.exit(wait(backend, job_id, on_interrupt, record))


@cli.command("explain", epilog=EXAMPLES.format(cmd="explain"))
@spec_options
def explain_command(script: str, args: Sequence[str], template_dirs: Sequence[str], **opts: Any) -> None:
    """Explain the job SCRIPT [-- ARGS...] would be, without submitting: world size, the node/rank/GPU table,
    MASTER_ADDR/PORT, every variable the script sees and known mistakes."""
    from .explain import explain as explain_spec

    click.echo(explain_spec(build_spec(script, args, template_dirs, **opts)[0]), nl=False)
