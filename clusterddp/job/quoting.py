"""How user values are written into a batch script: one encoder per parser, and nothing else encodes.

- ``#SBATCH`` lines are read by sbatch, not by a shell: :func:`sbatch_quote`.
- Shell words are read by bash: :func:`shell_quote`. No physical line of the script ever starts with user text:
  a value holding a line break or another control character is written as ``$'...'`` with octal escapes.
- Words in command position (interpreter, container image) cannot be read as an option, an assignment, a job
  spec or a tilde expression: :func:`check_command_word` refuses those shapes.
"""
from __future__ import annotations

import re
import shlex

from ..errors import SpecError

# Values made only of these characters need no quotes on an #SBATCH line (no space, quote, backslash or '#').
_SBATCH_BARE = re.compile(r"[A-Za-z0-9._:/%@+,=-]+")
# What shlex leaves bare; everything else is quoted.
_SHELL_BARE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")


def shown(value: str, limit: int = 60) -> str:
    """``repr(value)``, shortened: error messages stay one readable line whatever the value."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def check_one_line(value: str, what: str) -> None:
    """Refuse what would end the line (shell code such as --setup lines keeps tabs)."""
    for bad in ("\n", "\r", "\0"):
        name = _NAMES[bad]
        if bad in value:
            raise SpecError(f"{what} {shown(value)} contains {name}; it must fit on one line")


_NAMES = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL byte", "\t": "a tab"}


def check_utf8(value: str, what: str) -> None:
    """Refuse bytes that are not UTF-8 (Python keeps them from argv and the environment as surrogates)."""
    if _SURROGATE.search(value):
        raise SpecError(f"{what} {shown(value)} holds bytes that are not valid UTF-8; give it in UTF-8")


def check_no_control(value: str, what: str) -> None:
    """Refuse every control character (C0 and DEL): for values that are names, not free text."""
    m = _CONTROL.search(value)
    if m:
        name = _NAMES.get(m.group(), f"the control character {m.group()!r}")
        raise SpecError(f"{what} {shown(value)} contains {name}; it must be one line without control characters")


def sbatch_quote(value: str) -> str:
    """Encode a value for an ``#SBATCH`` line, which sbatch (not a shell) parses.

    sbatch reads ``\\`` as an escape even inside quotes and an unquoted ``#`` starts a comment, so shell quoting
    is wrong here: wrap in double quotes, escape ``\\`` and ``"``. Control characters cannot be encoded at all.
    """
    check_no_control(value, "#SBATCH value")
    if _SBATCH_BARE.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _octal(m: "re.Match[str]") -> str:
    return "\\%03o" % ord(m.group())


def shell_quote(value: str) -> str:
    """One bash word that expands to exactly ``value`` (NUL excepted, which no program can receive).

    Plain values use shlex's single quotes. A value with a control character uses ``$'...'`` with octal escapes,
    so that a newline in a value never starts a physical line of the script (sbatch reads ``#PBS``/``#BSUB``
    lines anywhere near the top, and a ``\\r`` makes it refuse the script).
    """
    if "\0" in value:
        raise SpecError(f"value {shown(value)} contains a NUL byte, which no program can receive")
    if _SHELL_BARE.fullmatch(value):
        return value
    if not _CONTROL.search(value):
        return shlex.quote(value)
    body = value.replace("\\", "\\\\").replace("'", "\\'")
    return "$'" + _CONTROL.sub(_octal, body) + "'"


def check_command_word(value: str, what: str, option: str) -> None:
    """A word that bash or a launcher runs as a command must read as a command, whatever it holds."""
    check_no_control(value, what)
    if not value.strip():
        raise SpecError(f"{what} must not be empty")
    why = ("starts with '-', so the launcher would read it as an option" if value.startswith("-") else
           "starts with '~', which is not expanded here; give the full path (e.g. $HOME/...)"
           if value.startswith("~") else
           "starts with '%', which bash reads as a job specification" if value.startswith("%") else
           "has the shape NAME=VALUE, which bash reads as an assignment" if _ASSIGNMENT.match(value) else "")
    if why:
        hint = "prefix a relative path with ./" if not value.startswith("~") else "write the path out"
        raise SpecError(f"{what} {shown(value)} {why}; {hint} ({option})")


def path_word(path: str) -> str:
    """A relative path that starts with '-' gets './' in front: the same file, never an option."""
    return "./" + path if path.startswith("-") else path
