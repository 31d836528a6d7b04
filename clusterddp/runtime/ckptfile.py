"""One checkpoint file on disk: written atomically with its manifest (step, size, SHA-256), and checked against it
before a load. The manifest goes in place before the checkpoint does, so a checkpoint under its name has one."""
from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from typing import Any, Callable, Dict, List, Optional, cast


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


def atomic(path: str, fill: Callable[[Any], None], before: Optional[Callable[[], None]] = None) -> None:
    """``fill(file)`` writes a temp file of mode 0600 beside ``path``; fsync, ``before()``, then the rename: a reader
    sees the old file or the new one, whole (the temp file goes if anything fails)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
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
    """torch.save to a temp file, then its manifest, then the rename: a checkpoint under its name has its manifest."""
    import torch

    out: List[_Hashing] = []

    def fill(fh: Any) -> None:
        out.append(_Hashing(fh))
        torch.save(payload, cast(Any, out[0]))  # (a file object: write and flush)

    def manifest() -> None:
        record = {"file": os.path.basename(path), "step": payload["step"], "size": out[0].size,
                  "sha256": out[0].sha.hexdigest()}
        atomic(manifest_of(path), lambda fh: fh.write(json.dumps(record).encode()))

    atomic(path, fill, manifest)


def verify(path: str) -> None:
    """Raise when ``path`` differs from its manifest (size or SHA-256). A checkpoint without one (an older
    clusterddp's) or with one that is not this user's regular file is loaded on its own merits, as before."""
    manifest = manifest_of(path)
    try:
        info = os.lstat(manifest)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size > 4096:
            return
        with open(manifest, "rb") as fh:
            record = json.loads(fh.read(4096))
    except (OSError, ValueError):
        return
    if not isinstance(record, dict) or record.get("file") != os.path.basename(path):
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
