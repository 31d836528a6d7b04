"""A cluster reached over SSH: the system's ``ssh`` (so ~/.ssh/config, ProxyJump, agents and two-factor prompts
work as they do for you), one shared connection per cluster (ControlMaster: a second command costs a round trip,
not a login), ``rsync`` for code going out and logs coming back. Login side; slurm.py sends Slurm commands here.

No password is stored or passed on a command line: ssh asks on your terminal, once per shared connection.
Remote command lines are built in one place (``remote_line``): the cluster's ``setup`` lines (your code, verbatim),
then ``cd`` and the command, every word shell-quoted: sh lines, which a csh or fish login shell gets wrapped for the
cluster's ``shell`` (and, without one, is recognised and named).
"""
from __future__ import annotations

import base64
import functools
import hashlib
import os
import re
import shlex
import socket
import stat
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence, Tuple

from . import dirs
from .clusters import Cluster, human_size
from .errors import ClusterUnreachable, PreflightError
from .quoting import shown
from .rollcall import printable

if TYPE_CHECKING:
    from .record import JobRecord
    from .spec import JobSpec

CONNECT_TIMEOUT_S = 15
CONTROL_PERSIST = "10m"
SNAPSHOTS_DIR = ".snapshots"  # under remote_dir: one copy of the code per submission (<project>/<time>-<random>)
LIB_DIR = ".lib"  # under remote_dir on the cluster: clusterddp's own modules (<hash>/clusterddp), for jobs and tools
#: What is copied back from a run directory: logs and reports, never checkpoints or data.
PULL_FILTER = ["--include=*/", "--include=*.out", "--include=*.txt", "--include=*.json", "--include=*.log",
               "--include=rank_*", "--exclude=*"]
#: How code goes out: recursive, links as links, permissions and times kept, compressed; --checksum, since size and
#: time alone miss an edit of the same size within the same second.
COPY_ARGS = ["-rlptz", "--checksum"]
#: How a run directory comes back: recursive, times kept, symlinks skipped (no -l), empty directories left out.
PULL_ARGS = ["-rt", "--no-links", "--prune-empty-dirs", *PULL_FILTER]


def control_dir() -> Path:
    """Where the shared connections' sockets live: private to this user (a socket there is a logged-in session).
    Short, because a socket path has at most 107 bytes."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    d = Path(base) / "clusterddp-ssh" if base and os.path.isdir(base) and len(base) < 40 else \
        Path("/tmp") / f"clusterddp-ssh-{os.geteuid()}"
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        st = d.lstat()
    except OSError as exc:
        raise ClusterUnreachable(f"cannot make {d} for ssh's shared connections: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        # /tmp is shared: a directory someone else made could hand us their socket, or read ours.
        raise ClusterUnreachable(f"{d} is not a private directory of yours (owner uid {st.st_uid}, mode "
                                 f"{stat.S_IMODE(st.st_mode):o}); remove it, or set XDG_RUNTIME_DIR")
    return d


def ssh_argv(cluster: Cluster, shared: bool = True) -> List[str]:
    """``ssh`` with the cluster's port, user and config file, and the shared connection (up to the host)."""
    argv = ["ssh"]
    if cluster.ssh_config:
        argv += ["-F", cluster.ssh_config]
    if cluster.port:
        argv += ["-p", str(cluster.port)]
    if cluster.user:
        argv += ["-l", cluster.user]
    argv += ["-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", "ServerAliveInterval=15"]
    if shared:
        # One connection per cluster definition, not per host: %C (host, port, user) alone would let a cluster
        # that names another key or config file ride on a connection that was made with this one.
        key = hashlib.sha256(repr((cluster.name, cluster.host, cluster.user, cluster.port,
                                   cluster.ssh_config)).encode()).hexdigest()[:10]
        argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir()}/{key}-%C",
                 "-o", f"ControlPersist={CONTROL_PERSIST}"]
    return argv


