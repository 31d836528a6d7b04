"""Where clusterddp keeps its files on this machine, by the XDG base-directory rules, in one place."""
from __future__ import annotations

import os
from pathlib import Path

# kind -> (the variable that moves it, the default under the home directory)
_XDG = {"config": ("XDG_CONFIG_HOME", ".config"), "state": ("XDG_STATE_HOME", os.path.join(".local", "state")),
        "cache": ("XDG_CACHE_HOME", ".cache")}


def base(kind: str) -> Path:
    """clusterddp's directory of one XDG kind (config, state, cache): $XDG_<KIND>_HOME/clusterddp."""
    variable, default = _XDG[kind]
    return Path(os.environ.get(variable) or os.path.join(os.path.expanduser("~"), default)) / "clusterddp"


def user_config() -> Path:
    """The user's own configuration file."""
    return base("config") / "config.toml"


def jobs() -> Path:
    """The job records, one directory per cluster."""
    return base("state") / "jobs"


def sweeps() -> Path:
    """The records of submitted sweeps, one directory per cluster."""
    return base("state") / "sweeps"


def mirror() -> Path:
    """Copies of remote jobs' logs and reports, one directory per cluster."""
    return base("state") / "mirror"
