"""The local record of submitted jobs, for ``logs`` and ``status`` after Slurm has forgotten a job."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from . import contract


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "clusterddp" / "jobs"


@dataclass
class JobRecord:
    job_id: str
    script_path: str
    batch_log: str
    run_dir: str
    launcher: str
    procs_per_node: int
    nodes: int

    def save(self) -> Path:
        """Write the record; an older record of another job with the same id (a reset counter, a second cluster
        sharing $HOME) is kept beside it as <id>.json.<n>, never overwritten."""
        d = state_dir()
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{self.job_id}.json"
        old = JobRecord.load(self.job_id) if path.exists() else None
        if old is not None and old.script_path != self.script_path:
            n = 1
            while (d / f"{self.job_id}.json.{n}").exists():
                n += 1
            path.replace(d / f"{self.job_id}.json.{n}")
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, job_id: str) -> Optional["JobRecord"]:
        from .slurm import check_job_id

        path = state_dir() / f"{check_job_id(job_id)}.json"
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def rank_log(self, rank: int) -> Tuple[Path, Optional[str]]:
        """(path, line prefix or None) of one rank's output."""
        run_dir = Path(self.run_dir)
        if self.launcher == "srun":
            return run_dir / contract.RANK_LOG.format(rank=rank), None
        node, local = divmod(rank, self.procs_per_node)
        prefix = contract.TORCHRUN_PREFIX.format(local_rank=local) if self.launcher == "torchrun" else None
        return run_dir / contract.NODE_LOG.format(node=node), prefix

    def logs(self) -> List[Path]:
        run_dir = Path(self.run_dir)
        return sorted(run_dir.glob("rank-*.out")) + sorted(run_dir.glob("node-*.out"))
