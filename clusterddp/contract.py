"""What the batch script promises the ranks, defined once.

The login side (templates, local backend, Python API) sets these and the job side (``clusterddp.runtime``) reads
them. The templates keep readable literals (``CLUSTERDDP_RUN_DIR``, ``rank-%t.out``); tests/test_contract.py holds
them equal to the names here. Imports nothing from clusterddp: both sides may use it.
"""
from __future__ import annotations

from typing import Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

# --- variables the script exports to every rank -------------------------------------------------------------
LAUNCHER = "CLUSTERDDP_LAUNCHER"                # torchrun | srun | spawn
NNODES = "CLUSTERDDP_NNODES"
GPUS_PER_NODE = "CLUSTERDDP_GPUS_PER_NODE"
PROCS_PER_NODE = "CLUSTERDDP_PROCS_PER_NODE"    # ranks per node
WORLD_SIZE = "CLUSTERDDP_WORLD_SIZE"            # what the job was rendered for; the runtime checks it
RUN_DIR = "CLUSTERDDP_RUN_DIR"                  # the job's run directory (logs, checkpoints)
STOP_FILE = "CLUSTERDDP_STOP_FILE"              # exists once the job is asked to stop (time limit, preemption)
LOCAL = "CLUSTERDDP_LOCAL"                      # set by the local backend
LOCAL_NODE = "local{index}"                     # the local backend's emulated nodes' names
RESTARTS = "CLUSTERDDP_RESTARTS"                # how often Slurm requeued this job (0 at first)
HANG_TIMEOUT = "CLUSTERDDP_HANG_TIMEOUT"        # seconds without progress on any rank before the watchdog acts
#: Read by the runtime, set by the user (not by the script): the rendezvous must complete within it.
TIMEOUT = "CLUSTERDDP_TIMEOUT"
#: Set by `clusterddp drill` only: where each rank records its steps, values and checkpoints (runtime/drill.py),
#: and the step at which should_stop() answers True, as at a time limit.
DRILL_DIR = "CLUSTERDDP_DRILL_DIR"
DRILL_STOP_AT = "CLUSTERDDP_DRILL_STOP_AT"
#: Set only by the drill for its own runs: a job started otherwise (sbatch exports the submitting shell, a local run
#: inherits it) never sees them (the batch script unsets them; the local runner drops them unless the drill gave them).
DRILL_VARIABLES = (DRILL_DIR, DRILL_STOP_AT)
DRILL_HOLD = "hold-after-first-checkpoint"  # a file in DRILL_DIR: every rank waits there until it is gone
# The kinds of scenario `clusterddp drill` runs ("kill" is kill-nodeN on several emulated nodes); here, not in
# drill.py, so that the CLI offers them as choices without importing the drill at every start-up.
DRILL_SCENARIOS = ("stop", "kill")
DRILL_SERIAL = "CLUSTERDDP_DRILL_SERIAL"  # 1: the drill runs its scenarios one after another (default: side by side)
#: Exported by the batch script (templates/base.sh.j2) and by the local backend.
EXPORTED: Tuple[str, ...] = (LAUNCHER, NNODES, GPUS_PER_NODE, PROCS_PER_NODE, WORLD_SIZE, RUN_DIR, RESTARTS,
                            HANG_TIMEOUT)

