"""The project's code on a remote cluster: what of the directory is copied (git's rules), the copy itself
(REMOTE_DIR/<name>, checked private on the way there), and each submission's snapshot of it, which its job runs.
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, List, Optional, Tuple

from ... import contract
from ...errors import ClusterUnreachable, PreflightError
from ...job.clusters import Cluster, human_size
from ...job.code import output_top, selected_names
from ...job.quoting import shown
from ...rollcall import printable
from .connection import host_path, lib_dir, push_lib, require_protect_args, rsync, sh, where

if TYPE_CHECKING:
    from ...job.spec import JobSpec

SNAPSHOTS_DIR = ".snapshots"  # under remote_dir: one copy of the code per submission (<project>/<time>-<random>)
#: How code goes out: recursive, links as links, permissions and times kept, compressed; --checksum, since size and
#: time alone miss an edit of the same size within the same second.
COPY_ARGS = ["-rlptz", "--checksum"]


@dataclass(frozen=True)
class Transfer:
    files: List[str]   # what was sent (changed or new), as rsync names them
    bytes_sent: int    # on the wire, after compression and deltas


def _parse_transfer(stdout: str) -> Transfer:
    files = [ln[len("cddp> "):] for ln in stdout.splitlines() if ln.startswith("cddp> ") and not ln.endswith("/")]
    m = re.search(r"Total bytes sent: ([0-9,.]+)", stdout)
    return Transfer(files, int(re.sub(r"[,.]", "", m.group(1))) if m else 0)


@dataclass(frozen=True)
class CodeDir:
    """The project's code directory on the cluster (absolute), what the last copy sent, and the submission's
    snapshot of it."""

    path: str          # the project's copy: REMOTE_DIR/<name>, the job's outputs under it
    sent: Transfer
    snapshot: str = ""  # this submission's own copy of the files (the job's working directory)


# New directories are private (umask 077). Then every directory from the code directory and the modules' directory
# up to / must be this user's or root's and writable by nobody else unless sticky (/tmp): another user's directory
# on the way (a /scratch/alice made by someone else first) could swap train.py or the modules before the job runs.
# $1 code directory, $2 modules' directory, $3 where the code comes from (host:absolute path), $4 the code
# directory to use instead when $1 holds another project's copy (same directory name, another origin). Relative
# paths are from the home there (sh() starts there); both are made absolute (pwd -P) before anything else is
# resolved, and the walk up is bounded: it reaches /, or ends the script (exit 3) saying what it found.
_PREPARE = r"""
umask 077
mkdir -p -- "$2" && lib="$(cd -- "$2" && pwd -P)" && [ -n "$lib" ] || exit 3
code="$1"
if [ -f "$code/.clusterddp-origin" ] && [ "$(cat -- "$code/.clusterddp-origin")" != "$3" ]; then code="$4"; fi
mkdir -p -- "$code" && cd -- "$code" || exit 3
[ -f .clusterddp-origin ] || printf '%s\n' "$3" > .clusterddp-origin
pwd -P
me="$(id -u)"
for top in "$(pwd -P)" "$lib"; do
    d="$top"
    n=0
    while :; do
        case "$d" in /*) ;; *) echo "cannot resolve $top to an absolute path" >&2; exit 3 ;; esac
        bad="$(find "$d" -maxdepth 0 \( \( ! -uid "$me" ! -uid 0 \) -o \( -perm /022 ! -perm -1000 \) \) -print)"
        [ -z "$bad" ] || echo "unsafe $d"
        [ "$d" = / ] && break
        n=$((n + 1))
        [ "$n" -lt 256 ] || { echo "$top is deeper than 256 directories" >&2; exit 3; }
        d="$(dirname -- "$d")"
    done
done
shift 4
for c in "$@"; do command -v -- "$c" >/dev/null 2>&1 || echo "missing $c"; done
"""


# Where _PREPARE would put the code, changing nothing (for --dry-run): $1-$3 as _PREPARE's $1, $3, $4. A directory
# not made yet is resolved through its deepest existing parent, as pwd -P resolves the made one (bounded as above).
_WHERE = r"""
code="$1"
if [ -f "$code/.clusterddp-origin" ] && [ "$(cat -- "$code/.clusterddp-origin")" != "$2" ]; then code="$3"; fi
case "$code" in /*) ;; *) code="$(pwd -P)/$code" ;; esac
rest=""
n=0
while [ ! -d "$code" ] && [ "$n" -lt 256 ]; do
    rest="/$(basename -- "$code")$rest"; code="$(dirname -- "$code")"; n=$((n + 1))
done
printf '%s%s\n' "$(cd -- "$code" && pwd -P)" "$rest"
"""


def _origin(cluster: Cluster, local_dir: Path) -> Tuple[str, str]:
    """This directory's mark in its copy there, and the other copy's place when another directory has it."""
    origin = f"{socket.gethostname()}:{local_dir.resolve()}"
    return origin, f"{remote_code_dir(cluster, local_dir)}-{hashlib.sha256(origin.encode()).hexdigest()[:8]}"


def code_dir(cluster: Cluster, local_dir: Path) -> str:
    """The absolute directory the code of ``local_dir`` goes to there (``prepare``'s answer, nothing made)."""
    origin, alternative = _origin(cluster, local_dir)
    proc = sh(cluster, _WHERE, [remote_code_dir(cluster, local_dir), origin, alternative])
    path = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else ""
    if not path.startswith("/"):
        raise ClusterUnreachable(f"cannot tell where the code of {local_dir} goes on {where(cluster)}: "
                                 f"{proc.stderr.strip()[:300] or 'no answer'}")
    return path


def remote_code_dir(cluster: Cluster, local_dir: Path) -> str:
    """Where the directory you submit from goes: REMOTE_DIR/<its name>."""
    return f"{cluster.remote_dir.rstrip('/')}/{local_dir.resolve().name or 'root'}"


def _rsync_reads_differently(local_dir: Path) -> Optional[str]:
    """Without git, rsync reads the .gitignore files: the first pattern it reads otherwise than git, or None."""
    for top, subdirs, files in os.walk(local_dir):
        subdirs[:] = [d for d in subdirs if d != ".git"]
        if ".gitignore" not in files:
            continue
        path = Path(top) / ".gitignore"
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for number, line in enumerate(lines, 1):
            if line.startswith(("!", "\\")) or (line.strip() and line != line.rstrip()):
                return f"{path.relative_to(local_dir)}:{number}: {line!r}"
    return None


def _filters(spec: "JobSpec", local_dir: Path) -> List[str]:
    """Without git: rsync reads the .gitignore files itself (refused where it reads a line otherwise than git)."""
    differs = _rsync_reads_differently(local_dir)
    if differs:
        raise PreflightError(f"without git, rsync reads the .gitignore files, and it reads {differs} otherwise "
                             "than git (a trailing space, a backslash escape or a negation): install git, which "
                             "then decides what is copied, or rewrite that line")
    out_top = output_top(spec, local_dir)
    return ["--filter=:- .gitignore", "--exclude=/.git/", "--exclude=__pycache__/"] + \
        ([f"--exclude=/{out_top}/"] if out_top else [])


@contextmanager
def code_selection(spec: "JobSpec", local_dir: Path,
                   names: Optional[List[str]] = None) -> Iterator[List[str]]:
    """rsync arguments that choose what of ``local_dir`` is copied. In a git work tree, the files git lists (so
    every rule git applies counts: .gitignore files up to the top of the repository, .git/info/exclude, the global
    excludes file), given as a --files-from list; elsewhere, the directory's .gitignore files, read by rsync.
    Never copied: .git, __pycache__, the local runs' output directory."""
    keep = names if names is not None else selected_names(spec, local_dir)
    if keep is None:
        yield _filters(spec, local_dir)
        return
    with tempfile.NamedTemporaryFile(prefix="clusterddp-files-") as listing:
        listing.write(b"\0".join(os.fsencode(n) for n in keep))
        listing.flush()
        yield ["--from0", f"--files-from={listing.name}"]


def check_copy(cluster: Cluster, spec: "JobSpec", local_dir: Path) -> None:
    """Before connecting: the job's script is among what will be copied (not ignored), and the copy is not larger
    than the cluster's max_copy (a dataset that is not in .gitignore would otherwise be sent on every change, over
    what may be a laptop's link). The files are listed by rsync itself with the same selection, so what is
    checked is what would be copied."""
    require_protect_args()
    with tempfile.TemporaryDirectory(prefix="clusterddp-size-") as empty, code_selection(spec, local_dir) as chosen:
        try:
            proc = subprocess.run(["rsync", "-rl", "--dry-run", "--out-format=%l %n", *chosen, "--",
                                   f"{local_dir.resolve()}/", f"{empty}/"], capture_output=True, text=True,
                                  timeout=600, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            return  # said by the copy itself, with how to install rsync
    sizes = []
    for line in proc.stdout.splitlines():
        length, _, name = line.partition(" ")
        if length.isdigit() and name and not name.endswith("/"):
            sizes.append((int(length), name))
    if proc.returncode == 0 and not spec.module and os.path.normpath(spec.script) not in {n for _, n in sizes}:
        raise PreflightError(f"training script {spec.script!r} would not be copied to cluster {cluster.name!r}: "
                             f"it is ignored (.gitignore, .git/info/exclude or git's global excludes) or lies in "
                             f"{spec.output_dir!r}; take it out of the ignore rules, or move it")
    total = sum(n for n, _ in sizes)
    if not cluster.max_copy or total <= cluster.max_copy:
        return
    largest = ", ".join(f"{shown(name)} ({human_size(n)})" for n, name in sorted(sizes, reverse=True)[:3])
    raise PreflightError(
        f"the directory to copy to cluster {cluster.name!r}, {local_dir.resolve()}, holds {human_size(total)} in "
        f"{len(sizes)} file(s), more than max_copy = {human_size(cluster.max_copy)} of [clusters.{cluster.name}]; "
        f"largest: {largest}. Add data and checkpoints to .gitignore (they stay here; put them on the cluster's "
        f"own file system and pass their path), submit from a smaller directory, or raise max_copy "
        f"(\"0\": no limit)")


def make_code_dir(cluster: Cluster, spec: "JobSpec", local_dir: Path, check: bool = True) -> str:
    """The project's copy there made (private, checked on the way up) and the commands the job needs found:
    its absolute path, or one line that says what is wrong."""
    command = contract.LAUNCHERS[spec.launcher].login_command
    needed = [spec.python] + ([command] if command and not spec.apptainer
                              and not spec.container_image else [])
    origin, alternative = _origin(cluster, local_dir)
    proc = sh(cluster, _PREPARE, [remote_code_dir(cluster, local_dir), lib_dir(cluster) + "/clusterddp", origin,
                                  alternative, *(needed if check else []), "rsync"])
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or not lines or not lines[0].startswith("/"):
        raise ClusterUnreachable(f"cannot create the code directory {remote_code_dir(cluster, local_dir)} on "
                                 f"{where(cluster)}: {proc.stderr.strip()[:300] or 'no answer'}; check remote_dir in "
                                 f"[clusters.{cluster.name}]")
    path = lines[0]
    unsafe = list(dict.fromkeys(ln[len("unsafe "):] for ln in lines[1:] if ln.startswith("unsafe ")))
    if unsafe:
        raise PreflightError(f"the code would go to {path} on {where(cluster)}, but {printable(unsafe[0])} on the way "
                             "is another user's or writable by others (they could swap your files before the job "
                             f"starts): choose a remote_dir of your own in [clusters.{cluster.name}] (for example "
                             "under your home there), or ask the owner to make it yours (chmod go-w)")
    missing = [ln[len("missing "):] for ln in lines[1:] if ln.startswith("missing ")]
    if "rsync" in missing:
        raise ClusterUnreachable(f"rsync is not installed on {where(cluster)}: it copies your code there; ask the "
                                 "admins, or add a setup line that puts it on PATH")
    if missing:
        fix = (f"set --python to the interpreter of your environment there, or add a setup line to "
               f"[clusters.{cluster.name}] that provides it (setup = [\"module load python\"] or "
               f"[\"source ~/venv/bin/activate\"])")
        maybe = " (the job's setup lines may provide it: --no-check skips this check)" if spec.setup[1:] else ""
        raise PreflightError(f"{where(cluster)} has no {' and no '.join(shown(m) for m in missing)} on PATH "
                             f"(after its setup lines): the job needs the Python environment with torch there; "
                             f"{fix}{maybe}")
    return path


def prepare(cluster: Cluster, spec: "JobSpec", local_dir: Path, check: bool = True) -> CodeDir:
    """Connect, make the code directory, check the commands the job needs (pre-flight), copy the code (what
    changed since the last copy; .gitignore'd files, .git and the output directory stay here) and clusterddp's
    job-side modules. Returns the absolute code directory there."""
    path = make_code_dir(cluster, spec, local_dir, check)
    names = selected_names(spec, local_dir)
    with code_selection(spec, local_dir, names) as chosen:
        sent = rsync(cluster, [*COPY_ARGS, "--stats", "--out-format=cddp> %n", *chosen,
                                "--", f"{local_dir.resolve()}/", host_path(cluster, path + "/")], "the code")
    push_lib(cluster)
    return CodeDir(path, _parse_transfer(sent.stdout), snapshot(cluster, spec, local_dir, path, names))


# The submission's own copy of the code, for the job to run (the project's copy changes with the next submit while
# this job may still be queued): hard links to the files just copied (rsync --link-dest), so only what a later copy
# replaces takes space (a copy writes a new file and renames it, so a link here keeps the submitted content).
# $1 the project's copy (absolute), $2 its snapshots' directory, $3 a name prefix; then rsync's selection
# arguments; a --files-from list arrives on stdin, base64-encoded (names are bytes).
_SNAPSHOT = r"""
umask 077
mkdir -p -- "$2" && s="$(mktemp -d -- "$2/$3-XXXXXX")" || exit 3
code="$1"
shift 3
base64 -d | rsync -rlpt --link-dest="$code" "$@" -- "$code/" "$s/" || { rm -rf -- "$s"; exit 4; }
printf '%s\n' "$s"
"""


def snapshots_dir(path: str) -> str:
    """Where the snapshots of the project copy at ``path`` go: REMOTE_DIR/.snapshots/<its name>."""
    return f"{os.path.dirname(path)}/{SNAPSHOTS_DIR}/{os.path.basename(path)}"


def snapshot(cluster: Cluster, spec: "JobSpec", local_dir: Path, path: str, names: Optional[List[str]]) -> str:
    """A new snapshot of the project copy at ``path`` (as just copied): the directory this submission's job runs
    in."""
    if names is None:
        args, listing = _filters(spec, local_dir), b""
    else:
        args, listing = ["--from0", "--files-from=-"], b"\0".join(os.fsencode(n) for n in names)
    proc = sh(cluster, _SNAPSHOT, [path, snapshots_dir(path), time.strftime("%Y%m%d-%H%M%S"), *args],
              input=base64.b64encode(listing).decode("ascii"), timeout=600)
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].startswith("/"):
        raise ClusterUnreachable(f"cannot make this submission's copy of the code under {snapshots_dir(path)} on "
                                 f"{where(cluster)}: {printable(proc.stderr.strip()[:300]) or 'no answer'}")
    return lines[-1]