def remote_line(cluster: Cluster, argv: Sequence[str], cwd: Optional[str] = None,
                exports: Optional[Dict[str, str]] = None) -> str:
    """The command line the login shell runs: setup lines verbatim, then exports (values are shell expressions
    we build), cd, and the command (every word quoted). Those are sh lines: with ``shell`` set (a login shell that
    is not sh-like, such as tcsh or fish), they reach that shell base64-encoded inside one single-quoted word,
    which every login shell passes on unchanged."""
    lines = list(cluster.setup)
    lines += [f"export {name}={value}" for name, value in (exports or {}).items()]
    lines.append((f"cd -- {shlex.quote(cwd)} && " if cwd else "") + "exec " + " ".join(shlex.quote(a) for a in argv))
    text = "\n".join(lines)
    if not cluster.shell:
        return text
    encoded = base64.b64encode(text.encode("utf-8", "surrogateescape")).decode("ascii")
    return f"""{' '.join(cluster.shell)} -c 'eval "$(echo {encoded} | base64 -d)"'"""


def where(cluster: Cluster) -> str:
    return f"cluster {cluster.name!r} (ssh {cluster.destination})"


# What ssh itself prints when it cannot log in (OpenSSH 9); its exit code is then 255.
_SSH_FAILURES = [
    (re.compile(r"Could not resolve hostname"), "the host name does not resolve"),
    (re.compile(r"Connection refused|No route to host|Connection timed out|Network is unreachable|"
                r"Operation timed out|connect to host|Connection closed by|Connection reset"),
     "the host does not answer"),
    (re.compile(r"Permission denied \(|Too many authentication failures"), "the key was refused"),
    (re.compile(r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED"), "the host key is unknown "
                                                                                       "or changed"),
]
_ADVICE = {
    "the host name does not resolve": "check host in [clusters.{name}] (or a Host entry in ~/.ssh/config)",
    "the host does not answer": "check that `{ssh}` works from here (VPN? ProxyJump in ~/.ssh/config?)",
    "the key was refused": "run `{ssh}` once to see why; add your key there ({copy_id}) or name it "
                           "with IdentityFile in ~/.ssh/config",
    "the host key is unknown or changed": "run `{ssh}` once and check the host key it shows (ssh-keygen -R "
                                          "removes an outdated one)",
}


# What csh/tcsh and fish say when handed the sh lines of remote_line: such a login shell may even run the next
# line after one it could not read (tcsh), so this is checked after every remote command.
_NOT_SH = re.compile(r"^(\S+: )?(Command not found\.|Undefined variable\.|Unmatched ['\"`]|Bad : modifier|"
                     r"Illegal variable name\.|Missing }\.)|^fish: ", re.MULTILINE)


def not_sh(cluster: Cluster, stderr: str) -> Optional[ClusterUnreachable]:
    """The one-line error for a login shell that is not sh-like (when no ``shell`` is set for the cluster)."""
    m = None if cluster.shell else _NOT_SH.search(stderr)
    if m is None:
        return None
    said = stderr[m.start():].splitlines()[0].strip()
    return ClusterUnreachable(f"the login shell of {where(cluster)} is not sh-like (it said {said!r}); clusterddp "
                              f"sends sh lines: add shell = \"bash -l\" to [clusters.{cluster.name}] (commands and "
                              "setup lines then run in bash), or make bash your login shell there")


def ssh_failure(cluster: Cluster, stderr: str) -> Optional[ClusterUnreachable]:
    """The one-line error for an ssh that could not log in; None when ssh did (the command's own exit 255)."""
    for pattern, what in _SSH_FAILURES:
        line = next((ln.strip() for ln in stderr.splitlines() if pattern.search(ln)), None)
        if line is not None:
            advice = _ADVICE[what].format(name=cluster.name, ssh=cluster.by_hand(),
                                          copy_id=cluster.by_hand("ssh-copy-id"))
            return ClusterUnreachable(f"cannot log in to {where(cluster)}: {what} ({line}); {advice}")
    return None


def run(cluster: Cluster, argv: Sequence[str], cwd: Optional[str] = None, timeout: float = 60,
        input: Optional[str] = None, exports: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Run ``argv`` on the cluster's login node; ssh's own failures become one-line ClusterUnreachable errors."""
    assert cluster.host is not None
    full = ssh_argv(cluster) + ["--", cluster.host, remote_line(cluster, argv, cwd, exports)]
    try:
        proc = subprocess.run(full, input=input, capture_output=True, text=True, timeout=timeout,
                              stdin=None if input is not None else subprocess.DEVNULL)
    except FileNotFoundError:
        raise ClusterUnreachable(f"ssh is not installed here, so {where(cluster)} cannot be reached: install "
                                 "OpenSSH's client") from None
    except subprocess.TimeoutExpired:
        raise ClusterUnreachable(f"{where(cluster)} did not answer within {timeout:.0f} s "
                                 f"(`{' '.join(argv[:2])}`); check that `{cluster.by_hand()}` works") from None
    failure = (ssh_failure(cluster, proc.stderr) if proc.returncode == 255 else None) or not_sh(cluster, proc.stderr)
    if failure is not None:
        raise failure
    return proc


def sh(cluster: Cluster, script: str, args: Sequence[str] = (), cwd: Optional[str] = None,
       timeout: float = 60, input: Optional[str] = None) -> subprocess.CompletedProcess:
    """A fixed sh script of ours with quoted arguments ("$1", "$2", ...) on the login node."""
    return run(cluster, ["sh", "-c", script, "clusterddp", *args], cwd=cwd, timeout=timeout, input=input)


@functools.lru_cache(maxsize=None)
def rsync_version(rsync: str = "rsync") -> Optional[Tuple[int, ...]]:
    """This machine's rsync version, or None when there is none."""
    try:
        out = subprocess.run([rsync, "--version"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL).stdout
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"version\s+v?(\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(x or 0) for x in m.groups()) if m else (0,)


def require_protect_args() -> None:
    """--protect-args: file names reach the other side as data, never through its shell. Without it (rsync before
    3.0; macOS ships 2.6.9), and before 3.2.4's own escaping, a name with $(...) ran on the login node and one with
    a space sent the code elsewhere. An rsync without it is refused (before any connection)."""
    version = rsync_version()
    if version is not None and version < (3, 0):
        raise ClusterUnreachable(f"this machine's rsync is version {'.'.join(map(str, version))}, older than 3.0: "
                                 "it cannot pass file names to the cluster as data (--protect-args); install a "
                                 "newer one (brew install rsync, apt install rsync)")


def _rsync(cluster: Cluster, args: Sequence[str], what: str, timeout: float = 600) -> subprocess.CompletedProcess:
    require_protect_args()
    argv = ["rsync", "--protect-args", "-e", shlex.join(ssh_argv(cluster)), *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise ClusterUnreachable(f"rsync is not installed here; it copies {what} to and from {where(cluster)}: "
                                 "install it (apt install rsync, brew install rsync)") from None
    except subprocess.TimeoutExpired:
        raise ClusterUnreachable(f"copying {what} with {where(cluster)} took over {timeout:.0f} s") from None
    if proc.returncode == 255 or proc.returncode == 12:
        failure = ssh_failure(cluster, proc.stderr)
        if failure is not None:
            raise failure
    # 23/24: some files were missing or vanished (a log not written yet): what exists was copied.
    if proc.returncode not in (0, 23, 24):
        said = next((ln for ln in proc.stderr.splitlines() if "command not found" in ln or "rsync:" in ln),
                    proc.stderr.strip()[:300])
        hint = ("; rsync must be installed on the cluster too" if "not found" in proc.stderr else "")
        raise ClusterUnreachable(f"copying {what} with {where(cluster)} failed (rsync exit {proc.returncode}): "
                                 f"{said.strip()}{hint}")
    return proc


def _host_path(cluster: Cluster, path: str) -> str:
    assert cluster.host is not None
    host = f"[{cluster.host}]" if ":" in cluster.host else cluster.host
    return f"{host}:{path}"


@dataclass(frozen=True)
class Transfer:
    files: List[str]   # what was sent (changed or new), as rsync names them
    bytes_sent: int    # on the wire, after compression and deltas


def _parse_transfer(stdout: str) -> Transfer:
    files = [ln[len("cddp> "):] for ln in stdout.splitlines() if ln.startswith("cddp> ") and not ln.endswith("/")]
    m = re.search(r"Total bytes sent: ([0-9,.]+)", stdout)
    return Transfer(files, int(re.sub(r"[,.]", "", m.group(1))) if m else 0)


def lib_hash() -> str:
    """A name for this clusterddp's own modules: jobs keep the exact code they were rendered for."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def lib_dir(cluster: Cluster) -> str:
    """This clusterddp's modules on the cluster, as a path for ssh and rsync (relative: from the remote home)."""
    return f"{cluster.remote_dir.rstrip('/')}/{LIB_DIR}/{lib_hash()}"


def lib_expression(cluster: Cluster) -> str:
    """The same directory as a shell word for lines run there (a relative remote_dir is under $HOME)."""
    path = shlex.quote(lib_dir(cluster))
    return path if cluster.remote_dir.startswith("/") else f'"$HOME"/{path}'


def job_spec(spec: "JobSpec", cluster: Cluster) -> "JobSpec":
    """The spec as it runs on a remote cluster: clusterddp's job-side modules were copied there (clusterddp need
    not be installed), found through PYTHONPATH before anything installed, so the job runs the code it was
    rendered for."""
    line = (f'export PYTHONPATH={lib_expression(cluster)}"${{PYTHONPATH:+:$PYTHONPATH}}"'
            "  # clusterddp's job-side modules, copied there by clusterddp submit --cluster")
    if spec.setup[:1] == (line,):
        return spec
    return spec.replace(setup=(line,) + tuple(spec.setup))


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
# directory to use instead when $1 holds another project's copy (same directory name, another origin).
_PREPARE = r"""
umask 077
mkdir -p -- "$2" || exit 3
code="$1"
if [ -f "$code/.clusterddp-origin" ] && [ "$(cat -- "$code/.clusterddp-origin")" != "$3" ]; then code="$4"; fi
mkdir -p -- "$code" && cd -- "$code" || exit 3
[ -f .clusterddp-origin ] || printf '%s\n' "$3" > .clusterddp-origin
pwd -P
me="$(id -u)"
for top in "$(pwd -P)" "$(cd -- "$2" && pwd -P)"; do
    d="$top"
    while :; do
        bad="$(find "$d" -maxdepth 0 \( \( ! -uid "$me" ! -uid 0 \) -o \( -perm /022 ! -perm -1000 \) \) -print)"
        [ -z "$bad" ] || echo "unsafe $d"
        [ "$d" = / ] && break
        d="$(dirname -- "$d")"
    done
done
shift 4
for c in "$@"; do command -v -- "$c" >/dev/null 2>&1 || echo "missing $c"; done
"""


def remote_code_dir(cluster: Cluster, local_dir: Path) -> str:
    """Where the directory you submit from goes: REMOTE_DIR/<its name>."""
    return f"{cluster.remote_dir.rstrip('/')}/{local_dir.resolve().name or 'root'}"


def _git_out(args: Sequence[str]) -> Optional[bytes]:
    try:
        proc = subprocess.run(["git", *args], capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _git_files(local_dir: Path) -> Optional[List[str]]:
    """The files of ``local_dir`` that git counts as a work tree's (tracked, or untracked and not ignored), relative
    to it, by every rule git applies; None without git (or for a tree git will not read, such as another user's).

    Outside a git work tree the same rules hold through a throwaway repository whose work tree is the directory
    (rsync's own reading of .gitignore differs: trailing spaces, backslash escapes, negations). Submodules and
    nested repositories go by their own rules, file by file, and never with their .git."""
    listing = ["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."]
    out = _git_out(["-C", str(local_dir), *listing])
    stage = _git_out(["-C", str(local_dir), "ls-files", "-z", "--stage", "--", "."]) if out is not None else b""
    if out is None:
        if _git_out(["-C", str(local_dir), "rev-parse", "--git-dir"]) is not None:
            return None  # inside a repository git refuses to read (another user's): not guessed here
        with tempfile.TemporaryDirectory(prefix="clusterddp-git-") as tmp:
            if _git_out(["init", "-q", tmp]) is None:
                return None
            out = _git_out(["-C", str(local_dir), f"--git-dir={tmp}/.git", f"--work-tree={local_dir}", *listing])
        if out is None:
            return None
    gitlinks = {os.fsdecode(e.split(b"\t", 1)[1]) for e in (stage or b"").split(b"\0") if e.startswith(b"160000 ")}
    names: List[str] = []
    for name in dict.fromkeys(os.fsdecode(n) for n in out.split(b"\0") if n):
        path = local_dir / name.rstrip("/")
        if name.endswith("/") or name in gitlinks:  # a nested repository or a submodule: its own files and rules
            inner = _git_files(path) if (path / ".git").exists() else []
            names += [f"{name.rstrip('/')}/{n}" for n in inner or []]
        elif path.is_symlink() or not path.is_dir():
            names.append(name)
    return names


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


def _selected_names(spec: "JobSpec", local_dir: Path) -> Optional[List[str]]:
    """What of ``local_dir`` is copied, as relative names (git's rules); None without git (rsync filters then)."""
    out = Path(spec.output_dir)
    out_top = out.parts[0] if not out.is_absolute() and out.parts and out.parts[0] not in ("..", ".") else None
    names = _git_files(local_dir)
    if names is None:
        return None
    return [n for n in names if not {".git", "__pycache__"} & set(n.split("/")) and n.split("/")[0] != out_top
            and os.path.lexists(local_dir / n)]  # (a tracked file deleted here is not asked for)


def _filters(spec: "JobSpec", local_dir: Path) -> List[str]:
    """Without git: rsync reads the .gitignore files itself (refused where it reads a line otherwise than git)."""
    differs = _rsync_reads_differently(local_dir)
    if differs:
        raise PreflightError(f"without git, rsync reads the .gitignore files, and it reads {differs} otherwise "
                             "than git (a trailing space, a backslash escape or a negation): install git, which "
                             "then decides what is copied, or rewrite that line")
    out = Path(spec.output_dir)
    out_top = out.parts[0] if not out.is_absolute() and out.parts and out.parts[0] not in ("..", ".") else None
    return ["--filter=:- .gitignore", "--exclude=/.git/", "--exclude=__pycache__/"] + \
        ([f"--exclude=/{out_top}/"] if out_top else [])


@contextmanager
def code_selection(spec: "JobSpec", local_dir: Path,
                   names: Optional[List[str]] = None) -> Iterator[List[str]]:
    """rsync arguments that choose what of ``local_dir`` is copied. In a git work tree, the files git lists (so
    every rule git applies counts: .gitignore files up to the top of the repository, .git/info/exclude, the global
    excludes file), given as a --files-from list; elsewhere, the directory's .gitignore files, read by rsync.
    Never copied: .git, __pycache__, the local runs' output directory."""
    keep = names if names is not None else _selected_names(spec, local_dir)
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


def prepare(cluster: Cluster, spec: "JobSpec", local_dir: Path, check: bool = True) -> CodeDir:
    """Connect, make the code directory, check the commands the job needs (pre-flight), copy the code (what
    changed since the last copy; .gitignore'd files, .git and the output directory stay here) and clusterddp's
    job-side modules. Returns the absolute code directory there."""
    needed = [spec.python] + (["torchrun"] if spec.launcher == "torchrun" and not spec.apptainer
                              and not spec.container_image else [])
    origin = f"{socket.gethostname()}:{local_dir.resolve()}"
    alternative = f"{remote_code_dir(cluster, local_dir)}-{hashlib.sha256(origin.encode()).hexdigest()[:8]}"
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
    names = _selected_names(spec, local_dir)
    with code_selection(spec, local_dir, names) as chosen:
        sent = _rsync(cluster, [*COPY_ARGS, "--stats", "--out-format=cddp> %n", *chosen,
                                "--", f"{local_dir.resolve()}/", _host_path(cluster, path + "/")], "the code")
    _push_lib(cluster)
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


def _push_lib(cluster: Cluster) -> None:
    package = Path(__file__).resolve().parent
    _rsync(cluster, ["-rlptz", "--prune-empty-dirs", "--include=*/", "--include=*.py", "--exclude=*", "--",
                     f"{package}/", _host_path(cluster, f"{lib_dir(cluster)}/clusterddp/")], "clusterddp's modules")


def ensure_lib(cluster: Cluster) -> None:
    """This clusterddp's modules on the cluster (for tools run there, such as stacks): copied when missing."""
    sh(cluster, 'mkdir -p -- "$1"', [lib_dir(cluster) + "/clusterddp"])
    _push_lib(cluster)


def python_module(cluster: Cluster, python: str, module: str, args: Sequence[str],
                  timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m module args`` on the login node, with this clusterddp's modules first on PYTHONPATH."""
    ensure_lib(cluster)
    proc = run(cluster, [python, "-m", module, *args], timeout=timeout,
               exports={"PYTHONPATH": lib_expression(cluster) + '"${PYTHONPATH:+:$PYTHONPATH}"'})
    if proc.returncode == 127:
        raise PreflightError(f"{where(cluster)} has no {shown(python)} on PATH (after its setup lines): set --python "
                             f"when submitting, or add a setup line to [clusters.{cluster.name}] that provides it")
    return proc


def write(cluster: Cluster, path: str, text: str) -> None:
    """Write ``text`` to ``path`` on the cluster (parent directories made)."""
    proc = sh(cluster, 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', [path], input=text)
    if proc.returncode != 0:
        raise ClusterUnreachable(f"cannot write {path} on {where(cluster)}: {proc.stderr.strip()[:300]}")


_MOVE_ASIDE = r"""
for p in "$@"; do
    [ -e "$p" ] || continue
    n=1
    while [ -e "$p.$n" ]; do n=$((n + 1)); done
    mv -- "$p" "$p.$n" && printf '%s\t%s\n' "$p" "$p.$n"
done
"""


def move_aside(cluster: Cluster, paths: Sequence[str]) -> List[List[str]]:
    """slurm._move_aside on the cluster: existing files of an earlier job with the same id become NAME.n."""
    proc = sh(cluster, _MOVE_ASIDE, list(paths))
    return [ln.split("\t", 1) for ln in proc.stdout.splitlines() if "\t" in ln]


def _mirror(cluster_name: str, leaf: str) -> Path:
    """A directory on this machine for copies of one remote job's files."""
    local = dirs.mirror() / cluster_name / leaf
    local.mkdir(parents=True, exist_ok=True)
    return local


def mirror_dir(record: "JobRecord") -> Path:
    """Where a remote job's logs and reports are copied back to on this machine (one per submission: a reused id
    gets its own)."""
    key = hashlib.sha256(record.script_path.encode()).hexdigest()[:8]
    return _mirror(record.cluster, f"{record.job_id}-{key}")


def fetch(record: "JobRecord") -> "JobRecord":
    """The record with its files readable here: for a remote job, its batch log and its run directory's logs and
    reports copied back (only what changed) and the paths pointing at the copies; a job of ``here`` as it is."""
    from .clusters import by_name

    if record.cluster in ("", "here"):
        return record
    cluster = by_name(record.cluster)
    local = mirror_dir(record)
    run_name = Path(record.run_dir).name
    # -rt, not -l: links in a remote run directory are not copied (one planted there could name any file of
    # yours once it is followed here: logs --rank printed ~/.ssh/id_ed25519 that way).
    _rsync(cluster, [*PULL_ARGS, "--",
                     _host_path(cluster, record.batch_log), _host_path(cluster, record.run_dir),
                     f"{local}/"], f"job {record.job_id}'s logs")
    return replace(record, batch_log=str(local / Path(record.batch_log).name), run_dir=str(local / run_name),
                   script_path=record.script_path)


#: What `status` needs of an ended job: the roll call and the rendezvous report, nothing else.
REPORT_FILTER = ["--include=/*/", "--include=/*/stacks/", "--include=/*/stacks/hang-*/",
                 "--include=/*/stacks/hang-*/rollcall.*", "--include=/*/stacks/rendezvous-*.txt", "--exclude=*"]
_FINAL = ".reports-final"


def fetch_reports(record: "JobRecord") -> "JobRecord":
    """Like fetch, for `status` of an ended job: only its report files, copied once (an ended job's reports do not
    change; a listing of many finished jobs then costs no copy at all)."""
    from .clusters import by_name

    if record.cluster in ("", "here"):
        return record
    local = mirror_dir(record)
    run_name = Path(record.run_dir).name
    marker = local / _FINAL
    if not marker.exists():
        cluster = by_name(record.cluster)
        _rsync(cluster, ["-rt", "--no-links", "--prune-empty-dirs", *REPORT_FILTER, "--",
                         _host_path(cluster, record.run_dir), f"{local}/"], f"job {record.job_id}'s reports")
        marker.write_text("")
    return replace(record, batch_log=str(local / Path(record.batch_log).name), run_dir=str(local / run_name))


def fetch_file(cluster: Cluster, path: str, job_id: str) -> Path:
    """One file from the cluster (a log Slurm names), copied here."""
    local = _mirror(cluster.name, f"{job_id}-log")
    _rsync(cluster, ["-t", "--no-links", "--", _host_path(cluster, path), f"{local}/"], f"job {job_id}'s log")
    return local / Path(path).name


def close(cluster: Cluster) -> None:
    """End the shared connection (ssh -O exit); nothing when there is none."""
    assert cluster.host is not None
    subprocess.run(ssh_argv(cluster) + ["-O", "exit", "--", cluster.host], capture_output=True, timeout=30,
                   stdin=subprocess.DEVNULL)
