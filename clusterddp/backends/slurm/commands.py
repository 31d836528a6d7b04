"""Slurm's commands (argv lists, never a shell; the Python API submits through submitit), run through a host:
this machine (``Here``) or a cluster's login node (``Ssh``). ``Slurm(host)`` runs them and parses what they print;
pure parsers are module functions. The only module that names sbatch, squeue, sacct, scontrol, scancel or sinfo.

Job state comes from ``squeue`` while the job is queued or running, then ``sacct`` (clusters with accounting),
then ``scontrol show job`` (kept for MinJobAge seconds after the end, the only source without accounting).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from ...errors import JobNotFound, SlurmError, SlurmUnreachable
from ...job.ids import check_job_id, is_job_number
from ...job.parse import POLL_MAX, poll_max
from ...rollcall import printable
from ..hosts import Here
from ..jobinfo import JobInfo

if TYPE_CHECKING:
    from ..hosts import Host


#: What Slurm's clients print when there is no cluster to talk to (checked on 22.05): no configuration at all
#: (no slurm.conf, no SLURM_CONF, no DNS SRV record), an unreadable one, or a controller that does not answer.
_UNREACHABLE = re.compile(r"Could not establish a configuration source|resolve_ctls_from_dns_srv|"
                          r"Unable to contact slurm controller|Unable to establish controller machine|"
                          r"s_p_parse_file: unable to (?:read|status)|Unable to process configuration file|"
                          r"Unable to connect to slurmctld")
WAYS_FORWARD = ("--local runs the job on this machine; SLURM_CONF=/path/to/slurm.conf names a cluster's "
                "configuration; --cluster NAME submits over SSH to a [clusters.NAME] host = ... of the config; "
                "--dry-run prints the script without submitting")


def configured_here() -> bool:
    """Whether this machine has Slurm's commands and a configuration for them. sbatch alone is not a cluster (a
    laptop may have slurm-client); configless sites (DNS SRV) are not seen here (the API's backend="slurm")."""
    import shutil

    configured = bool(os.environ.get("SLURM_CONF")) or any(
        os.path.exists(p) for p in ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf"))
    return bool(shutil.which("sbatch")) and configured


def unreachable(command: str, said: str) -> SlurmUnreachable:
    first = next((line.strip() for line in said.splitlines() if _UNREACHABLE.search(line)), said.strip()[:200])
    conf = os.environ.get("SLURM_CONF")
    tried = f"SLURM_CONF={conf}" if conf else "the default configuration (no SLURM_CONF)"
    return SlurmUnreachable(f"Slurm is not reachable from here: `{command}` (with {tried}) said {first!r}. "
                            f"Ways forward: {WAYS_FORWARD}")


@dataclass
class Partition:
    name: str
    nodes: int
    max_time_s: Optional[int]  # None: unlimited
    gpus_per_node: int         # the most any node of the partition has
    cpus_per_node: int
    mem_mb_per_node: int
    default: bool = False
    names: Tuple[str, ...] = ()  # its nodes


def _gpu_count(gres: str) -> int:
    """GPUs in an sinfo GRES field such as ``gpu:2``, ``gpu:a100:4(S:0-1)`` or ``gpu:2,shard:8``."""
    found = (re.match(r"^gpu(?::[^:(]+)?:(\d+)", part.strip()) for part in gres.split(","))
    return sum(int(m.group(1)) for m in found if m)


def parse_partitions(listing: str) -> Dict[str, Partition]:
    """``sinfo --Node --format=%P|%N|%G|%c|%m|%l`` (one line per node and partition) -> the partitions."""
    from ...job.parse import parse_time

    nodes: Dict[str, set] = {}
    out: Dict[str, Partition] = {}
    for line in listing.splitlines():
        parts = line.split("|")
        if len(parts) != 6:
            continue
        name, node, gres, cpus, mem, limit = parts
        default = name.endswith("*")
        name = name.rstrip("*")
        if name not in out:
            max_time = None if limit in ("infinite", "UNLIMITED", "n/a") else parse_time(limit)
            out[name] = Partition(name, 0, max_time, 0, 0, 0, default)
        p = out[name]
        nodes.setdefault(name, set()).add(node)
        p.nodes = len(nodes[name])
        p.names = tuple(sorted(nodes[name]))
        p.gpus_per_node = max(p.gpus_per_node, _gpu_count(gres))
        p.cpus_per_node = max(p.cpus_per_node, int(cpus.rstrip("+") or 0))
        p.mem_mb_per_node = max(p.mem_mb_per_node, int(re.sub(r"\D.*", "", mem) or 0))
    return out


def _parse_exit(text: str) -> tuple:
    m = re.match(r"^(\d+):(\d+)$", text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def parse_scontrol(text: str) -> Dict[str, str]:
    """``scontrol show job -o`` prints one line of Key=Value pairs; values may hold spaces (Command=...)."""
    fields: Dict[str, str] = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9:_/]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9:_/]*=|\s*$)", text.strip()):
        fields.setdefault(m.group(1), m.group(2))
    return fields


