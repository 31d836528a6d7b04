"""A job array's tasks as data (``JobSpec.sweep``): what each task exports, the arguments it runs with and the record
it files. Sweeps build one (sweeps/grid.py's ``job_array``); the batch script's renderer and the local backend read
it. Here, in job/, so that the job and its renderer never import the sweeps that fill it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple


@dataclass(frozen=True)
class ArrayTrial:
    """One array task: its case arm in the batch script."""

    index: int                            # SLURM_ARRAY_TASK_ID
    exports: Tuple[Tuple[str, str], ...]  # its own variables (CLUSTERDDP_PARAM_*), besides the job's
    args: Tuple[str, ...]                 # the script's arguments, this task's values filled in
    record: str                           # the JSON it writes to its run directory (trial.json)

    def env(self) -> List[Tuple[str, str]]:
        """Its own variables (the local backend's name for ``exports``)."""
        return list(self.exports)


@dataclass(frozen=True)
class JobArray:
    """The array's tasks, one per trial (their indices need not be contiguous: a rerun's are those it reruns)."""

    trials: Tuple[ArrayTrial, ...]

    def indices(self, max_parallel: Optional[int]) -> str:
        """sbatch's --array: the tasks' indices, runs compressed (0-3,7), %N at most N at once."""
        runs: List[List[int]] = []
        for i in sorted(t.index for t in self.trials):
            if runs and i == runs[-1][1] + 1:
                runs[-1][1] = i
            else:
                runs.append([i, i])
        text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
        return text + (f"%{max_parallel}" if max_parallel else "")
