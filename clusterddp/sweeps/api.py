"""map_array's configs as a sweep: each config a trial with a run directory of its own (trial.json, attempts.tsv,
runtime.report's metrics), recorded as `clusterddp sweep` records its trials, so `clusterddp sweep status NAME`
shows them. The wrapper runs in every task (pickled by submitit); the record is written here after submission."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, List, Sequence, Tuple

from .. import contract
from ..job.ids import HERE, LOCAL
from .grid import IDENTIFIER, Trial, check_sweep_name


def params_of(config: Any) -> Tuple[Tuple[str, str], ...]:
    """A config's parameters: a mapping's items (names that are identifiers), else the config's repr."""
    if isinstance(config, dict) and config and all(isinstance(k, str) and IDENTIFIER.match(k) for k in config):
        return tuple((k, str(v)) for k, v in config.items())
    return (("config", repr(config)),)


def plan(fn: Callable, configs: Sequence[Any]) -> List[Trial]:
    name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    out = []
    for i, c in enumerate(configs):
        params = params_of(c)
        blob = json.dumps({"fn": name, "index": i, "params": params}, sort_keys=True)
        out.append(Trial(i, params, hashlib.sha256(blob.encode()).hexdigest()[:16]))
    return out


class TrialCall:
    """Runs one trial's call in every task: its run directory and parameters in the environment (rank 0 writes
    trial.json first and the attempt's end last)."""

    def __init__(self, call: Callable[[], Any], sweep: str, sweep_dir: str, trial: Trial) -> None:
        self.call, self.sweep, self.sweep_dir, self.trial = call, sweep, sweep_dir, trial

    def __call__(self) -> Any:
        import submitit

        from ..healing import attempts

        env = submitit.JobEnvironment()
        run_dir = Path(self.sweep_dir) / f"{self.sweep}-{env.job_id}"
        os.environ.update({contract.RUN_DIR: str(run_dir), contract.TRIAL: str(self.trial.index),
                           **dict(self.trial.env())})
        main = env.global_rank == 0
        if main:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / contract.TRIAL_FILE).write_text(json.dumps(self.trial.record(self.sweep), sort_keys=True))
        start, code = int(time.time()), 1
        try:
            result = self.call()
            code = 0
            return result
        finally:
            if main:
                attempts.append(run_dir, attempts.Attempt(0, 0, start, int(time.time()), (socket.gethostname(),),
                                                          code, "", (), "", contract.NEXT_END))

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:  # submitit calls this on preemption
        return None


def record(name: str, spec: Any, trials: Sequence[Trial], job_ids: Sequence[str], local: bool) -> None:
    """The sweep's record, as `clusterddp sweep` writes it (its origin: map_array, which reruns by being called).
    A later call with the same name adds its trials and its array to the record; earlier ones stay."""
    from ..errors import SpecError
    from .run import LOCAL_RECORDS, RecordLock, SweepRecord, spec_fields, sweep_dir_for

    check_sweep_name(name)
    where = LOCAL_RECORDS if local else HERE
    array = job_ids[0].split("_")[0] if job_ids else ""
    with RecordLock(where, name):
        path = SweepRecord.path(where, name)
        rec = SweepRecord.read(path) if os.path.lexists(path) else SweepRecord(
            name, where, sweep_dir_for(spec, name, False), spec_fields(spec), submitted_from=os.getcwd(),
            origin="map_array")
        if rec.origin != "map_array":
            raise SpecError(f"sweep {name} was submitted by `clusterddp sweep`: give map_array another name")
        rec.trials.update({t.key: {"index": t.index, "params": [list(p) for p in t.params], "code": ""}
                           for t in trials})
        rec.submissions.append({"job_id": LOCAL if local else array, "time": int(time.time()),
                                "tasks": {} if local else {str(t.index): t.key for t in trials}})
        rec.save()
