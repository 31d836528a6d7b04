"""The ``clusterddp`` command: a thin Click adapter. Options -> JobSpec -> one library call; errors -> one line.

Never imports torch (login nodes may not have it) nor submitit.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

import click

from . import __version__
from .contract import PORT_SCHEME
from .errors import ClusterDDPError, SpecError
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


class CLIError(click.ClickException):
    """A ClusterDDPError shown as one line, with its own exit code (2 usage, 1 runtime)."""

    def __init__(self, error: ClusterDDPError) -> None:
        super().__init__(str(error))
        self.exit_code = error.exit_code

    def show(self, file: Any = None) -> None:
        click.echo(f"clusterddp: error: {self.format_message()}", err=True)


class Command(click.Command):
    """Turns library errors into CLIError and hints at '--' when script options were mistaken for ours."""

    def parse_args(self, ctx: click.Context, args: List[str]) -> List[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            if any(p.name == "script" for p in self.params):
                exc.message += (f"\n(if {exc.option_name} is meant for your training script, put script arguments "
                                "after --, e.g. clusterddp submit train.py -- --epochs 10)")
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ClusterDDPError as exc:
            raise CLIError(exc) from None


class Group(click.Group):
    command_class = Command
    group_class = type  # sub-groups (config) are Groups too: one error path everywhere


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="clusterddp")
def cli() -> None:
    """DistributedDataParallel on Slurm, as easy as nn.DataParallel.

    \b
      clusterddp submit --nodes 2 --gpus 8 train.py -- --epochs 10
      clusterddp submit --dry-run ...   print the sbatch script, submit nothing
      clusterddp render ... -o job.sh   write the script to a file
      clusterddp status / logs / cancel JOBID
      clusterddp explain ...            world size, rank table, environment, warnings
      clusterddp new train.py           write a DDP training skeleton
      clusterddp doctor --nodes 2 ...   check the process group, interfaces and all-reduce speed
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
        click.option("--signal-before", "signal_seconds", type=int, default=D("signal_seconds"), show_default=True,
                     metavar="SECONDS", help="Ask for the stop signal this long before the time limit."),
        click.option("--stop-grace", type=int, default=D("stop_grace"), show_default=True, metavar="SECONDS",
                     help="How long ranks get to checkpoint after the signal before srun is ended."),
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
        click.argument("script"),
        click.argument("args", nargs=-1, type=click.UNPROCESSED),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def build_spec(script: str, args: Sequence[str], template_dirs: Sequence[str] = (), profile: Optional[str] = None,
               **opts: Any) -> Any:
    """Options as Click parsed them, over the configured defaults -> (validated JobSpec, template directories).

    An option given on the command line wins; otherwise a value from the profile/config/environment layers;
    otherwise the built-in default. --env merges with configured env, --setup and --sbatch-arg append.
    """
    from click.core import ParameterSource

    from .config import resolve, skip_warning

    ctx = click.get_current_context()
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
        elif given or name not in configured:
            values[name] = value
        else:
            values[name] = configured[name]
    spec = JobSpec(script=script, args=tuple(args), **values)
    if not spec.module and not Path(script).is_file():
        hint = " (a directory: give the script inside it)" if Path(script).is_dir() else ""
        raise SpecError(f"training script {script!r} not found{hint}: give a path relative to the directory you "
                        "submit from, or use -m package.module")
    return spec, tuple(configured.get("template_dirs", [])) + tuple(template_dirs)


def _render(spec: JobSpec, template_dirs: Sequence[str]) -> str:
    from .render import render  # jinja2 is only needed once a script is rendered

    return render(spec, template_dirs=template_dirs)


def _summary(spec: JobSpec) -> str:
    per = f"{spec.gpus_per_node} GPU(s)" if spec.gpus_per_node else f"{spec.tasks_per_node} CPU rank(s)"
    return (f"{spec.nodes} node(s) x {per} = world size {spec.world_size} "
            f"({spec.launcher} launcher, {spec.backend})")


