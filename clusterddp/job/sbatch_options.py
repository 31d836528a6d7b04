"""sbatch's long options, to read an ``--sbatch-arg`` the way sbatch itself will.

sbatch parses ``#SBATCH`` lines with getopt_long, which takes any unambiguous prefix of a long option
(``--out=x`` is ``--output=x``) and has aliases (``--tasks-per-node`` is ``--ntasks-per-node``). So an option
clusterddp computes can only be protected by resolving names as sbatch does. The table was read off the
sbatch of Slurm 22.05, 24.11 and 26.05 (their getopt "ambiguous; possibilities" messages and "requires an
argument" answers); the tests check it against the releases on real clusters. Names are resolved against the
union, so a prefix that any release finds ambiguous is refused (a script must mean the same on each); names newer
still are passed through.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from ..errors import SpecError
from .quoting import shown

NO_VALUE: Tuple[str, ...] = (
    "contiguous", "help", "hold", "ignore-pbs", "no-requeue", "overcommit", "oversubscribe", "parsable", "quiet",
    "reboot", "requeue", "spread-job", "test-only", "use-min-nodes", "usage", "verbose", "version", "wait")
OPTIONAL_VALUE: Tuple[str, ...] = ("exclusive", "get-user-env", "nice", "no-kill", "propagate")
# Slurm 24.11 added these (read off its sbatch the same way) and dropped --power.
SINCE_24_11 = {"autocomplete": "required", "container-id": "required", "extra": "required",
               "oom-kill-step": "optional", "resv-ports": "optional", "segment": "required", "stepmgr": "none",
               "tres-bind": "required", "tres-per-task": "required"}
# Slurm 26.05 added these (read off its sbatch, Debian forky's 26.05.5) and dropped none of 24.11's.
SINCE_26_05 = {"consolidate-segments": "none", "container-type": "required", "external": "none",
               "mem-update": "required", "resources": "required", "spread-segments": "none"}
# ... and gave --requeue an optional value (--requeue=expedite, Slurm 25.11's expedited requeue).
VALUE_SINCE_26_05 = ("requeue",)
UNTIL_22_05 = ("power",)
REQUIRED_VALUE: Tuple[str, ...] = (
    "account", "acctg-freq", "array", "batch", "begin", "bb", "bbf", "cluster-constraint", "chdir", "cluster",
    "clusters", "comment", "container", "context", "constraint", "core-spec", "cores-per-socket", "cpu-freq",
    "cpus-per-gpu", "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution", "error", "exclude",
    "export", "export-file", "extra-node-info", "gid", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node",
    "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "hint", "input", "mail-type", "mail-user",
    "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus", "network", "nodefile", "nodelist",
    "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket",
    "ntasks-per-tres", "open-mode", "output", "partition", "power", "prefer", "priority", "profile", "qos",
    "reservation", "signal", "sockets-per-node", "switches", "tasks-per-node", "thread-spec", "threads-per-core",
    "time", "time-min", "tmp", "uid", "wait-all-nodes", "wckey", "wrap", "job-name", "kill-on-invalid-dep",
    "licenses")
for _added in (SINCE_24_11, SINCE_26_05):
    NO_VALUE += tuple(n for n, kind in _added.items() if kind == "none")
    OPTIONAL_VALUE += tuple(n for n, kind in _added.items() if kind == "optional")
    REQUIRED_VALUE += tuple(n for n, kind in _added.items() if kind == "required")
KNOWN = set(NO_VALUE) | set(OPTIONAL_VALUE) | set(REQUIRED_VALUE)  # every release


def known_in(release: str) -> set:
    """The option names of one release's sbatch ("22.05", "24.11", "26.05")."""
    if release.startswith("22."):
        return KNOWN - set(SINCE_24_11) - set(SINCE_26_05)
    if release.startswith("24."):
        return KNOWN - set(UNTIL_22_05) - set(SINCE_26_05)
    return KNOWN - set(UNTIL_22_05)


