"""``make test``: the whole suite as pytest runs side by side: the tests without a cluster (in two runs), and one
run per Slurm release with that release's test cluster (marker ``slurm``). The suite mostly waits (on Slurm, on job
start-up, on watchdogs), so the runs overlap well even on 2 cores.

    python tests/run_both.py [pytest options]      # every run gets the options (not test paths); exit: the worst

Two clusters at once would collide: both are nodes node1-node3 at 10.200.0.x on a bridge cddpbr0 with network
namespaces cddp-node1..., lines in /etc/hosts and /tmp/clusterddp-cluster. So each release's run has a sandbox of
its own (Linux, root): a private mount namespace with its own /run/netns (the nodes' namespaces) and its own copy
of /etc/hosts, in a network namespace of its own (the bridge, the controller's address, the ports and the login
node's sshd live there), and its own cluster directory (CLUSTERDDP_CLUSTER_DIR). The tests and
tests/slurm/cluster.sh are unchanged: inside a sandbox the cluster is the usual one, and nothing of it reaches the
machine or the other runs. Without root (no cluster can start anyway) the runs go unsandboxed.

Each run's output is printed whole when it ends (the first to end first), so the runs never interleave.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.conftest import CACHE, CPU_REPORT, RELEASES  # noqa: E402  (the releases the cluster tests run on)

# The sandbox, as a shell line run by `unshare --mount --net --propagation private` ($1: its directory; the rest:
# the command). A tmpfs on /run/netns hides the machine's network namespace names (ip netns adds its own there);
# (Not a private /tmp: the repository or its venv may live under /tmp, as a CI clone might.)
SANDBOX = r"""set -e
d="$1"; shift
ip link set lo up
mkdir -p /run/netns
mount -t tmpfs -o size=1m,mode=0755 clusterddp-netns /run/netns
cp /etc/hosts "$d/hosts"
mount --bind "$d/hosts" /etc/hosts
exec "$@"
"""


#: The files of the first of the two runs without a cluster (about half of that time: tests/DURATIONS.md).
SPLIT = ("tests/test_drill.py", "tests/test_hangs.py", "tests/test_newcomer.py", "tests/test_observatory_jobs.py",
         "tests/test_migrate.py")


def sandboxable() -> bool:
    return sys.platform.startswith("linux") and os.geteuid() == 0


class CpuGroup:
    """A cgroup (cpuacct, v1 or v2) for one run: the CPU of all it starts, the ranks the test cluster's slurmd
    starts included (a daemon stays in the cgroup it was forked in). Where none can be made (not root, no cgroup
    file system), ``seconds()`` is None."""

    def __init__(self, name: str) -> None:
        self.path: Optional[Path] = None
        self.used: Optional[float] = None  # (read when the run ends)
        for base, usage in ((Path("/sys/fs/cgroup/cpuacct"), "cpuacct.usage"), (Path("/sys/fs/cgroup"), "cpu.stat")):
            if (base / usage).is_file() or (base / "cgroup.controllers").is_file():
                try:
                    (base / name).mkdir(exist_ok=True)
                except OSError:
                    continue
                self.path, self.usage = base / name, usage
                break

    def enter(self) -> None:
        """(In the child, before exec: so that nothing it forks escapes.)"""
        if self.path is not None:
            try:
                (self.path / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                pass

    def seconds(self) -> Optional[float]:
        if self.path is None:
            return None
        try:
            text = (self.path / self.usage).read_text()
        except OSError:
            return None
        if self.usage == "cpu.stat":
            return int(text.split("usage_usec")[1].split()[0]) / 1e6
        return int(text) / 1e9

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()
            except OSError:
                pass


def machine_busy() -> Tuple[int, int]:
    """(busy, total) jiffies of the machine's CPUs since boot (/proc/stat), (0, 0) where there is none."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields[:8]) - idle, sum(fields[:8])


