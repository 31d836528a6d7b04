"""Which configuration files may decide where your code goes and what runs on your machine (issue 23): your own,
and a project file only once you trusted it (``CLUSTERDDP_TRUST``, or ``clusterddp trust``, which records the
file's path and content hash, as direnv and mise do); a file of another user, or one others can write, is not read.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, Mapping, Optional

from .. import dirs
from ..datafiles import write_atomic
from ..errors import SpecError

TRUST_VARIABLE = "CLUSTERDDP_TRUST"


def _listed(path: Path, environ: Mapping[str, str]) -> bool:
    """``path`` is named in CLUSTERDDP_TRUST ("*": every file). Only absolute entries count: a relative entry would
    trust whatever file the current directory holds (another user's in a shared directory), so it is ignored
    (why_not_trusted says so). A file named by its absolute path is trusted whoever owns it: that is the opt-in
    for a file of someone else (a team's), which the warning about such a file suggests."""
    entries = [t for t in environ.get(TRUST_VARIABLE, "").split(os.pathsep) if t]
    return "*" in entries or any(os.path.isabs(t) and os.path.normpath(t) == os.path.abspath(path) for t in entries)


def _relative_entries(environ: Mapping[str, str]) -> str:
    ignored = [t for t in environ.get(TRUST_VARIABLE, "").split(os.pathsep) if t and t != "*" and not os.path.isabs(t)]
    return (f" ({TRUST_VARIABLE} takes absolute paths only: {', '.join(repr(t) for t in ignored[:3])} ignored)"
            if ignored else "")


def distrust(path: Path, environ: Optional[Mapping[str, str]] = None) -> str:
    """Why ``path`` must not be read ('' when it may): another user's file, or one that others can change."""
    environ = os.environ if environ is None else environ
    if _listed(path, environ):
        return ""
    try:
        st = path.stat()
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if st.st_uid not in (os.geteuid(), 0):
        return f"it is owned by {_user_name(st.st_uid)}, not by you"
    if st.st_mode & 0o022:
        who = "group and others" if st.st_mode & 0o022 == 0o022 else "group" if st.st_mode & 0o020 else "others"
        return f"it is writable by {who} (chmod go-w {path})"
    return ""




def trust_file() -> Path:
    """The user's list of trusted project files: one ``<sha256>  <absolute path>`` per line."""
    return dirs.base("config") / "trusted"


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _trusted_entries(environ: Mapping[str, str]) -> Dict[str, str]:
    """path -> hash from the trust file (which is ignored when others could have written it)."""
    path = trust_file()
    if not path.is_file() or distrust(path, {}):
        return {}
    out = {}
    for line in path.read_text(errors="replace").splitlines()[:10000]:
        digest, _, name = line.partition("  ")
        if re.fullmatch(r"[0-9a-f]{64}", digest) and name:
            out[name] = digest
    return out


def why_not_trusted(path: Path, environ: Optional[Mapping[str, str]] = None) -> str:
    """'' when ``path`` may decide where code goes (the user file, or a project file trusted explicitly);
    else why not."""
    environ = os.environ if environ is None else environ
    if path == dirs.user_config():
        return ""
    if _listed(path, environ):
        return ""
    recorded = _trusted_entries(environ).get(str(Path(path).resolve()))
    if recorded is None:
        return "it is not trusted" + _relative_entries(environ)
    try:
        return "" if recorded == _digest(path) else "it changed since you trusted it"
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"


def trust(path: Path, revoke: bool = False) -> str:
    """Record (or with ``revoke`` remove) ``path`` in the trust file, written privately and atomically; returns
    the recorded hash ('' when revoked)."""

    path = Path(path).resolve()
    if not path.is_file():
        raise SpecError(f"{path}: no such file (give a clusterddp.toml or pyproject.toml)")
    entries = _trusted_entries({})
    entries.pop(str(path), None)
    digest = "" if revoke else _digest(path)
    if digest:
        entries[str(path)] = digest
    target = trust_file()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(target, "".join(f"{d}  {p}\n" for p, d in sorted(entries.items())), mode=0o600)
    return digest


def untrusted_note(path: Path, what: str, why: str) -> str:
    return (f"{path}: {what} ignored: {why}, and a project file decides where your code goes and what ssh runs "
            f"only once you trust it (clusterddp trust {path})")


def _user_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"
