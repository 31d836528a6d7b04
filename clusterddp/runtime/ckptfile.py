"""One checkpoint file on disk: written atomically with its manifest (step, size, SHA-256, the run that wrote it),
and checked against it before a load. The manifest goes in place before the checkpoint does, so a checkpoint under
its name has one. Temp files carry the writing run's tag (``.tmp-TAG-...``): a run removes its own stale ones, never
another run's write in flight."""
from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from typing import Any, Callable, Dict, List, Optional, cast

from ..datafiles import parse_json


class _Hashing:
    """The file torch.save writes through: the manifest's digest with no second read of a large file."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.sha, self.size = fh, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        self.sha.update(data)
        self.size += len(data)
        return int(self.fh.write(data))

    def flush(self) -> None:
        self.fh.flush()


def manifest_of(path: str) -> str:
    return path[:-len(".pt")] + ".json"


TMP_PREFIX = ".tmp-"


def tag(run: Optional[str]) -> str:
    """A run's mark in its temp files' names (file-name safe, fixed length)."""
    return hashlib.sha256((run or "").encode("utf-8", "surrogateescape")).hexdigest()[:12]


def atomic(path: str, fill: Callable[[Any], None], before: Optional[Callable[[], None]] = None,
           run_tag: str = "") -> None:
    """``fill(file)`` writes a temp file of mode 0600 beside ``path``; fsync, ``before()``, then the rename: a reader
    sees the old file or the new one, whole (the temp file goes if anything fails, but for a kill)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{run_tag}-" if run_tag else TMP_PREFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
        if before is not None:
            before()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write(payload: Dict[str, Any], path: str) -> None:
    """torch.save to a temp file, then its manifest, then the rename: a checkpoint under its name has its manifest.
    ``payload["run"]``: the run that writes it (its manifest says so; its temp files carry its tag)."""
    import torch

    out: List[_Hashing] = []

    def fill(fh: Any) -> None:
        out.append(_Hashing(fh))
        torch.save(payload, cast(Any, out[0]))  # (a file object: write and flush)

    def manifest() -> None:
        record = {"file": os.path.basename(path), "step": payload["step"], "size": out[0].size,
                  "sha256": out[0].sha.hexdigest(), "run": payload.get("run"), "trial": bool(payload.get("trial"))}
        atomic(manifest_of(path), lambda fh: fh.write(json.dumps(record).encode()), run_tag=run_tag)

    run_tag = tag(payload.get("run"))
    atomic(path, fill, manifest, run_tag=run_tag)


def remove_stale(directory: str, run: Optional[str]) -> None:
    """Remove the temp files a write of ``run`` left when it was killed half-way (call it only while no write of
    this run is in flight): this user's regular files with the run's tag, nothing else."""
    prefix = f"{TMP_PREFIX}{tag(run)}-"
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
                os.unlink(path)
        except OSError:
            continue


def manifest(path: str) -> Optional[Dict[str, Any]]:
    """The manifest of checkpoint ``path`` when it is this user's regular file naming that checkpoint, else None
    (an older clusterddp's checkpoint has none)."""
    try:
        info = os.lstat(manifest_of(path))
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size > 4096:
            return None
        with open(manifest_of(path), "rb") as fh:
            record = parse_json(fh.read(4096))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("file") == os.path.basename(path) else None


def verify(path: str, record: Optional[Dict[str, Any]]) -> None:
    """Raise when ``path`` differs from its manifest ``record`` (size or SHA-256). A checkpoint without one (an older
    clusterddp's) is loaded on its own merits, as before."""
    if record is None:
        return
    size = os.path.getsize(path)
    if size != record.get("size"):
        raise ValueError(f"{size} bytes, its manifest says {record.get('size')}")
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            sha.update(block)
    if sha.hexdigest() != record.get("sha256"):
        raise ValueError("its SHA-256 differs from its manifest's: changed after it was written")