def installed(release: str) -> str:
    """' (slurm-client 26.05.5-1)': what the release's cluster really runs (a moving suite's root may hold another
    release than its label), or '' where it cannot be asked."""
    root = os.environ.get("CLUSTERDDP_SLURM_ROOT") if release != "22.05" else None
    argv = ["dpkg-query", "-W", "-f=${Version}", "slurm-client"]
    if release != "22.05":
        argv = ["chroot", root or f"/var/lib/clusterddp/slurm-{release}", *argv]
    try:
        got = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return f" (slurm-client {got})" if got else ""


def runs(tmp: Path) -> List[Tuple[str, List[str]]]:
    """(title, argv prefix) per run; each has its own --basetemp (pytest prunes old numbered ones, which might be
    another run's)."""
    # The tests without a cluster in two runs (the longest files apart), so that none of the runs is much longer than
    # the others: they mostly wait (on watchdogs, on ranks starting), and a lone long run leaves a core idle.
    local = [sys.executable, "-m", "pytest", "-m", "not slurm"]
    out = [("the tests without a cluster: the drill, the hangs, the first hour, the observatory, migrate",
            [*local, *SPLIT, "--basetemp", str(tmp / "base-a")]),
           ("the tests without a cluster: the rest", [*local, *(f"--ignore={f}" for f in SPLIT),
                                                     "--basetemp", str(tmp / "base-b")])]
    for release in RELEASES:
        pytest = [sys.executable, "-m", "pytest", "-m", "slurm", "--slurm-release", release]
        title = f"the tests on the Slurm {release} test cluster{installed(release)}"
        if sandboxable():
            box = tmp / f"sandbox-{release}"
            box.mkdir()
            out.append((title, ["env", f"CLUSTERDDP_CLUSTER_DIR={box}/cluster", "unshare", "--mount", "--net",
                                "--propagation", "private", "sh", "-c", SANDBOX, "clusterddp-sandbox", str(box),
                                *pytest, "--basetemp", str(box / "base")]))
        else:
            out.append((title, [*pytest, "--basetemp", str(tmp / f"base-{release}")]))
    return out


def main(argv: list) -> int:
    # Under /tmp whatever TMPDIR says: a release's root (24.11, 26.05) sees the machine's /tmp (tests/slurm/cluster.sh),
    # and the tests' jobs there read and write their base temp directories.
    with tempfile.TemporaryDirectory(prefix="clusterddp-tests-", dir="/tmp") as tmp_name:
        tmp = Path(tmp_name)
        tmp.chmod(0o711)  # munged wants every directory above its socket (in a cluster directory here) searchable
        # What one run computes once for all of them (tests/conftest.py: the reference run), under a lock.
        (tmp / "cache").mkdir()
        os.environ[CACHE] = str(tmp / "cache")
        started = time.monotonic()
        procs: list = []
        durations: dict = {}
        codes, ended, cpu = {}, {}, {}
        groups: dict = {}
        busy: list = [machine_busy()]  # every 10 s: how saturated the machine was
        try:
            for i, (title, prefix) in enumerate(runs(tmp)):
                log = open(tmp / f"run-{i}.log", "w+b")
                argv_i = [*prefix, *argv]
                print(f"run_both: {title}: {' '.join(argv_i[argv_i.index('pytest'):])}", flush=True)
                cpu[title] = tmp / f"cpu-{i}.txt"
                env = dict(os.environ, **{CPU_REPORT: str(cpu[title])})
                groups[title] = CpuGroup(f"clusterddp-tests-{os.getpid()}-{i}")
                procs.append((title, log, subprocess.Popen(argv_i, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                                           start_new_session=True, env=env,
                                                           preexec_fn=groups[title].enter)))
            while len(codes) < len(procs):
                for title, log, proc in procs:
                    if title not in codes and proc.poll() is not None:
                        codes[title] = proc.returncode
                        ended[title] = time.monotonic() - started
                        groups[title].used = groups[title].seconds()
                        log.seek(0)
                        text = log.read()
                        sys.stdout.write(f"\n===== {title} (exit {proc.returncode}, {ended[title]:.0f} s) =====\n")
                        sys.stdout.flush()
                        sys.stdout.buffer.write(text)
                        sys.stdout.flush()
                        durations[title] = text.decode("utf-8", "replace")
                        try:
                            cpu[title] = cpu[title].read_text(encoding="utf-8")
                        except OSError:
                            cpu[title] = ""
                time.sleep(1)
                if time.monotonic() - started >= 10 * len(busy):
                    busy.append(machine_busy())
        except BaseException as exc:  # Ctrl-C, or a run that could not start: the runs started end first
            for _, _, proc in procs:  # pytest tears its cluster down on SIGINT
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGINT)
            for _, _, proc in procs:
                proc.wait()
            if isinstance(exc, KeyboardInterrupt):
                return 130
            raise
        finally:
            for _, log, _ in procs:
                log.close()
            for group in groups.values():
                group.remove()
    busy.append(machine_busy())
    machine = saturation(busy)
    for title, group in groups.items():
        if group.used is not None:
            machine += f"\n- {title}: {group.used:.0f} CPU-s with everything it started"
    write_durations(durations, codes, ended, time.monotonic() - started, cpu, machine)
    # 5: no test selected (every test of one kind deselected by the caller's -k/-m): not a failure of the others.
    failed = {t: c for t, c in codes.items() if c not in (0, 5)}
    print(f"\nrun_both: {len(procs)} runs in {time.monotonic() - started:.0f} s: "
          + ", ".join(f"{t} exit {c}" for t, c in codes.items()), flush=True)
    if all(c == 5 for c in codes.values()):
        return 5
    return max(failed.values()) if failed else 0


