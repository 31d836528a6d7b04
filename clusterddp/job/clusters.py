"""Clusters: which Slurm a command talks to. ``here`` is the Slurm this machine's commands reach (SLURM_CONF);
any other name is a ``[clusters.NAME]`` table of the user or project configuration, reached over SSH.

    [clusters.hpc]
    host = "login.example.org"     # as you would type it after `ssh` (~/.ssh/config applies)
    user = "alice"                 # optional (default: ssh's own choice)
    port = 22                      # optional
    remote_dir = "clusterddp"      # where code is copied, relative to the remote home (default: clusterddp)
    setup = ["module load slurm"]  # shell lines run before every remote command (and so seen by sbatch)
    ssh_config = "~/.ssh/config"   # optional: a config file for ssh -F
    max_copy = "1G"                # refuse to copy a code directory larger than this (0: no limit)
    shell = "bash -l"              # only where the login shell is not sh-like (tcsh, fish): run commands in this

The cluster is chosen with ``--cluster NAME``, else ``CLUSTERDDP_CLUSTER``, else ``cluster = "NAME"`` in
``[defaults]`` or the chosen ``[profiles.NAME]``, else ``here``. Values are data: a host or user that could read
as an ssh option is refused, and nothing here is put on a command line without quoting (config.py's trust rules
decide which files are read at all).
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

from ..errors import SpecError
from .ids import HERE, LOCAL
from .ids import check_cluster_name as check_name

KEYS = ("host", "user", "port", "remote_dir", "setup", "ssh_config", "max_copy", "shell", "backend")
#: A code directory is copied to the cluster on every submit: one larger than this is most likely data that
#: belongs in .gitignore (and on the cluster's own file system), not code.
DEFAULT_MAX_COPY = 1 << 30
_SIZE = re.compile(r"([0-9]+)\s*(?:([KMGT])(?:i?B)?|B)?", re.IGNORECASE)
# A host as ssh takes it: a name from ~/.ssh/config, a DNS name, an IPv4 address or a bracket-less IPv6 one.
_HOST = re.compile(r"[A-Za-z0-9_.:%][A-Za-z0-9_.:%-]{0,252}")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
# Words every login shell (sh, csh, fish) reads as themselves: the shell command is parsed by the login shell.
_SHELL = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_./+=-]*( [A-Za-z0-9_./+=-]+)*")


class Cluster(NamedTuple):  # (not a frozen dataclass: 1 ms less start-up for every command)
    """One cluster reached over SSH (``host`` None: this machine's own Slurm)."""

    name: str = HERE
    host: Optional[str] = None
    user: Optional[str] = None
    port: Optional[int] = None
    remote_dir: str = "clusterddp"
    setup: Tuple[str, ...] = ()
    ssh_config: Optional[str] = None
    max_copy: int = DEFAULT_MAX_COPY  # bytes; 0: no limit
    shell: Tuple[str, ...] = ()  # run remote commands in this shell (the login shell is not sh-like); (): as is
    backend: str = "slurm"       # a name in clusterddp.backends.REGISTRY

    @property
    def remote(self) -> bool:
        return self.host is not None

    def by_hand(self, command: str = "ssh") -> str:
        """How a user reaches it by hand (for advice in messages): ``ssh [-F FILE] [-p PORT] DEST``."""
        import shlex

        words = [command] + (["-F", self.ssh_config] if self.ssh_config else []) + \
            (["-p", str(self.port)] if self.port else []) + [self.destination]
        return shlex.join(words)

    @property
    def destination(self) -> str:
        """What ssh is told to connect to (shown in messages as ``ssh DEST``)."""
        assert self.host is not None
        return f"{self.user}@{self.host}" if self.user else self.host


def from_table(name: str, table: Mapping[str, Any], where: str) -> Cluster:
    """A [clusters.NAME] table -> Cluster; every value checked (a typo lists the valid keys)."""
    from .parse import suggest

    check_name(name)
    if name in (HERE, LOCAL):
        what = "this machine's own Slurm" if name == HERE else "this machine without Slurm (--local)"
        raise SpecError(f"{where}: the cluster name {name!r} is reserved for {what}; choose another name")
    if not isinstance(table, dict):
        raise SpecError(f"{where}: clusters.{name} must be a table ([clusters.{name}]), got {table!r}")
    for key in table:
        if key not in KEYS:
            raise SpecError(f"{where}: unknown key {key!r}{suggest(key, KEYS)}; valid keys: {', '.join(KEYS)}")

    def text(key: str, pattern: Optional["re.Pattern[str]"], expected: str) -> Optional[str]:
        value = table.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value or (pattern and not pattern.fullmatch(value)) \
                or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise SpecError(f"{where}: clusters.{name}.{key} must be {expected}, got {value!r}")
        return value

    from ..backends.registry import check_name as check_backend

    backend = check_backend(text("backend", None, "a backend's name") or "slurm", f"{where}: clusters.{name}")
    host = text("host", _HOST, "a host name as you would give it to ssh (letters, digits, '.', '-', ':'; not "
                               "starting with '-')")
    if host is None and backend == "slurm":
        raise SpecError(f"{where}: clusters.{name} has no host; add host = \"login.example.org\" (what you type "
                        "after ssh)")
    user = text("user", _USER, "a user name (letters, digits, '_', '.', '-'; not starting with '-')")
    port = table.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
        raise SpecError(f"{where}: clusters.{name}.port must be an integer 1-65535, got {port!r}")
    remote_dir = text("remote_dir", None, "a directory on the cluster (relative to your home there, or absolute)")
    if remote_dir is not None:
        # ~ and ~/x: the home there and x under it (a relative path is relative to the home there).
        remote_dir = "." if remote_dir in ("~", "~/") else remote_dir[2:] if remote_dir.startswith("~/") else remote_dir
        # ~user/...: rsync would expand it and the shell lines (which quote it) would not; give the path itself.
        if remote_dir.startswith("-") or remote_dir.startswith("~") or remote_dir == "" or "\\" in remote_dir:
            raise SpecError(f"{where}: clusters.{name}.remote_dir {remote_dir!r} cannot be used: give a directory "
                            "such as \"clusterddp\" or \"/scratch/alice/clusterddp\"")
    setup = table.get("setup", [])
    if isinstance(setup, str):
        setup = [setup]
    if not isinstance(setup, list) or not all(isinstance(s, str) and "\0" not in s for s in setup):
        raise SpecError(f"{where}: clusters.{name}.setup must be a list of shell lines, got {table.get('setup')!r}")
    ssh_config = text("ssh_config", None, "the path of an ssh configuration file")
    if ssh_config is not None:
        ssh_config = os.path.expanduser(ssh_config)
    shell = text("shell", _SHELL, "a shell and its options, such as \"bash -l\" (letters, digits, '/', '.', "
                                  "'-', '_'; words separated by one space)")
    return Cluster(name, host, user, port, remote_dir or "clusterddp", tuple(setup), ssh_config,
                   _size(table.get("max_copy", DEFAULT_MAX_COPY), f"{where}: clusters.{name}.max_copy"),
                   tuple(shell.split(" ")) if shell else (), backend)


def _size(value: Any, what: str) -> int:
    """Bytes from an integer or "500M" / "2G" / "1TiB" (powers of 1024)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None:
        raise SpecError(f"{what} must be a size such as \"500M\" or \"2G\" (0: no limit), got {value!r}")
    return int(m.group(1)) << (10 * " KMGT".index((m.group(2) or " ").upper()))


def defined(environ: Optional[Mapping[str, str]] = None) -> Dict[str, Tuple[Cluster, str]]:
    """Every cluster of the configuration: name -> (Cluster, the file that defines it). The user file's, then a
    project file's where the user trusted it explicitly (config.py: a cloned repository's ssh_config could run a
    ProxyCommand here); a project's table never replaces one of the user's."""
    from .config import config_files, warn_once
    from .trust import untrusted_note, why_not_trusted

    out: Dict[str, Tuple[Cluster, str]] = {}
    for path, data in config_files(environ):
        tables = data.get("clusters", {})
        if not isinstance(tables, dict):
            raise SpecError(f"{path}: clusters must be tables ([clusters.NAME]), got {tables!r}")
        why = why_not_trusted(path, environ)
        if why and tables:
            warn_once(untrusted_note(path, ", ".join(f"[clusters.{n}]" for n in tables), why))
            continue
        for name, table in tables.items():
            if name in out:
                warn_once(f"{path}: [clusters.{name}] ignored: your own {out[name][1]} defines cluster {name!r}, "
                          "and a project file never replaces a cluster of yours")
                continue
            out[name] = (from_table(name, table, str(path)), str(path))
    return out


def choose(option: Optional[str], profile: Optional[str] = None,
           environ: Optional[Mapping[str, str]] = None) -> Cluster:
    """The cluster a command talks to: --cluster, else CLUSTERDDP_CLUSTER, else the configured default, else here."""
    from .config import resolve

    environ = os.environ if environ is None else environ
    name = option
    if not name:
        configured = resolve(profile, environ).get("cluster")
        name = configured[0] if configured else HERE
    assert name is not None
    return by_name(name, environ)


def by_name(name: str, environ: Optional[Mapping[str, str]] = None) -> Cluster:
    from .parse import suggest

    if name == HERE:
        return Cluster()
    if name == LOCAL:  # this machine without Slurm: where local runs (L7) are filed
        return Cluster(LOCAL, backend=LOCAL)
    check_name(name)
    known = defined(environ)
    if name not in known:
        raise SpecError(f"unknown cluster {name!r}{suggest(name, list(known))}; clusters defined: "
                        f"{', '.join(sorted(known)) or 'none'} (add [clusters.{name}] with host = ... to "
                        "clusterddp.toml or the user config; 'here' is this machine's Slurm)")
    return known[name][0]


def human_size(n: int) -> str:
    """1536 -> "1.5 KiB" (powers of 1024, as max_copy reads them)."""
    value, unit = float(n), "bytes"
    for larger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{n} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
