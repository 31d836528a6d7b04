"""The script as a file: its encoding (PEP 263, a BOM) and line ends read as they are, its permissions given to
what migrate writes, a backup that never replaces an earlier one. No LibCST here."""
from __future__ import annotations

import io
import os
import stat
import tokenize
from pathlib import Path
from typing import NamedTuple

from ..datafiles import write_atomic
from ..errors import SpecError


class Script(NamedTuple):
    """What was read: the text (line ends as in the file), how to encode it back, and the file's permissions."""

    raw: bytes
    text: str
    encoding: str
    mode: int


def read_script(path: Path) -> Script:
    """The file's bytes decoded as Python decodes them (a coding line, a UTF-8 BOM; else UTF-8)."""
    try:
        raw = path.read_bytes()
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise SpecError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        text = raw.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot be read as Python source text ({exc}); it is decoded as Python does: "
                        "UTF-8, or the encoding its '# -*- coding: ... -*-' line names; nothing was written") from None
    return Script(raw, text, encoding, mode)


def write_like(target: Path, text: str, like: Script) -> None:
    """``text`` written in the original's encoding, with the original's permissions (a private script stays
    private, an executable one executable)."""
    write_atomic(target, text.encode(like.encoding), mode=like.mode)


def backup(script: Path, like: Script) -> Path:
    """The original's bytes kept beside it before an in-place rewrite: SCRIPT.orig, or SCRIPT.orig.N when that
    holds something else (an earlier original is never replaced). An existing backup of the same bytes is used."""
    for n in range(1000):
        candidate = script.with_name(script.name + (".orig" if n == 0 else f".orig.{n}"))
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, like.mode or 0o600)
        except FileExistsError:
            try:
                if candidate.is_file() and not candidate.is_symlink() and candidate.read_bytes() == like.raw:
                    return candidate
            except OSError:
                pass
            continue
        except OSError as exc:
            raise SpecError(f"{candidate}: cannot keep the original there ({exc.strerror or exc}); nothing was "
                            "written") from None
        with os.fdopen(fd, "wb") as fh:
            fh.write(like.raw)
        os.chmod(candidate, like.mode)
        return candidate
    raise SpecError(f"{script}.orig to .orig.999 exist already: remove old backups to migrate in place again")
