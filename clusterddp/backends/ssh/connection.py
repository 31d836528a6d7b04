"""A cluster reached over SSH: the system's ``ssh`` (so ~/.ssh/config, ProxyJump, agents and two-factor prompts
work as they do for you), one shared connection per cluster (ControlMaster: a second command costs a round trip,
not a login), ``rsync`` for clusterddp's modules going out and logs coming back (the project's code: copy.py).
Login side; the Ssh host (ssh/__init__.py) runs Slurm's commands here.

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
import stat
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from ...errors import ClusterUnreachable, PreflightError
from ...job.clusters import Cluster
from ...job.quoting import shown

if TYPE_CHECKING:
    from ...job.spec import JobSpec

CONNECT_TIMEOUT_S = 15
CONTROL_PERSIST = "10m"
LIB_DIR = ".lib"  # under remote_dir on the cluster: clusterddp's own modules (<hash>/clusterddp), for jobs and tools


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


def sh_argv(script: str, args: Sequence[str] = (), cwd: Optional[str] = None) -> List[str]:
    """The command ``sh`` runs there. Without ``cwd`` it starts in the home there, whatever the setup lines did:
    a relative path (remote_dir's default) is relative to the home, as rsync and the docs take it."""
    start = "" if cwd else 'cd -- "$HOME" 2>/dev/null\n'
    return ["sh", "-c", start + script, "clusterddp", *args]


def sh(cluster: Cluster, script: str, args: Sequence[str] = (), cwd: Optional[str] = None,
       timeout: float = 60, input: Optional[str] = None) -> subprocess.CompletedProcess:
    """A fixed sh script of ours with quoted arguments ("$1", "$2", ...) on the login node."""
    return run(cluster, sh_argv(script, args, cwd), cwd=cwd, timeout=timeout, input=input)


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


def rsync(cluster: Cluster, args: Sequence[str], what: str, timeout: float = 600) -> subprocess.CompletedProcess:
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


def host_path(cluster: Cluster, path: str) -> str:
    assert cluster.host is not None
    host = f"[{cluster.host}]" if ":" in cluster.host else cluster.host
    return f"{host}:{path}"


def lib_hash() -> str:
    """A name for this clusterddp's own modules: jobs keep the exact code they were rendered for."""
    root = Path(__file__).resolve().parents[2]  # the clusterddp package
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


def push_lib(cluster: Cluster) -> None:
    package = Path(__file__).resolve().parents[2]  # the clusterddp package
    rsync(cluster, ["-rlptz", "--prune-empty-dirs", "--include=*/", "--include=*.py", "--exclude=*", "--",
                     f"{package}/", host_path(cluster, f"{lib_dir(cluster)}/clusterddp/")], "clusterddp's modules")


def ensure_lib(cluster: Cluster) -> None:
    """This clusterddp's modules on the cluster (for tools run there, such as stacks): copied when missing."""
    sh(cluster, 'mkdir -p -- "$1"', [lib_dir(cluster) + "/clusterddp"])
    push_lib(cluster)


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
    [ -e "$p" ] || [ -L "$p" ] || continue
    n=1
    while [ -e "$p.$n" ] || [ -L "$p.$n" ]; do n=$((n + 1)); done
    mv -- "$p" "$p.$n" && printf '%s\t%s\n' "$p" "$p.$n" || exit 1
done
"""


def move_aside(cluster: Cluster, paths: Sequence[str]) -> List[List[str]]:
    """hosts.Here.move_aside on the cluster: existing files of an earlier job with the same id become NAME.n."""
    proc = sh(cluster, _MOVE_ASIDE, list(paths))
    if proc.returncode != 0:
        raise OSError(f"on {cluster.name}: {proc.stderr.strip()[-300:] or 'mv failed'}")
    return [ln.split("\t", 1) for ln in proc.stdout.splitlines() if "\t" in ln]


def close(cluster: Cluster) -> None:
    """End the shared connection (ssh -O exit); nothing when there is none."""
    assert cluster.host is not None
    subprocess.run(ssh_argv(cluster) + ["-O", "exit", "--", cluster.host], capture_output=True, timeout=30,
                   stdin=subprocess.DEVNULL)
