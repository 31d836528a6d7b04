"""The run directory, held: opened once when the rank joins and checked as this user's own (not a link, writable by
nobody else), then reached through that open handle. A rename of it, or of a directory above it, afterwards
redirects none of the runtime's files (hellos, records, telemetry, metrics, checkpoints under it) elsewhere.

The batch script's supervisor checked the whole path first (datafiles.own_run_dir: every directory above it this
user's or root's, none that lets others rename); the handle closes the rest of the window. Paths through the handle
are Linux's /proc/self/fd/N/...: plain paths every library can open (TensorBoard's writer, NCCL's trace files), in
this process and in the loader workers it forks. Where /proc is missing, the path as given is used."""
from __future__ import annotations

import os
from typing import Dict, Optional, Union

from ..datafiles import NotOwned, check_own
from ..errors import RuntimeEnvError

_HELD: Dict[str, Union[str, int]] = {}  # "path": the run directory as given (absolute), "fd", "via": the handle's path


def hold(path: Optional[str]) -> Optional[str]:
    """Open and check ``path`` (RUN_DIR); the path to use from now on, or None without one. A directory that is
    missing is left to the callers (they say they cannot write there); one that is not this user's own ends init."""
    release()
    if not path:
        return None
    absolute = os.path.abspath(path)
    try:
        fd = os.open(absolute, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return path
    try:
        check_own(absolute, os.fstat(fd))
    except NotOwned as exc:
        os.close(fd)
        raise RuntimeEnvError(f"the run directory ($CLUSTERDDP_RUN_DIR) is not this job's own: {exc}") from None
    via = f"/proc/self/fd/{fd}"
    _HELD.update(path=absolute, fd=fd, via=via if os.path.isdir(via) else absolute)
    return str(_HELD["via"])


def release() -> None:
    if "fd" in _HELD:
        os.close(int(_HELD["fd"]))
    _HELD.clear()


def at(path: Union[str, "os.PathLike[str]"]) -> str:
    """``path`` reached through the held run directory where it lies in it, else as it is."""
    text = os.fspath(path)
    held = str(_HELD.get("path", ""))
    if not held:
        return text
    absolute = os.path.abspath(text)
    if absolute == held or absolute.startswith(held + os.sep):
        return str(_HELD["via"]) + absolute[len(held):]
    return text


def shown(path: Union[str, "os.PathLike[str]"]) -> str:
    """A path through the handle as the user knows it (for messages)."""
    text, via = os.fspath(path), str(_HELD.get("via", ""))
    if via and (text == via or text.startswith(via + os.sep)):
        return str(_HELD["path"]) + text[len(via):]
    return text