@cli.command("render", epilog=EXAMPLES.format(cmd="render"))
@spec_options
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write here instead of stdout.")
def render_command(script: str, args: Sequence[str], output: Optional[str], template_dirs: Sequence[str], **opts: Any) -> None:
    """Print the sbatch script for SCRIPT [-- ARGS...] (or write it with -o FILE)."""
    spec, template_dirs = build_spec(script, args, template_dirs, **opts)
    text = _render(spec, template_dirs)
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
        Path(output).write_text(text)
        click.echo(f"clusterddp: wrote {output}: {_summary(spec)}", err=True)
    else:
        click.echo(text, nl=False)


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
    spec, template_dirs = build_spec(script, args, template_dirs, **opts)
    if local:
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
        click.echo(_render(spec, template_dirs), nl=False)
        click.echo(f"clusterddp: dry run, nothing submitted: {_summary(spec)}", err=True)
        return
    from . import slurm

    record = slurm.submit(spec, template_dirs, check=not no_check, note=lambda line: click.echo(f"clusterddp: {line}",
                                                                                                  err=True))
    job_id = record.job_id
    click.echo(job_id)
    click.echo(f"clusterddp: submitted job {job_id}: {_summary(spec)}\n"
               f"  script {record.script_path}\n  log    {record.batch_log}\n  ranks  {record.run_dir}/", err=True)
    if wait_:
        sys.exit(_wait(job_id, on_interrupt, record))


def _wait(job_id: str, on_interrupt: str, record: Optional[Any]) -> int:
    from . import slurm

    start = time.monotonic()

    def show(job: Any) -> None:
        where = f" on {job.node_list}" if job.state == "RUNNING" and job.node_list else ""
        why = f" ({job.reason})" if job.reason and job.reason not in ("None", "") and not job.done else ""
        click.echo(f"clusterddp: job {job_id} {job.state}{where}{why} [{time.monotonic() - start:.1f} s]", err=True)

    try:
        final = slurm.wait(job_id, on_change=show)
        if not final.done:  # pending on a dependency that can no longer be met
            click.echo(f"clusterddp: {_reason(final)}", err=True)
            return 1
    except KeyboardInterrupt:
        choice = on_interrupt
        if choice == "ask":
            choice = "detach"
            if sys.stdin.isatty():
                choice = "cancel" if click.confirm(f"\nCancel job {job_id}?", default=False, err=True) else "detach"
        if choice == "cancel":
            slurm.cancel(job_id)
            click.echo(f"clusterddp: cancelled job {job_id}", err=True)
        else:
            click.echo(f"clusterddp: stopped watching; job {job_id} goes on (clusterddp status {job_id})", err=True)
        return 130
    code = final.return_code
    click.echo(f"clusterddp: job {job_id} ended {final.state}, exit code {code}", err=True)
    if code != 0 and record is not None:
        _show_failure(record)
    return code


def _show_failure(record: Any) -> None:
    """Name every log with a traceback and print the most likely root cause in full."""
    from .logscan import summary, tracebacks

    found = tracebacks([Path(p) for p in record.logs()] + [Path(record.batch_log)])
    click.echo(summary(found, f"{record.run_dir}/ and {record.batch_log}" if not found else record.run_dir), err=True)


@cli.command("explain", epilog=EXAMPLES.format(cmd="explain"))
@spec_options
def explain_command(script: str, args: Sequence[str], template_dirs: Sequence[str], **opts: Any) -> None:
    """Explain the job SCRIPT [-- ARGS...] would be, without submitting: world size, the node/rank/GPU table,
    MASTER_ADDR/PORT, every variable the script sees and known mistakes."""
    from .explain import explain as explain_spec

    click.echo(explain_spec(build_spec(script, args, template_dirs, **opts)[0]), nl=False)