DURATIONS = ROOT / "tests" / "DURATIONS.md"


def saturation(samples: List[Tuple[int, int]]) -> str:
    """How busy the machine's CPUs were over the runs, from /proc/stat read every 10 s: whether cutting CPU or
    rebalancing the runs would shorten the suite."""
    steps = [(b2 - b1, t2 - t1) for (b1, t1), (b2, t2) in zip(samples, samples[1:]) if t2 > t1]
    if not steps:
        return ""
    busy, total = sum(b for b, _ in steps), sum(t for _, t in steps)
    full = sum(1 for b, t in steps if b >= 0.95 * t)
    return (f"The machine's CPUs ({os.cpu_count()}) were {100 * busy / total:.0f}% busy over the runs; "
            f"{100 * full / len(steps):.0f}% of the 10-second intervals 95% busy or more. CPU per run:")


def write_durations(logs: dict, codes: dict, ended: dict, total: float, cpu: Optional[dict] = None,
                    machine: str = "") -> None:
    """Each run's summary line and slowest tests (pytest's --durations block) into tests/DURATIONS.md, which the
    README links: where the suite's time goes, as measured by the last make test here; with ``cpu``, each run's
    tests that took the most CPU (conftest.CPU_REPORT)."""
    import datetime
    import re

    parts = [f"# Where `make test` spends its time\n\nWritten by `tests/run_both.py` at the end of `make test` "
             f"({datetime.date.today().isoformat()}): {len(logs)} runs side by side, {total:.0f} s in all.\n"]
    if machine:
        parts.append(machine + "\n")
    for title, text in logs.items():
        summary = next((ln.strip("= ") for ln in reversed(text.splitlines()) if re.search(r" in [0-9.]+s", ln)), "")
        block = re.search(r"=+ slowest (?:\d+ )?durations =+\n(.*?)(?:\n\n|\n=)", text, re.S)
        parts.append(f"## {title}\n\nexit {codes[title]}, {ended[title]:.0f} s: {summary}\n\n```\n"
                     f"{block.group(1).strip() if block else '(no --durations report)'}\n```\n")
        used = (cpu or {}).get(title)
        if isinstance(used, str) and used.strip():
            head, _, rest = used.partition("\n")
            note = " (ranks started by the test cluster's slurmd are not counted)" if "Slurm" in title else ""
            parts.append(f"The most CPU (setup to teardown, the test's process and what it reaped){note}: {head}\n\n"
                         f"```\n{rest.rstrip()}\n```\n")
    try:
        DURATIONS.write_text("\n".join(parts), encoding="utf-8")
    except OSError as exc:
        print(f"run_both: could not write {DURATIONS}: {exc}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
