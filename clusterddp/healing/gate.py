"""The health gate's check on one node (``python -m clusterddp.healing gate DIR [CHECK]``, one srun task per node
before an attempt): the run directory is writable from here, the GPUs the job asks for are visible, the user's
--health-check (shell code by design) passes. It leaves NODE.ok in DIR when all do; what it says goes to NODE.out."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Optional

from .. import contract


def check(directory: Path, health_check: str, node: Optional[str] = None) -> int:
    node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    probe = directory / f"{node}.probe"
    try:
        probe.touch()
        probe.unlink()
    except OSError:
        print(f"the run directory is not writable from {node}", flush=True)
        return 1
    want = os.environ.get(contract.GPUS_PER_NODE, "0")
    if want.isdigit() and int(want) > 0 and shutil.which("nvidia-smi"):
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
        seen = sum(1 for line in listed.splitlines() if line.startswith("GPU"))
        if seen < int(want):
            print(f"{seen} of {want} GPUs visible (nvidia-smi -L)", flush=True)
            return 1
    if health_check:
        code = subprocess.run(["bash", "--norc", "-c", health_check]).returncode
        if code != 0:
            print(f"--health-check exited with {code}", flush=True)
            return 1
    (directory / f"{node}.ok").touch()
    return 0
