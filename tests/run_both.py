"""``make test``: the whole suite as two pytest runs side by side, one with every test of the Slurm test cluster
(marker ``slurm``: both releases, one after the other, since their clusters share namespaces, addresses and
/tmp/clusterddp-cluster), one with the rest. Most cluster tests wait on Slurm while the others keep the CPUs busy,
so the two overlap well (pytest-xdist's groups would do this, but its loadgroup mode does not group on pytest 9.2).

    python tests/run_both.py [pytest options]      # both runs get the options; exit status: the worse of the two

Each run's output is printed whole when it ends (the first to end first), so the two never interleave.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = (("the tests without a cluster", "not slurm"), ("the tests on the Slurm test cluster", "slurm"))


def main(argv: list) -> int:
    with tempfile.TemporaryDirectory(prefix="clusterddp-tests-") as tmp:
        started = time.monotonic()
        procs = []
        for i, (title, marks) in enumerate(RUNS):
            log = open(Path(tmp) / f"run-{i}.log", "w+b")
            # Each run its own base temp directory: pytest prunes old numbered ones, which might be the other's.
            argv_i = [sys.executable, "-m", "pytest", "-m", marks, "--basetemp", str(Path(tmp) / f"base-{i}"), *argv]
            print(f"run_both: {title}: {' '.join(argv_i[1:])}", flush=True)
            procs.append((title, log, subprocess.Popen(argv_i, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)))
        codes = {}
        try:
            while len(codes) < len(procs):
                for title, log, proc in procs:
                    if title not in codes and proc.poll() is not None:
                        codes[title] = proc.returncode
                        log.seek(0)
                        sys.stdout.write(f"\n===== {title} (exit {proc.returncode}, "
                                         f"{time.monotonic() - started:.0f} s) =====\n")
                        sys.stdout.flush()
                        sys.stdout.buffer.write(log.read())
                        sys.stdout.flush()
                time.sleep(1)
        except KeyboardInterrupt:
            for _, _, proc in procs:  # pytest tears the cluster down on SIGINT
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
            for _, _, proc in procs:
                proc.wait()
            return 130
        finally:
            for _, log, _ in procs:
                log.close()
    # 5: no test selected (every test of one kind deselected by the caller's -k/-m): not a failure of the other.
    failed = {t: c for t, c in codes.items() if c not in (0, 5)}
    print(f"\nrun_both: {len(procs)} runs in {time.monotonic() - started:.0f} s: "
          + ", ".join(f"{t} exit {c}" for t, c in codes.items()), flush=True)
    if all(c == 5 for c in codes.values()):
        return 5
    return max(failed.values()) if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