# --- hangs: the control plane's files in the run directory and its exit codes -------------------------------
DEFAULT_HANG_TIMEOUT_S = 900
#: Until any rank first shows progress after init() (compilation, first data loading) the limit is this many
#: timeouts.
HANG_STARTUP_FACTOR = 2
#: A secret per run of the job (the batch script and the local backend make it): the name of the watchdog's progress
#: counter in the rendezvous store, which anyone who reaches MASTER_PORT could otherwise write.
WATCH_KEY = "CLUSTERDDP_WATCH_KEY"
EXPORTED += (WATCH_KEY,)
HELLO_FILE = "stacks/ranks/rank-{rank}.json"  # written by each rank at init(): node, pid, state, restart count
#: Written by a rank's exception hook (installed by init()) when an exception ends it: its type, where, when; the
#: supervisor's evidence of a program fault (a record, not text the program printed).
EXCEPTION_FILE = "stacks/ranks/exception-{rank}.json"
#: Step telemetry (runtime/telemetry.py writes, observe/telemetry.py reads): per rank and attempt, where its steps'
#: time went. ``CLUSTERDDP_TELEMETRY=0`` turns it off (no comm hook, no file).
TELEMETRY = "CLUSTERDDP_TELEMETRY"
TELEMETRY_FILE = "telemetry/restart-{restarts}/rank-{rank}.json"
#: Peer heal (issue 55): ``CLUSTERDDP_PEER_HEAL=0`` (``submit --no-peer-heal``) turns it off: a lost node's job then
#: resumes from the last checkpoint only. Survivors keep their state under CLUSTERDDP_PEER_DIR (default /dev/shm).
PEER_HEAL = "CLUSTERDDP_PEER_HEAL"
PEER_DIR = "CLUSTERDDP_PEER_DIR"
#: Warm starts (runtime/warm.py): the job's key for its per-node warm servers; unset: every rank starts cold.
WARM = "CLUSTERDDP_WARM"
#: Set in a forked torchrun agent's environment (its pid): its workers, warm clients, end with it (runtime/warmrun.py).
WARM_AGENT = "CLUSTERDDP_WARM_AGENT"
#: Rank 0's record of where each attempt started, one JSON line per load_latest: {"time", "restart", "how": peer |
#: checkpoint | fresh, "step", "why" (peer heal not used), "nodes" (the survivors')}; status and report read it.
RECOVERY_FILE = "recovery.jsonl"
#: ``CLUSTERDDP_TENSORBOARD=0``: no TensorBoard event files (RUN_DIR/tensorboard/) even where tensorboard is installed.
TENSORBOARD = "CLUSTERDDP_TENSORBOARD"
TELEMETRY_POS = "telemetry/restart-{restarts}/rank-{rank}.pos"  # "<steps done> <Unix time>": rewritten every step
#: One recent step: its number (counted across resumes), when it ended (Unix time), its seconds, then the phases'.
TELEMETRY_ROW = ("step", "end", "total", "data", "compute", "comm", "opt", "ckpt")
TELEMETRY_PHASES = ("data", "compute", "comm", "opt", "ckpt")
REQUEST_FILE = "stacks/request"              # `clusterddp stacks` writes a dump name here; every rank answers
DUMP_DIR = "stacks/{name}"                   # rank-N.json (for tools) and rank-N.txt (for people) per rank
HANG_DIR = "stacks/hang-{restarts}"          # the watchdog's dumps and roll call (rollcall.txt, rollcall.json)
RENDEZVOUS_REPORT = "stacks/rendezvous-{restarts}.txt"  # who never arrived, when the rendezvous timed out
NCCL_TRACE_DIR = "nccl-trace"                # PyTorch's NCCL flight recorder dumps (TORCH_NCCL_DEBUG_INFO_TEMP_FILE)
#: What NCCL jobs get, from the batch script and the local backend alike (--no-flight-recorder: none of it): the
#: flight recorder keeps each rank's last collectives and dumps them to ``{trace}`` (RUN_DIR/nccl-trace/rank_) on a
#: timeout or hang; a failed collective aborts the job instead of hanging it.
FLIGHT_RECORDER = (("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"), ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"),
                   ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "{trace}"), ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"))