@cli.command("status")
@click.argument("job_ids", nargs=-1)
def status_command(job_ids: Sequence[str]) -> None:
    """State, elapsed time, nodes and exit code of JOBID... (default: jobs submitted from here recently)."""
    from . import slurm
    from .record import state_dir

    if not job_ids:
        records = sorted(state_dir().glob("*.json"), key=lambda p: p.stat().st_mtime)[-10:]
        job_ids = [p.stem for p in records]
        if not job_ids:
            raise SpecError("no job ids given and no jobs submitted with clusterddp here yet")
    rows = [("JOBID", "STATE", "ELAPSED", "NODES", "NODELIST", "EXIT", "REASON")]
    failed = 0
    for job_id in job_ids:
        try:
            j = slurm.info(job_id)
        except slurm.JobNotFound as exc:
            if len(job_ids) == 1:
                raise
            rows.append((job_id, "UNKNOWN", "", "", "", "", str(exc).split(":")[0]))
            failed += 1
            continue
        exit_ = "" if j.exit_code is None else (f"{j.exit_code}" + (f" (signal {j.signal})" if j.signal else ""))
        rows.append((j.job_id, j.state, j.elapsed, j.nodes, j.node_list, exit_, "" if j.done else _reason(j)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if failed:
        sys.exit(1)


def _reason(job: Any) -> str:
    if job.reason == "DependencyNeverSatisfied":
        # Slurm keeps such a job pending forever (unless kill_invalid_depend is set).
        return f"DependencyNeverSatisfied: a job it depends on failed, so it will never start (clusterddp cancel {job.job_id})"
    return job.reason


@cli.command("cancel")
@click.argument("job_id")
def cancel_command(job_id: str) -> None:
    """Cancel JOBID (scancel)."""
    from . import slurm

    slurm.cancel(job_id)
    click.echo(f"clusterddp: cancel requested for job {job_id}", err=True)


@cli.command("logs")
@click.argument("job_id")
@click.option("--rank", type=int, help="Show this rank's output instead of the batch log.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
def logs_command(job_id: str, rank: Optional[int], follow: bool) -> None:
    """Print the batch log of JOBID, or one rank's log with --rank N."""
    from . import slurm
    from .errors import LogNotFound
    from .record import JobRecord

    record = JobRecord.load(job_id)
    prefix = None
    if record is None:
        info = slurm.info(job_id)  # JobNotFound when Slurm never heard of it
        if not info.stdout_path:
            raise LogNotFound(f"no log path known for job {job_id} (not submitted with clusterddp here?)")
        if rank is not None:
            raise SpecError(f"job {job_id} was not submitted with clusterddp here: no rank logs known")
        path = Path(info.stdout_path)
    elif rank is None:
        path = Path(record.batch_log)
    else:
        world = record.nodes * record.procs_per_node
        if not 0 <= rank < world:
            raise SpecError(f"--rank {rank} is outside the job's ranks 0..{world - 1}")
        path, prefix = record.rank_log(rank)
        if record.launcher == "spawn":
            first = rank - rank % record.procs_per_node
            click.echo(f"clusterddp: spawn jobs log per node: {path.name} holds ranks {first}-"
                       f"{first + record.procs_per_node - 1}", err=True)
    _print_log(job_id, path, prefix, follow)


def _print_log(job_id: str, path: Path, prefix: Optional[str], follow: bool) -> None:
    from . import slurm

    def emit(chunk: str) -> None:
        if prefix is None:
            click.echo(chunk, nl=False)
        else:
            click.echo("".join(line for line in chunk.splitlines(True) if line.startswith(prefix)), nl=False)

    if not path.exists() and not follow:
        from .errors import LogNotFound

        raise LogNotFound(f"log {path} does not exist (yet): the job may still be pending; try clusterddp logs "
                          f"{job_id} --follow")
    pos, partial = 0, ""
    try:
        while True:
            if path.exists():
                with path.open("r", errors="replace") as fh:
                    fh.seek(pos)
                    text = partial + fh.read()
                    pos = fh.tell()
                # While following, hold back a half-written last line so prefixes are matched on whole lines.
                cut = text.rfind("\n") + 1 if follow else len(text)
                text, partial = text[:cut], text[cut:]
                if text:
                    emit(text)
            if not follow:
                if partial:
                    emit(partial)
                return
            if slurm.info(job_id).done:
                follow = False  # one more read: the last lines may land just after the state changes
            time.sleep(0.5)
    except KeyboardInterrupt:
        return


@cli.command("doctor")
@click.option("-N", "--nodes", type=int, default=2, show_default=True)
@click.option("-G", "--gpus", "--gpus-per-node", "gpus_per_node", type=int, default=D("gpus_per_node"),
              show_default=True)
@click.option("--procs-per-node", type=int, help="Ranks per node without GPUs. [default: 1]")
@click.option("-p", "--partition")
@click.option("-A", "--account")
@click.option("-q", "--qos")
@click.option("-C", "--constraint")
@click.option("-t", "--time", default="5", show_default=True)
@click.option("-e", "--env", "env", multiple=True, metavar="NAME=VALUE")
@click.option("--setup", multiple=True, metavar="LINE")
@click.option("--python", default=D("python"), show_default=True)
@click.option("--output-dir", default=D("output_dir"), show_default=True)
@click.option("--local", is_flag=True, help="Run the check on this machine instead of Slurm.")
def doctor_command(local: bool, env: Sequence[str], **opts: Any) -> None:
    """Submit a tiny job on the requested shape that initialises the process group and times all-reduces;
    report per-rank hosts, interfaces, latency and bandwidth, and a verdict (exit 1 when something is wrong).

    \b
      clusterddp doctor --nodes 2 --gpus 8 -p gpu
    """
    from . import doctor as doc
    from . import slurm

    spec = JobSpec(doc.JOB_MODULE, module=True, launcher="srun", job_name="clusterddp-doctor", requeue=False,
                   env=parse_env(env), **opts)
    click.echo(f"clusterddp: doctor on {spec.nodes} node(s) x {spec.tasks_per_node} rank(s)", err=True)
    if local:
        from .local import make_plan, pick_port, run, visible_gpus
        from .contract import default_port

        lines: List[str] = []
        plan = make_plan(spec, os.path.join(spec.output_dir, f"clusterddp-doctor-local-{os.getpid()}"),
                         pick_port(default_port(os.getpid())), os.getpid(),
                         visible_gpus() if spec.gpus_per_node else [])
        code = run(plan, quiet=True, echo=lines.append, note=lambda line: click.echo(line, err=True))
        text = "\n".join(lines)
    else:
        record = slurm.submit(spec, note=lambda line: click.echo(f"clusterddp: {line}", err=True))
        click.echo(f"clusterddp: doctor job {record.job_id} submitted; waiting", err=True)
        code = slurm.wait(record.job_id).return_code
        log = record.rank_log(0)[0]
        text = log.read_text(errors="replace") if log.exists() else ""
    report = doc.parse(text)
    if report is None:
        raise slurm.SlurmError(f"the doctor job ended (exit code {code}) without a report; its output:\n"
                               + text[-3000:])
    click.echo(doc.format_report(report, local), nl=False)
    sys.exit(0 if doc.verdict(report, local)[0] and code == 0 else 1)


@cli.group("config")
def config_group() -> None:
    """Profiles: defaults from clusterddp.toml ([tool.clusterddp] in pyproject.toml) and the user config."""


@config_group.command("show")
@click.option("-P", "--profile", help="Show the values with this profile applied.")
def config_show(profile: Optional[str]) -> None:
    """Print every setting with its merged value and where it came from."""
    from .config import project_file, show, user_file

    text = show(profile)
    path, _ = project_file(skipped=[])
    click.echo(f"# user file:    {user_file()}{'' if user_file().is_file() else ' (none)'}")
    click.echo(f"# project file: {path or '(none: clusterddp.toml or [tool.clusterddp] in pyproject.toml)'}")
    click.echo(text, nl=False)


@cli.command("new")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True, help="Overwrite PATH if it exists.")
def new_command(path: str, force: bool) -> None:
    """Write a runnable, commented DDP training script to PATH (the fastest way from a single-GPU loop to DDP)."""
    from .skeleton import SKELETON

    from .quoting import check_no_control, shell_quote

    check_no_control(path, "file name")
    target = Path(path)
    if target.exists() and not force:
        raise SpecError(f"{path} already exists; not overwriting it (use --force, or choose another name)")
    target.parent.mkdir(parents=True, exist_ok=True)
    # The name appears in the skeleton's docstring as a shell word: escaped for the docstring too, so that no
    # file name can end the string and write code into the script.
    shown = shell_quote(target.name).replace("\\", "\\\\").replace('"', '\\"')
    target.write_text(SKELETON.format(name=shown))
    click.echo(f"clusterddp: wrote {path}; try: clusterddp submit --local --procs-per-node 2 {path}", err=True)


def main(argv: Optional[List[str]] = None) -> None:
    cli.main(args=argv, prog_name="clusterddp")


if __name__ == "__main__":  # pragma: no cover
    main()
