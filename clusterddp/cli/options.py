"""The job spec options (spelled like sbatch's, defaults from JobSpec) and how their values, over the configured
profiles, become a validated JobSpec: shared by render, submit, explain, sweep and drill."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

import click

from ..contract import PORT_SCHEME
from ..errors import SpecError
from ..job.spec import GPU_REQUESTS, LAUNCHERS, JobSpec, field_default, parse_env
from .base import CLUSTER_OPTION

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


#: What Slurm is asked for: nodes, GPUs, CPUs, memory, time, where.
SHAPE_OPTIONS = [
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
]

#: How the job runs: files, environment, launcher.
RUN_OPTIONS = [
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
]

#: Time limits, requeue, retries, hangs.
HEALING_OPTIONS = [
    click.option("--requeue/--no-requeue", default=None,
                 help="Before the time limit, ask every rank to checkpoint and stop, then requeue the job "
                      "[default: on when --time is given]."),
    click.option("--max-requeues", type=int, default=D("max_requeues"), show_default=True,
                 help="Requeue at most this often (SLURM_RESTART_COUNT)."),
    click.option("--expedite/--no-expedite", default=None,
                 help="Submit with sbatch --requeue=expedite (Slurm 25.11+, where the site sets "
                      "SlurmctldParameters=enable_expedited_requeue): a requeue after a node fault starts again at "
                      "once instead of after Slurm's requeue delay (120 s); a time-limit requeue still waits it "
                      "[default: where the cluster allows it, asked at submission]."),
    click.option("--retries", type=int, default=D("retries"), show_default=True,
                 help="Run the job step again after a fault that is not the program's, at most this often (0 = "
                      "off): on evidence against a node (Slurm's word, a roll call its ranks could not answer) on a "
                      "spare, or else requeued with that node excluded; after one killed rank, a segfault or a hang "
                      "in your own code, once in place (no node blamed). It resumes from the survivors' memory "
                      "(peer heal) where it was kept, else from the last checkpoint. A Python exception is never "
                      "retried (docs/node-failure.md)."),
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
    click.option("--peer-heal/--no-peer-heal", default=D("peer_heal"), show_default=True,
                 help="When a node is lost, resume from the state the surviving ranks kept in memory (at most the "
                      "step in flight redone; nothing read from the checkpoint directory) where it applies: "
                      "2+ nodes, a Checkpointer whose save() steps count optimizer steps. Else, and with "
                      "--no-peer-heal, from the last checkpoint."),
    click.option("--warm-start/--no-warm-start", default=D("warm_start"), show_default=True,
                 help="--launcher srun or torchrun: one server per node imports torch once and forks every rank "
                      "from it, so a retry's ranks (after a lost node) start without importing torch again (and the "
                      "first attempt imports it once per node, not once per rank; under torchrun each node's agent "
                      "is forked too). The ranks share the "
                      "server's job step (its CPUs, memory and GPUs: the job's on that "
                      "node; Slurm's memory kill then names that step). A node without a server starts its ranks "
                      "as usual."),
    click.option("--flight-recorder/--no-flight-recorder", default=D("flight_recorder"), show_default=True,
                 help="NCCL jobs: PyTorch's flight recorder keeps each rank's last collectives and writes them "
                      "into the run directory on a timeout or hang (TORCH_NCCL_TRACE_BUFFER_SIZE)."),
]

#: Containers, arrays, templates, profiles and the script itself.
ENTRY_OPTIONS = [
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

def spec_options(f: Callable) -> Callable:
    """The job spec options shared by render, submit, sweep and drill (spelled like sbatch's); defaults come from
    JobSpec."""
    for option in reversed(SHAPE_OPTIONS + RUN_OPTIONS + HEALING_OPTIONS + ENTRY_OPTIONS):
        f = option(f)
    return f


def build_spec(script: str, args: Sequence[str], template_dirs: Sequence[str] = (), profile: Optional[str] = None,
               local: bool = False, **opts: Any) -> Any:
    """Options as Click parsed them, over the configured defaults -> (validated JobSpec, template directories).

    An option given on the command line wins; otherwise a value from the profile/config/environment layers;
    otherwise the built-in default. --env merges with configured env, --setup and --sbatch-arg append.
    """
    from click.core import ParameterSource

    from ..job.clusters import choose
    from ..job.config import resolve, skip_warning

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
        from ..backends.slurm.preflight import script_not_found

        raise SpecError(str(script_not_found(script)))
    if not spec.module and spec.world_size > 1:  # (one process running DataParallel is a job of its own)
        said = single_process_script(Path(script))
        if said:
            click.echo(f"clusterddp: warning: {said}", err=True)
    return spec, tuple(configured.get("template_dirs", [])) + tuple(template_dirs), cluster


def single_process_script(path: Path) -> str:
    """A DataParallel script not migrated (no DDP, no clusterddp.runtime): every rank would run DataParallel over
    the GPUs it sees, each on the whole data set. '' when none is seen (the script is read as text, never run)."""
    import re

    try:
        text = path.read_text(encoding="utf-8", errors="replace")[:2_000_000]
    except OSError:
        return ""
    if not re.search(r"(?<![A-Za-z_])DataParallel\s*\(", text) or re.search(
            r"DistributedDataParallel|clusterddp|init_process_group", text):
        return ""
    return (f"{path.name} uses nn.DataParallel and no DDP: each rank would run DataParallel over the GPUs it sees, "
            f"each on the whole data set; clusterddp migrate {path.name} rewrites it (docs/migrate.md)")


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
    from ..healing import quarantine

    held = quarantine.active(cluster)
    new = [n for n in sorted(held) if n not in exclude]
    if new:
        click.echo("clusterddp: leaving out node(s) quarantined after a fault: " + "; ".join(
            f"{n} (job {held[n]['job']}: {held[n]['reason']})" for n in new)
            + f"; clusterddp nodes{'' if cluster == 'here' else ' --cluster ' + cluster} lists them, "
              "--no-quarantine uses them", err=True)
    return tuple(exclude) + tuple(new)


