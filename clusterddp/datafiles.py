"""Files as data, in one place: bounded reads that never follow a link nor block on a FIFO, a log's tail or its
lines as a stream, and atomic writes through a new file whose name nobody can predict. Shared by both sides (the
job side writes its dumps with it); standard library only.

Run directories and shared output directories may be writable by others: what is read there is a regular file of
bounded size, opened without following a link, and what is written replaces its target in one rename.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Iterator, Optional, Union

#: A hello, a dump, a roll call or a record is a few kB: more is not a file of ours.
MAX_FILE = 1 << 20
_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # no link, no FIFO wait


def open_data(path: Union[str, Path]) -> Optional[int]:
    """A descriptor of ``path`` when it is a regular file reached without a link at its end, else None."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def read_bounded(path: Union[str, Path], limit: int = MAX_FILE) -> Optional[bytes]:
    """The bytes of a regular file of at most ``limit`` bytes, never through a symlink; None otherwise."""
    fd = open_data(path)
    if fd is None:
        return None
    try:
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


#: What a file of ours holds at most: nesting this deep, integers of this many digits (each still a float: a
#: larger one overflows float(), and Python's int/str conversions of it are slow or refused).
MAX_DEPTH = 64
MAX_INT_DIGITS = 300


def _bounded_int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits} digits")
    return int(text)


def parse_json(raw: Union[str, bytes], max_depth: int = MAX_DEPTH) -> Any:
    """JSON text that a job, another machine or another user may have written, as data with bounds: nesting at most
    ``max_depth`` deep, integers of at most MAX_INT_DIGITS digits. Anything else is a ValueError that says what
    (never a RecursionError): the one reader of such JSON, so every caller reads bad input as data."""
    try:
        data = json.loads(raw, parse_int=_bounded_int)
    except RecursionError:
        raise ValueError(f"nested deeper than {max_depth}") from None
    stack = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                raise ValueError(f"nested deeper than {max_depth}")
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return data


def read_json(path: Union[str, Path], limit: int = MAX_FILE) -> Any:
    """JSON from a file, as data with bounds (read_bounded, parse_json): or None."""
    data = read_bounded(path, limit)
    try:
        return None if data is None else parse_json(data)
    except ValueError:
        return None


def read_tail(path: Union[str, Path], limit: int) -> Optional[bytes]:
    """The last ``limit`` bytes of a regular file (a log may be gigabytes), never through a link; None otherwise."""
    fd = open_data(path)
    if fd is None:
        return None
    try:
        os.lseek(fd, max(0, os.fstat(fd).st_size - limit), os.SEEK_SET)
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def lines(path: Union[str, Path], max_line: int = 1 << 16) -> Iterator[str]:
    """The lines of a log as a stream, a line longer than ``max_line`` characters in pieces; nothing for a link,
    a FIFO or a file that is not there."""
    fd = open_data(path)
    if fd is None:
        return
    # newline="\n": a line ends at "\n" only (universal newlines would end one at a "\r" the program printed).
    with open(fd, encoding="utf-8", errors="replace", newline="\n") as fh:
        while True:
            line = fh.readline(max_line)
            if not line:
                return
            yield line.rstrip("\n").removesuffix("\r")


def _umask() -> int:
    """This process's umask, read without setting it (os.umask would change it for every thread meanwhile)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def write_atomic(path: Union[str, Path], data: Union[str, bytes], mode: Optional[int] = None) -> None:
    """Replace ``path`` with ``data`` in one rename: written to a new file beside it (a name nobody can predict,
    created exclusively), then renamed over it. ``mode``: the file's permissions (default: what the umask leaves
    of 0o666, as an ordinary write would); the directory is made when missing."""
    import tempfile  # (not at import: the CLI's start-up reads files, it does not write them)

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask() if mode is None else mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data if isinstance(data, bytes) else data.encode("utf-8"))
        os.replace(tmp, target)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


class NotOwned(Exception):
    """A directory that must be this user's own is not (a link, another user's, writable by group or others)."""


def _writers(mode: int) -> str:
    return " and ".join(who for bit, who in ((0o020, "group"), (0o002, "others")) if mode & bit)


def _others_write(info: os.stat_result) -> bool:
    """Someone else may write this directory: others may, or its group may and the group is not this user's private
    one (a user-private group, as umask 002 systems give every user, has that user alone)."""
    if info.st_mode & 0o002:
        return True
    if not info.st_mode & 0o020:
        return False
    try:
        import grp
        import pwd

        group, me = grp.getgrgid(info.st_gid), pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, ImportError):
        return True
    return not (group.gr_name == me and set(group.gr_mem) <= {me})


def own_dir(path: Union[str, Path]) -> Path:
    """``path`` as a directory of this user's own: made now (missing parents too; group and others may read, never
    write), or, where it exists, a directory reached without a link, owned by this user and writable by nobody else.
    In a shared place a directory someone else made first would let them swap or plant what is run from it."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(target, 0o755)
        os.chmod(target, 0o755 & ~_umask() & ~0o022)
        return target
    except FileExistsError:
        pass
    check_own(target, os.lstat(target))
    return target


def check_own(target: Union[str, Path], info: os.stat_result) -> None:
    """NotOwned unless ``info`` (lstat's, or fstat's of an open handle) is a directory of this user's that nobody
    else may write."""
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise NotOwned(f"{target} is not a directory of yours (a link or a file)")
    if info.st_uid != os.getuid():
        raise NotOwned(f"{target} belongs to another user (uid {info.st_uid}): someone made it before you; use "
                       "another directory")
    if _others_write(info):
        raise NotOwned(f"{target} is writable by {_writers(info.st_mode)}: others could plant files there; chmod go-w "
                       f"{target}, or use another directory")


def own_run_dir(path: Union[str, Path]) -> Path:
    """Make (or check) a job's run directory: its own (datafiles.own_dir) and below directories nobody else can
    change: each one above it belongs to this user or root, and none that others may write lets them rename what it
    holds (a sticky one, like /tmp, does not). Else NotOwned: in such a place the run directory could be swapped
    after this check, and the ranks would write into someone else's. Missing parents are made as own_dir makes it."""
    target = Path(os.path.abspath(path))
    for above in reversed(target.parents):
        try:
            info = os.lstat(above)
        except FileNotFoundError:
            own_dir(above)
            continue
        if info.st_uid not in (0, os.getuid()):
            raise NotOwned(f"{above} above it belongs to another user (uid {info.st_uid})")
        if stat.S_ISDIR(info.st_mode) and _others_write(info) and not info.st_mode & stat.S_ISVTX:
            raise NotOwned(f"{above} above it is writable by {_writers(info.st_mode)}, who could swap it")
    try:
        return own_dir(target)
    except NotOwned as exc:
        raise NotOwned(str(exc).replace(f"{target} ", "it ", 1)) from None