def flight_recorder(trace: str, user_env: Sequence[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """FLIGHT_RECORDER with the dump prefix filled in, less what the user set with ``-e`` (the user's value wins)."""
    given = {name for name, _ in user_env}
    return [(name, value.format(trace=trace)) for name, value in FLIGHT_RECORDER if name not in given]

# --- exit codes: of the CLI, of a job that the runtime or the batch script ended ----------------------------
class ExitCode(NamedTuple):  # (NamedTuples: a frozen dataclass costs the CLI's start-up ~0.7 ms each)
    name: str
    code: int
    meaning: str


#: Every exit code clusterddp gives, once: the CLI's error classes, the runtime, the local backend and the batch
#: script (through the render context, ``exit.NAME``) use these numbers; docs/reference.md's table is checked
#: against it.
EXIT_CODES: Tuple[ExitCode, ...] = (
    ExitCode("OK", 0, "success (a job: every rank exited 0)"),
    ExitCode("RUNTIME", 1, "a runtime error (Slurm, SSH, a failed job, a file that cannot be written)"),
    ExitCode("USAGE", 2, "a usage error (an option, a value, a spec, a template): nothing was submitted"),
    ExitCode("REQUEUE_LIMIT", 75, "the job reached its requeue limit (--max-requeues) at a time limit or "
                                  "preemption; its last checkpoint is kept"),
    ExitCode("NO_SCONTROL", 76, "the job should requeue but scontrol is missing where it runs (a container?)"),
    ExitCode("RENDEZVOUS", 78, "ranks never arrived at the rendezvous (named in the log)"),
    ExitCode("HANG", 79, "the hang watchdog ended the job: no rank advanced for --hang-timeout (roll call in the "
                         "log)"),
    ExitCode("INTERRUPTED", 130, "Ctrl-C (a local run, or --wait told to stop)"),
)
EXIT: Dict[str, int] = {e.name: e.code for e in EXIT_CODES}
RENDEZVOUS_EXIT = EXIT["RENDEZVOUS"]
HANG_EXIT = EXIT["HANG"]

# --- the rendezvous port ------------------------------------------------------------------------------------
#: MASTER_PORT = PORT_BASE + job id mod PORT_SPAN: below Linux's ephemeral ports (32768-60999), and jobs with
#: nearby ids never share a port. When it is taken, the next free one in the span (wrapping) is used.
PORT_BASE, PORT_SPAN = 20000, 10000
PORT_SCHEME = f"{PORT_BASE} + job id mod {PORT_SPAN}"


def default_port(job_id: int) -> int:
    return PORT_BASE + job_id % PORT_SPAN


def port_candidates(port: int) -> Iterator[int]:
    """The ports tried after ``port`` is taken, in order (every port of the span once)."""
    for i in range(PORT_SPAN):
        yield PORT_BASE + (port - PORT_BASE + i) % PORT_SPAN


# --- spawn placeholders -------------------------------------------------------------------------------------
#: {name} in the arguments of a spawn job -> what it becomes on each node (the variables the template reads).
PLACEHOLDERS: Dict[str, str] = {
    "master_addr": "MASTER_ADDR", "master_port": "MASTER_PORT", "node_rank": "SLURM_NODEID", "nnodes": NNODES,
    "gpus_per_node": PROCS_PER_NODE, "world_size": WORLD_SIZE,
}


def fill_placeholders(arg: str, values: Mapping[str, str]) -> str:
    """Replace every {name} of ``values`` in one argument; the replacement is never read again (as the template
    does). Spawn's placeholders (PLACEHOLDERS) and a sweep's parameters both go through here."""
    out, i = [], 0
    while i < len(arg):
        for name in values:
            token = "{" + name + "}"
            if arg.startswith(token, i):
                out.append(values[name])
                i += len(token)
                break
        else:
            out.append(arg[i])
            i += 1
    return "".join(out)


# --- sweeps: what a trial's batch script exports and writes --------------------------------------------------
PARAM_PREFIX = "CLUSTERDDP_PARAM_"     # + the parameter's name in capitals: its value for this trial
TRIAL = "CLUSTERDDP_TRIAL"             # the trial's index in its sweep (= the array task id)
TRIAL_FILE = "trial.json"              # in the trial's run directory: sweep, index, key, parameters
#: ``clusterddp migrate --check``: each runtime.loader stops an epoch after this many batches and records the
#: sample indices it gave this rank (CHECK_FILE), so the check can say how the ranks' data differed.
CHECK_STEPS = "CLUSTERDDP_CHECK_STEPS"
CHECK_FILE = "check/rank-{rank}-loader-{loader}.json"
CHECK_SECOND_EPOCH = "check/rank-{rank}-second-epoch"  # a runtime.loader of this rank began a second epoch
CHECK_MODELS = "check/rank-{rank}-models.json"  # at shutdown: a digest of each wrapped model's parameters
RUN_ID = "CLUSTERDDP_RUN_ID"           # set by init(): the job's identity for trackers (runtime.run_id())
#: In the run directory: {"cluster", "job", "token"}, written at a new job's start (healing/identity.py), kept across
#: its requeues and retries; runtime.run_id() hashes it, so a reused path or job id is another run for the trackers.
IDENTITY_FILE = "identity.json"
#: A checkpoint (file, or a directory: its newest) to start from when the run has none of its own: another run's
#: (fine-tuning, or a resubmitted job continuing a finished one). Checkpointer.load_latest(start_from=...) too.
START_FROM = "CLUSTERDDP_START_FROM"
METRICS_FILE = "metrics.jsonl"         # runtime.report(): one JSON object per line, appended by rank 0


# --- files in the run directory -----------------------------------------------------------------------------
def batch_log(stem: str, job_id: str) -> str:
    return f"{stem}-{job_id}.out"


def run_dir(stem: str, job_id: str) -> str:
    return f"{stem}-{job_id}"


RANK_LOG = "rank-{rank}.out"        # srun launcher: srun's --output=rank-%t.out
NODE_LOG = "node-{node}.out"        # torchrun and spawn: srun's --output=node-%n.out
RANK_LOG_PATTERN, NODE_LOG_PATTERN = "rank-%t.out", "node-%n.out"
STOP_FILE_NAME = "stop-requested-{restarts}"    # one per restart: a requeued job does not see the old request
#: One line per attempt that ended (the batch script appends; `status JOBID` reads), tab-separated fields:
ATTEMPTS_FILE = "attempts.tsv"
# Each allocation the job held (one per requeue): "begin RESTART TIME HOSTS" from the supervisor's start, "end RESTART
# TIME" from the batch shell's EXIT trap; the goodput ledger's whole (node-seconds Slurm allocated).
ALLOCATIONS_FILE = "allocations.tsv"
LOCAL_JOB_FILE = "local-job.json"  # a local run's runner: id, pid and host, then its exit code (backends/local/jobs)
LOCAL_LOG = "runner.log"           # a local run's own lines (its "batch log": clusterddp logs L7)
ATTEMPT_FIELDS = ("restart", "attempt", "start", "end", "nodes", "exit", "fault", "fault_nodes", "why", "next",
                  "evidence")
#: What ``next`` says: the step ran again in this allocation, the job requeued itself without the node at fault,
#: or the job ended (done: the step succeeded or stopped at the time limit).
NEXT_RETRY, NEXT_REQUEUE, NEXT_END = "retry", "requeue", "end"
#: ... or it ran again on the same nodes (an ambiguous fault; or a requeue without the node would never start).
NEXT_IN_PLACE = "in-place"
NEXTS = (NEXT_RETRY, NEXT_IN_PLACE, NEXT_REQUEUE, NEXT_END)
#: The health gate of one attempt: NODE.out (its output) and NODE.ok (it passed) per node.
HEALTH_DIR = "health/{restarts}.{attempt}"
#: The job's partition as sinfo saw it before the supervisor's last decision (whether a requeue would still fit).
SINFO_FILE = "health/sinfo.txt"
#: A failed attempt's logs and reports, moved here before the next attempt starts with fresh ones.
ATTEMPT_DIR = "attempts/{restarts}.{attempt}"
STEP_ERR = "srun-{restarts}.{attempt}.err"  # srun's own messages of one attempt (also in the batch log)
#: torchrun --tee prefixes each line of a node log with the worker's local rank.
TORCHRUN_PREFIX = "[default{local_rank}]:"


# --- the launchers: what differs between them, once ---------------------------------------------------------
class Launcher(NamedTuple):
    name: str
    task_per_rank: bool            # Slurm starts every rank (srun); else one task per node starts its node's ranks
    line_prefix: Optional[str]     # how a rank's lines are marked in its node's log (None: a log of its own)
    login_command: Optional[str]   # what the login node's PATH must have for the batch script to start it

    def log(self, rank: int, per_node: int) -> Tuple[str, Optional[str]]:
        """(log file name in the run directory, line prefix or None) of one rank's output."""
        if self.task_per_rank:
            return RANK_LOG.format(rank=rank), None
        node, local = divmod(rank, max(1, per_node))
        return NODE_LOG.format(node=node), self.line_prefix.format(local_rank=local) if self.line_prefix else None

    def slurm_tasks_per_node(self, ranks_per_node: int) -> int:
        return ranks_per_node if self.task_per_rank else 1


LAUNCHERS: Dict[str, Launcher] = {
    "torchrun": Launcher("torchrun", False, TORCHRUN_PREFIX, "torchrun"),
    "srun": Launcher("srun", True, None, None),
    "spawn": Launcher("spawn", False, None, None),
}

# --- what a job started from inside another job must not inherit --------------------------------------------
#: sbatch reads SBATCH_* as options; srun reads SRUN_*; stale SLURM_* values of a parent job mislead the child
#: (CPU binding, node lists). SLURM_CONF says which cluster to talk to and stays.
PARENT_JOB_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_")
KEPT_FROM_PARENT = frozenset({"SLURM_CONF"})


def without_parent_job(environ: Mapping[str, str]) -> Dict[str, str]:
    """``environ`` without the variables of a Slurm job we may be running inside."""
    return {k: v for k, v in environ.items() if k in KEPT_FROM_PARENT or not k.startswith(PARENT_JOB_PREFIXES)}


# --- names a user's environment may not set ----------------------------------------------------------------
#: Environment names that -e and profile env may not set: the batch script, srun, torchrun (PET_* are its
#: options) and bash itself read them, so a value there could redirect the job or run code.
RESERVED_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "CLUSTERDDP_", "PET_", "TORCHELASTIC_")
RESERVED_ENV_NAMES = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
    "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "RUN_DIR",
    "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "IFS", "CDPATH", "GLOBIGNORE", "PS4", "BASH_XTRACEFD",
    "POSIXLY_CORRECT", "BASH_COMPAT", "FUNCNEST", "PROMPT_COMMAND",
    "BASH_VERSINFO", "EUID", "UID", "PPID", "BASHPID",  # readonly in bash: exporting them fails the script
})


#: The job side's options a user sets per job (-e/--env, a profile's env): read by the runtime alone.
USER_ENV_NAMES = frozenset({TELEMETRY, START_FROM})


def reserved_env_name(name: str) -> bool:
    if name in USER_ENV_NAMES:
        return False
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES) or name.startswith("BASH_FUNC_")
