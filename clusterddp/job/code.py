"""Which files of the directory submitted from are the job's code (git's rules), and their hash: shared by the
copy to a remote cluster (backends/ssh/copy.py) and sweeps (a trial's identity is its parameters and its code)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

from ..errors import PreflightError
from .quoting import shown

if TYPE_CHECKING:
    from .spec import JobSpec

MAX_CODE_BYTES = 256 << 20   # a snapshot per code version: data belongs in .gitignore, not in every snapshot


def git_out(args: Sequence[str]) -> Optional[bytes]:
    try:
        proc = subprocess.run(["git", *args], capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def git_files(local_dir: Path) -> Optional[List[str]]:
    """The files of ``local_dir`` that git counts as a work tree's (tracked, or untracked and not ignored), relative
    to it, by every rule git applies; None without git (or for a tree git will not read, such as another user's).

    Outside a git work tree the same rules hold through a throwaway repository whose work tree is the directory
    (rsync's own reading of .gitignore differs: trailing spaces, backslash escapes, negations). Submodules and
    nested repositories go by their own rules, file by file, and never with their .git."""
    listing = ["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."]
    out = git_out(["-C", str(local_dir), *listing])
    stage = git_out(["-C", str(local_dir), "ls-files", "-z", "--stage", "--", "."]) if out is not None else b""
    if out is None:
        if git_out(["-C", str(local_dir), "rev-parse", "--git-dir"]) is not None:
            return None  # inside a repository git refuses to read (another user's): not guessed here
        with tempfile.TemporaryDirectory(prefix="clusterddp-git-") as tmp:
            if git_out(["init", "-q", tmp]) is None:
                return None
            out = git_out(["-C", str(local_dir), f"--git-dir={tmp}/.git", f"--work-tree={local_dir}", *listing])
        if out is None:
            return None
    gitlinks = {os.fsdecode(e.split(b"\t", 1)[1]) for e in (stage or b"").split(b"\0") if e.startswith(b"160000 ")}
    names: List[str] = []
    for name in dict.fromkeys(os.fsdecode(n) for n in out.split(b"\0") if n):
        path = local_dir / name.rstrip("/")
        if name.endswith("/") or name in gitlinks:  # a nested repository or a submodule: its own files and rules
            inner = git_files(path) if (path / ".git").exists() else []
            names += [f"{name.rstrip('/')}/{n}" for n in inner or []]
        elif path.is_symlink() or not path.is_dir():
            names.append(name)
    return names


def output_top(spec: "JobSpec", cwd: Optional[Path] = None) -> Optional[str]:
    """The top directory of --output-dir (the runs' outputs, never copied, never code) inside the directory
    submitted from (``cwd``: relative dirs always are; an absolute one when it lies inside it), or None."""
    out = Path(spec.output_dir)
    if out.is_absolute() and cwd is not None:
        try:
            out = Path(os.path.realpath(out)).relative_to(os.path.realpath(cwd))
        except ValueError:
            return None
    return out.parts[0] if not out.is_absolute() and out.parts and out.parts[0] not in ("..", ".") else None


def leaves(cwd: Path, name: str) -> bool:
    """``name`` is a link that leads out of ``cwd`` (absolute, or up past it): its target is code here (hashed by
    content, copied as a file), since a snapshot or a remote copy would not have it."""
    path = cwd / name
    if not path.is_symlink():
        return False
    target = os.readlink(path)
    if os.path.isabs(target):
        return True
    inside = os.path.normpath(os.path.join(os.path.dirname(name), target))
    return inside == ".." or inside.startswith("../")


def selected_names(spec: "JobSpec", local_dir: Path) -> Optional[List[str]]:
    """What of ``local_dir`` is copied, as relative names (git's rules); None without git (rsync filters then)."""
    out_top = output_top(spec, local_dir)
    names = git_files(local_dir)
    if names is None:
        return None
    return [n for n in names if not {".git", "__pycache__"} & set(n.split("/")) and n.split("/")[0] != out_top
            and os.path.lexists(local_dir / n)]  # (a tracked file deleted here is not asked for)


# --- the code: which files, their hash, their snapshot ------------------------------------------------------
def code_files(spec: JobSpec, cwd: Path) -> List[str]:
    """The files of the directory submitted from that make the sweep's code: git's rules (as a remote copy
    takes), never .git, __pycache__ or the output directory."""
    names = selected_names(spec, cwd)
    if names is None:  # no git: every file, less the same exclusions
        top = output_top(spec, cwd)
        names = []
        for base, subdirs, files in os.walk(cwd):
            rel = os.path.relpath(base, cwd)
            subdirs[:] = [d for d in subdirs if d not in (".git", "__pycache__") and not (rel == "." and d == top)]
            names += [os.path.normpath(os.path.join(rel, f)) for f in files]
    return sorted(names)


def code_hash(cwd: Path, names: Sequence[str]) -> str:
    """One hash of the files' names and contents (a link inside the directory by where it points, one that leads out
    of it by its target's content): the code's identity in trial keys."""
    h, total = hashlib.sha256(), 0
    for name in names:
        path = cwd / name
        h.update(os.fsencode(name) + b"\0")
        if path.is_symlink() and not leaves(cwd, name):
            h.update(b"link:" + os.fsencode(os.readlink(path)))
        elif path.is_file():
            total += path.stat().st_size
            if total > MAX_CODE_BYTES:
                raise PreflightError(f"the directory you submit from, {cwd}, holds more than "
                                     f"{MAX_CODE_BYTES >> 20} MiB of files that are not ignored (at {shown(name)}): "
                                     "every code version of a sweep is kept as a snapshot; add data and checkpoints "
                                     "to .gitignore, or submit from a smaller directory")
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        h.update(b"\0")
    return h.hexdigest()[:16]