def no_value_in(release: str) -> set:
    """The options of one release's sbatch that take no value."""
    return set(NO_VALUE) & known_in(release) - (set(VALUE_SINCE_26_05) if release >= "26" else set())
# Two names, one option (getopt sees the same option and does not call a shared prefix ambiguous).
ALIASES = {"tasks-per-node": "ntasks-per-node", "cluster": "clusters"}

# Options clusterddp computes or relies on, with what to use instead.
_RANKS = "--gpus / --procs-per-node (ranks per node are computed from them)"
OWNED: Dict[str, str] = {
    "nodes": "--nodes", "ntasks": _RANKS, "ntasks-per-node": _RANKS, "ntasks-per-core": _RANKS,
    "ntasks-per-socket": _RANKS, "ntasks-per-gpu": _RANKS, "ntasks-per-tres": _RANKS,
    "gpus": "--gpus", "gpus-per-node": "--gpus", "gpus-per-task": "--gpu-request gpus-per-task",
    "gpus-per-socket": "--gpus", "gres": "--gpus with --gpu-request gres", "cpus-per-task": "--cpus-per-task",
    "tres-per-task": "--gpus and --cpus-per-task (Slurm 24.11's per-task resources)",
    "mem": "--mem", "time": "--time", "partition": "--partition", "account": "--account", "qos": "--qos",
    "constraint": "--constraint", "job-name": "--job-name",
    "exclude": "--exclude (clusterddp adds the quarantined nodes to it: clusterddp nodes)",
    "output": "--output-dir", "error": "--output-dir (stderr goes to the batch log that clusterddp reads)",
    "signal": "--signal-before (with --requeue)", "requeue": "--requeue", "no-requeue": "--no-requeue",
    "open-mode": "--requeue (a requeued job appends to its logs)", "array": "--array", "dependency": "--after",
    "chdir": "cd to the directory first (the script's paths are relative to where you submit)",
    "wrap": "the training script (--wrap would replace it)", "ignore-pbs": "nothing: clusterddp always sets it",
    "parsable": "nothing: clusterddp reads sbatch's answer itself", "test-only": "the pre-flight checks of submit",
    "wait": "clusterddp submit --wait", "clusters": "SLURM_CONF (clusterddp follows the job on one cluster)",
    "help": "sbatch --help", "usage": "sbatch --help", "version": "sbatch --version",
}


def canonical(name: str) -> str:
    return ALIASES.get(name, name)


def resolve(arg: str) -> Tuple[str, Optional[str]]:
    """``--name[=value]`` -> (full canonical name, value or None) as sbatch would read it; refuses what clusterddp
    owns, ambiguous prefixes, and values that do not fit the option."""
    name, eq, value = arg[2:].partition("=")
    if name in KNOWN:
        matches = {canonical(name)}
    else:
        matches = {canonical(n) for n in KNOWN if n.startswith(name)}
    owned = sorted(m for m in matches if m in OWNED)
    if owned:
        read_as = "" if name in KNOWN or canonical(name) == owned[0] else f" (sbatch reads --{name} as --{owned[0]})"
        raise SpecError(f"--sbatch-arg {shown(arg)} sets --{owned[0]}{read_as}, which clusterddp computes; use "
                        f"{OWNED[owned[0]]} instead")
    if len(matches) > 1:
        raise SpecError(f"--sbatch-arg {shown(arg)}: --{name} is ambiguous to sbatch (could be "
                        f"{', '.join('--' + m for m in sorted(matches))}); write the option out in full")
    if not matches:
        return name, (value if eq else None)  # unknown to 22.05-26.05: a newer option, or sbatch refuses it
    full = matches.pop()
    if eq and full in NO_VALUE:
        raise SpecError(f"--sbatch-arg {shown(arg)}: --{full} takes no value; write --sbatch-arg=--{full}")
    if not eq and full in REQUIRED_VALUE:
        raise SpecError(f"--sbatch-arg {shown(arg)}: --{full} needs a value, joined with '=' "
                        f"(e.g. --sbatch-arg=--{full}=VALUE)")
    return full, (value if eq else None)