def script_argv(script: "str | Path", remote: bool) -> List[str]:
    """The script as sbatch's last argument: absolute, after '--', so no directory name can read as an option
    (``--output-dir '--wrap=...'`` must never become ``sbatch --wrap``). --ignore-pbs also here, for scripts from
    site templates that replace the directives block: #PBS/#BSUB lines are never options."""
    return ["--ignore-pbs", "--", str(script) if remote else str(Path(script).resolve())]


class Slurm:
    """One cluster's Slurm, reached through ``host`` (this machine, or a login node over SSH)."""

    def __init__(self, host: "Host") -> None:
        self.host = host

    @classmethod
    def here(cls) -> "Slurm":
        """This machine's own Slurm (SLURM_CONF)."""
        return cls(Here())

    def run(self, argv: Sequence[str], check: bool = True, timeout: float = 60,
            cwd: Optional[str] = None) -> subprocess.CompletedProcess:
        """Run one Slurm command; a missing binary or a non-zero exit becomes a SlurmError carrying argv and stderr.
        No cluster to talk to (no commands, no configuration, no controller) is SlurmUnreachable, whatever
        ``check``. On a remote cluster the command runs on its login node, in ``cwd`` there."""
        if self.host.remote:
            return self._run_remote(argv, check, timeout, cwd)
        conf = os.environ.get("SLURM_CONF")
        if conf and not os.path.isfile(conf):
            # Slurm's clients would look for a configless controller through DNS first: about a minute (22.05).
            raise SlurmUnreachable(f"Slurm is not reachable from here: SLURM_CONF={conf} is not a file, so "
                                   f"`{argv[0]}` cannot know a cluster. Ways forward: {WAYS_FORWARD}")
        try:
            proc = self.host.run(argv, cwd=cwd, timeout=timeout)
        except FileNotFoundError:
            raise SlurmUnreachable(f"Slurm is not installed here: `{argv[0]}` is not on PATH, so no cluster can be "
                                   f"asked. Ways forward: {WAYS_FORWARD}; or run clusterddp on the cluster's login "
                                   "node") from None
        except subprocess.TimeoutExpired:
            raise SlurmUnreachable(f"Slurm is not reachable from here: `{argv[0]}` did not answer within "
                                   f"{timeout:.0f} s (is slurmctld up?). Ways forward: {WAYS_FORWARD}") from None
        if proc.returncode != 0 and _UNREACHABLE.search(proc.stderr):
            raise unreachable(argv[0], proc.stderr)
        if check and proc.returncode != 0:
            raise SlurmError(f"{argv[0]} failed", argv, proc.returncode, proc.stderr)
        return proc

    def _run_remote(self, argv: Sequence[str], check: bool, timeout: float,
                    cwd: Optional[str]) -> subprocess.CompletedProcess:
        cluster = self.host.cluster
        proc = self.host.run(argv, cwd=cwd, timeout=timeout)
        where = self.host.where()
        if proc.returncode == 127 and "not found" in proc.stderr:
            raise SlurmUnreachable(f"`{argv[0]}` is not on PATH on the login node of {where}: add a setup line that "
                                   f"provides Slurm to [clusters.{cluster.name}] (e.g. setup = [\"module load "
                                   "slurm\"])")
        if proc.returncode != 0 and _UNREACHABLE.search(proc.stderr):
            first = next(line.strip() for line in proc.stderr.splitlines() if _UNREACHABLE.search(line))
            raise SlurmUnreachable(f"Slurm is not reachable on {where}: `{argv[0]}` said {first!r}; its setup lines "
                                   "must give Slurm's commands their configuration (SLURM_CONF, module load slurm)")
        if check and proc.returncode != 0:
            raise SlurmError(f"{argv[0]} failed on {where}", argv, proc.returncode, proc.stderr)
        return proc

    def sbatch(self, script: str, hold: bool = False, cwd: Optional[str] = None) -> str:
        """Submit ``script`` (held with ``hold``) and return the job id (``sbatch --parsable`` prints
        ``id[;cluster]``). The job's working directory is ``cwd`` (remote clusters) or this one."""
        argv = ["sbatch", "--parsable", *(["--hold"] if hold else []), *script_argv(script, self.host.remote)]
        proc = self.run(argv, cwd=cwd)
        job_id = proc.stdout.strip().split(";", 1)[0]
        if not is_job_number(job_id):
            after = ""
            if hold:  # a job it may have queued waits held forever: find it by its script (a unique path), end it
                ended = self._cancel_held(argv[-1])
                after = (f"; the held job it queued ({', '.join(ended)}) was cancelled" if ended else
                         f"; no held job of yours runs {printable(argv[-1])}")
            raise SlurmError(f"sbatch printed no job id (got {printable(proc.stdout.strip()[:200])!r}){after}", argv,
                             proc.returncode, proc.stderr)
        return job_id

    def _cancel_held(self, script: str) -> List[str]:
        """Cancel this user's pending jobs whose command is ``script``; their ids (none when squeue cannot say)."""
        try:
            listing = self.run(["squeue", "--me", "--noheader", "--states=PENDING", "--format=%i %o"]).stdout
        except SlurmError:
            return []
        ids = [job for job, _, command in (ln.strip().partition(" ") for ln in listing.splitlines())
               if command == script and is_job_number(job)]
        if ids:
            try:
                self.run(["scancel", "--", *ids])
            except SlurmError:
                return []
        return ids

    def test_only(self, script: str, cwd: Optional[str] = None) -> str:
        """``sbatch --test-only``: Slurm's own check that the request fits, without queueing. Returns its message."""
        proc = self.run(["sbatch", "--test-only", *script_argv(script, self.host.remote)], cwd=cwd)
        return (proc.stderr or proc.stdout).strip()

    def release(self, job_id: str) -> None:
        self.run(["scontrol", "release", check_job_id(job_id)])

    def partitions(self) -> Dict[str, Partition]:
        """What the cluster offers, per partition (from sinfo, one line per node)."""
        return parse_partitions(self.run(["sinfo", "--noheader", "--Node", "--format=%P|%N|%G|%c|%m|%l"]).stdout)

    def max_array_size(self) -> Optional[int]:
        """Slurm's MaxArraySize (array task ids go below it), from scontrol show config; None: unknown."""
        m = re.search(r"^MaxArraySize\s*=\s*([0-9]+)", self._config(), re.M)
        return int(m.group(1)) if m else None

    def expedited_requeue(self) -> bool:
        """Whether jobs may ask for an expedited requeue (Slurm 25.11+: SlurmctldParameters lists
        enable_expedited_requeue); False where scontrol cannot tell."""
        m = re.search(r"^SlurmctldParameters\s*=\s*(\S*)", self._config(), re.M)
        return m is not None and "enable_expedited_requeue" in m.group(1).split(",")

    def _config(self) -> str:
        return self.run(["scontrol", "show", "config"], check=False).stdout or ""

    def cancel(self, job_id: str) -> None:
        """scancel JOBID, after checking that Slurm knows the job (a clear JobNotFound, not scancel's terse one)."""
        job_id = check_job_id(job_id)
        self.info(job_id)
        self.run(["scancel", job_id])

    def run_in_job(self, job_id: str, nodes: int, argv: Sequence[str],
                   timeout: float = 60) -> subprocess.CompletedProcess:
        """Run ``argv`` once on each node of a running job, beside its steps (srun --overlap shares their CPUs
        instead of waiting for free ones). Returns the finished process; stderr carries what each node said."""
        job_id = check_job_id(job_id)
        return self.run(["srun", "--overlap", f"--jobid={job_id}", f"--nodes={nodes}", f"--ntasks={nodes}",
                         "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--quiet", "--", *argv], check=False,
                        timeout=timeout)

    def array_tasks(self, job_ids: Sequence[str]) -> Dict[str, Tuple[str, str]]:
        """This user's queued tasks of the arrays ``job_ids``, one squeue call: "1234_5" -> (state, elapsed).
        Raises when the queue cannot be read (a queued task must never look as if it never ran)."""
        proc = self.run(["squeue", "--me", "--noheader", "--array", "--format=%i|%T|%M"])
        ids = set(job_ids)
        out = {}
        for line in (proc.stdout or "").splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3 and parts[0].split("_")[0] in ids:
                out[parts[0]] = (parts[1], parts[2])
        return out

    def _from_squeue(self, job_id: str) -> Optional[JobInfo]:
        proc = self.run(["squeue", "--noheader", "--jobs", job_id, "--format=%i|%T|%r|%M|%D|%N"], check=False)
        if proc.returncode != 0:
            return None  # an unknown or already purged id
        for line in proc.stdout.splitlines():
            parts = line.split("|")
            if len(parts) == 6 and parts[0] == job_id:
                return JobInfo(job_id, parts[1], reason=parts[2], elapsed=parts[3], nodes=parts[4],
                               node_list=parts[5])
        return None

    def _from_sacct(self, job_id: str) -> Optional[JobInfo]:
        proc = self.run(["sacct", "--noheader", "--parsable2", "--allocations", "--jobs", job_id,
                         "--format=JobID,State,Elapsed,NNodes,NodeList,ExitCode"], check=False)
        if proc.returncode != 0:
            return None  # no accounting storage on this cluster
        for line in proc.stdout.splitlines():
            parts = line.split("|")
            if len(parts) == 6 and parts[0] == job_id:
                code, sig = _parse_exit(parts[5])
                # sacct writes "CANCELLED by 0"; keep the state word only.
                return JobInfo(job_id, parts[1].split()[0], elapsed=parts[2], nodes=parts[3], node_list=parts[4],
                               exit_code=code, signal=sig)
        return None

    def _from_scontrol(self, job_id: str) -> Optional[JobInfo]:
        proc = self.run(["scontrol", "--oneliner", "show", "job", job_id], check=False)
        if proc.returncode != 0:
            return None
        f = parse_scontrol(proc.stdout.splitlines()[0] if proc.stdout else "")
        if not f.get("JobState"):
            return None
        code, sig = _parse_exit(f.get("ExitCode", ""))
        return JobInfo(job_id, f["JobState"], reason=f.get("Reason", ""), elapsed=f.get("RunTime", ""),
                       nodes=f.get("NumNodes", ""), node_list=f.get("NodeList", ""), exit_code=code, signal=sig,
                       stdout_path=f.get("StdOut", ""))

    def info(self, job_id: str) -> JobInfo:
        """The job's state from the first source that knows it: squeue, then sacct, then scontrol."""
        job_id = check_job_id(job_id)
        queued = self._from_squeue(job_id)
        if queued is not None and not queued.done:
            # squeue has no exit code; scontrol adds it (and the log path) while it still has the job.
            detail = self._from_scontrol(job_id)
            return detail if detail is not None else queued
        for source in (self._from_sacct, self._from_scontrol):
            found = source(job_id)
            if found is not None:
                return found
        raise JobNotFound(f"job {job_id} is unknown to Slurm (squeue, sacct and scontrol do not know it): check the "
                          "id; finished jobs are forgotten after MinJobAge on clusters without accounting")

    def wait(self, job_id: str, on_change: Callable[[JobInfo], None] = lambda i: None, poll: float = 0.5,
             max_poll: Optional[float] = None) -> JobInfo:
        """Follow a job until it ends, calling ``on_change`` whenever its state changes; returns the final JobInfo.
        Looks ``poll`` s after a change, backing off to ``max_poll`` (default: CLUSTERDDP_POLL_MAX)."""
        if max_poll is None:
            max_poll, problem = poll_max(os.environ.get(POLL_MAX, ""))
            if problem:
                print(f"clusterddp: warning: {problem}", file=sys.stderr)
        last = None
        delay = poll
        while True:
            current = self.info(job_id)
            key = (current.state, current.reason)
            if key != last:
                on_change(current)
                last = key
                delay = poll
            if current.done or current.never_starts:
                return current
            time.sleep(delay)
            delay = min(max_poll, delay * 1.5)
