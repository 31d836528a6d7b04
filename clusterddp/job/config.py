"""Profiles: job spec defaults from configuration files and the environment.

Precedence, lowest first: built-in defaults < user file ($XDG_CONFIG_HOME/clusterddp/config.toml) < project file
(clusterddp.toml, or [tool.clusterddp] in pyproject.toml, found from the current directory upwards) <
CLUSTERDDP_<FIELD> environment variables < the command line. In each file, ``[defaults]`` applies first, then
``[profiles.NAME]`` when ``--profile NAME`` (or CLUSTERDDP_PROFILE) is given. Keys are JobSpec field names.

Trust (cluster file systems are shared): the project search stops at the project root (the first directory with
.git, pyproject.toml or clusterddp.toml) or at $HOME, and a file owned by another user (root excepted), or
writable by group or others, is skipped with a warning, as git's safe.directory does: its ``setup`` lines are
shell code, its ``python`` and ``env`` decide what runs. ``CLUSTERDDP_TRUST=PATH[:PATH...]`` (or ``*``) opts in.

What decides where your code goes and what ssh runs on your own machine (``[clusters.NAME]`` and ``cluster =``)
is taken from the user file, and from a project file only once you trusted that file explicitly: a repository you
cloned is owned by you, yet written by someone else. ``clusterddp trust FILE`` records its path and content hash
(a change needs trusting again, as direnv does); ``CLUSTERDDP_TRUST`` naming it also counts. Even then, a project's
cluster never replaces one of the user's of the same name.
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .. import contract
from ..dirs import user_config as user_file
from ..errors import SpecError
from .ids import HERE
from .parse import suggest
from .spec import JobSpec, field_names
from .trust import TRUST_VARIABLE, distrust, untrusted_note, why_not_trusted

# Fields a file may set: everything but what is given per run.
FILE_KEYS = [n for n in field_names() if n not in ("script", "args", "module", "after", "sweep")] + \
    ["template_dirs", "cluster"]
LIST_KEYS = {"setup", "sbatch_args", "template_dirs", "exclude"}
# Variables that clusterddp's own job scripts export; inside a job they describe that job, not defaults.
_RUNTIME_NAMES = {"launcher", "gpus_per_node", "procs_per_node"}


def _types() -> Dict[str, str]:
    kinds = {}
    for f in dataclasses.fields(JobSpec):
        t = str(f.type)
        kinds[f.name] = ("bool" if "bool" in t else "int" if "int" in t else "env" if f.name == "env" else
                         "list" if f.name in LIST_KEYS else "str")
    kinds["template_dirs"] = "list"
    kinds["cluster"] = "str"  # the default cluster's name (clusters.py)
    return kinds


KINDS = _types()
_EXPECTED = {"env": 'a table of NAME = "value"', "list": "a list of strings", "int": "an integer",
             "bool": "true or false", "str": "a string"}


def read_toml(path: Path) -> Dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except (OSError, ValueError) as exc:
        raise SpecError(f"cannot read {path}: {exc}") from None


#: Keys of [defaults] and [profiles.NAME] that decide where code goes: a project file sets them only when trusted.
WHERE_KEYS = ("cluster",)


_WARNED: set = set()


def warn_once(text: str) -> None:
    """A warning on stderr, once per process (configuration is read several times per command)."""
    if text not in _WARNED:
        _WARNED.add(text)
        print(f"clusterddp: warning: {text}", file=sys.stderr)




def project_file(start: Optional[Path] = None, skipped: Optional[List[Tuple[Path, str]]] = None,
                 environ: Optional[Mapping[str, str]] = None) -> Tuple[Optional[Path], Dict[str, Any]]:
    """The nearest clusterddp.toml, or pyproject.toml with [tool.clusterddp], from ``start`` up to the project
    root or $HOME. Untrusted files are skipped (and appended to ``skipped`` with the reason)."""
    here = (start or Path.cwd()).resolve()
    home = Path(os.path.expanduser("~")).resolve()
    for d in [here, *here.parents]:
        for name in ("clusterddp.toml", "pyproject.toml"):
            path = d / name
            if not path.is_file():
                continue
            why = distrust(path, environ)
            if why:
                if skipped is not None:
                    skipped.append((path, why))
                continue
            data = read_toml(path)
            if name == "clusterddp.toml":
                return path, data
            tool = data.get("tool", {})
            if isinstance(tool, dict) and "clusterddp" in tool:
                if not isinstance(tool["clusterddp"], dict):
                    raise SpecError(f"{path}: [tool.clusterddp] must be a table, got {tool['clusterddp']!r}")
                return path, tool["clusterddp"]
        # The project root ends the search: a file above it belongs to somebody else's tree.
        if d == home or any((d / marker).exists() for marker in (".git", "pyproject.toml", "clusterddp.toml")):
            break
    return None, {}


def _coerce(key: str, value: Any, where: str) -> Any:
    kind = KINDS[key]
    bad = SpecError(f"{where}: {key} must be {_EXPECTED[kind]}, got {value!r}")
    if kind == "int":
        if isinstance(value, bool):
            raise bad
        if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,12}", value):  # ASCII digits ("²".isdigit() is True)
            return int(value)
        if not isinstance(value, int):
            raise bad
        return value
    if kind == "bool":
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        if not isinstance(value, bool):
            raise bad
        return value
    if kind == "list":
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad
        return list(value)
    if kind == "env":
        if not isinstance(value, dict):
            raise bad
        for k, v in value.items():
            # A string as written, or an integer (the same digits); never Python's spelling of True or 1500.0.
            if isinstance(v, bool) or not isinstance(v, (str, int)):
                raise SpecError(f"{where}: env.{k} must be a string (or an integer), got {v!r}; quote it, e.g. "
                                f'{k} = "{str(v).lower() if isinstance(v, bool) else v}"')
        return {str(k): str(v) for k, v in value.items()}
    if not isinstance(value, str):
        raise bad
    return value


def _table(values: Mapping[str, Any], where: str) -> Dict[str, Any]:
    out = {}
    for key, value in values.items():
        if key not in FILE_KEYS:
            raise SpecError(f"{where}: unknown key {key!r}{suggest(key, FILE_KEYS)}; valid keys: "
                            f"{', '.join(FILE_KEYS)}")
        out[key] = _coerce(key, value, where)
    return out


def config_files(environ: Optional[Mapping[str, str]] = None, cwd: Optional[Path] = None,
                 skipped: Optional[List[Tuple[Path, str]]] = None) -> List[Tuple[Path, Dict[str, Any]]]:
    """The trusted configuration files, lowest precedence first: (path, parsed TOML)."""
    environ = os.environ if environ is None else environ
    skipped = [] if skipped is None else skipped
    files: List[Tuple[Path, Dict[str, Any]]] = []
    if user_file().is_file():
        why = distrust(user_file(), environ)
        if why:
            skipped.append((user_file(), why))
        else:
            files.append((user_file(), read_toml(user_file())))
    path, data = project_file(cwd, skipped, environ)
    if path is not None:
        files.append((path, data))
    return files


def layers(profile: Optional[str] = None, environ: Optional[Mapping[str, str]] = None,
           cwd: Optional[Path] = None, skipped: Optional[List[Tuple[Path, str]]] = None
           ) -> List[Tuple[str, Dict[str, Any]]]:
    """(source, values) from lowest to highest precedence, below the command line. Files that are not trusted
    are left out and listed in ``skipped`` (path, reason)."""
    environ = os.environ if environ is None else environ
    skipped = [] if skipped is None else skipped
    profile = profile or environ.get("CLUSTERDDP_PROFILE") or None
    out: List[Tuple[str, Dict[str, Any]]] = []
    profiles_seen: List[str] = []
    files = config_files(environ, cwd, skipped)
    for path, data in files:
        unknown = [k for k in data if k not in ("defaults", "profiles", "clusters")]
        if unknown:
            raise SpecError(f"{path}: unknown table {unknown[0]!r}; expected [defaults], [profiles.NAME] and "
                            "[clusters.NAME]")
        defaults, profiles = data.get("defaults", {}), data.get("profiles", {})
        for table, value in (("defaults", defaults), ("profiles", profiles)):
            if not isinstance(value, dict):
                raise SpecError(f"{path}: {table} must be a table ([{table}] or [{table}.NAME]), got {value!r}")
        for pname, value in profiles.items():
            if not isinstance(value, dict):
                raise SpecError(f"{path}: profiles.{pname} must be a table ([profiles.{pname}]), got {value!r}")
        why = why_not_trusted(path, environ)
        chosen = [("defaults", defaults)] + ([(f"profiles.{profile}", profiles[profile])]
                                              if profile and profile in profiles else [])
        for table, values in chosen:
            where = f"{path} [{table}]"
            values = _table(values, where)
            for key in WHERE_KEYS:
                if why and key in values:
                    warn_once(untrusted_note(path, f"{key} = {values.pop(key)!r} in [{table}]", why))
            out.append((where, values))
        profiles_seen += list(profiles)
    if profile and profile not in profiles_seen:
        places = ", ".join(str(p) for p, _ in files) or "no configuration file found"
        raise SpecError(f"unknown profile {profile!r}{suggest(profile, profiles_seen)}; profiles defined: "
                        f"{', '.join(sorted(set(profiles_seen))) or 'none'} ({places})")
    env_values = {}
    inside_job = contract.RUN_DIR in environ
    for key in FILE_KEYS:
        name = f"CLUSTERDDP_{key.upper()}"
        if name in environ and key != "template_dirs" and not (inside_job and key in _RUNTIME_NAMES):
            env_values[key] = _coerce(key, environ[name], f"environment {name}")
    if env_values:
        out.append(("environment CLUSTERDDP_*", env_values))
    return out


def resolve(profile: Optional[str] = None, environ: Optional[Mapping[str, str]] = None,
            cwd: Optional[Path] = None, skipped: Optional[List[Tuple[Path, str]]] = None
            ) -> Dict[str, Tuple[Any, str]]:
    """key -> (value, source) after merging the layers (env tables merge; lists append)."""
    merged: Dict[str, Tuple[Any, str]] = {}
    for source, values in layers(profile, environ, cwd, skipped):
        for key, value in values.items():
            if key == "env" and key in merged:
                value = {**merged[key][0], **value}
            elif key in LIST_KEYS and key in merged:
                value = merged[key][0] + value
            merged[key] = (value, source)
    return merged


def skip_warning(path: Path, why: str) -> str:
    return (f"clusterddp: warning: ignored {path}: {why}; its settings could run code in your jobs "
            f"(if you trust it: {TRUST_VARIABLE}={path})")


def show(profile: Optional[str] = None) -> str:
    """Every file-settable field with its merged value and where it came from, then the skipped files."""
    skipped: List[Tuple[Path, str]] = []
    merged = resolve(profile, skipped=skipped)
    defaults = {f.name: f.default for f in dataclasses.fields(JobSpec)}
    lines = []
    for key in FILE_KEYS:
        if key in merged:
            value, source = merged[key]
        else:
            value, source = (defaults.get(key, HERE if key == "cluster" else ()), "built-in default")
        lines.append(f"{key:<15} = {value!r:<32}  # {source}")
    lines += [f"# skipped {path}: {why} (trust it with {TRUST_VARIABLE}={path})" for path, why in skipped]
    return "\n".join(lines) + "\n"
