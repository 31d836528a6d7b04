"""Shared fixtures. The real Slurm test cluster is started once per session (tests/slurm/cluster.sh)."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clusterddp.job.parse import POLL_MAX

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
CLUSTER_SH = Path(__file__).resolve().parent / "slurm" / "cluster.sh"
CLUSTER_DIR = os.environ.get("CLUSTERDDP_CLUSTER_DIR", "/tmp/clusterddp-cluster")


def cluster_impossible() -> str:
    """Why the test cluster cannot exist here ('' when it can)."""
    if platform.system() != "Linux":
        return "the Slurm test cluster needs Linux (network and UTS namespaces)"
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (network namespaces, munged, slurmd)"
    return ""


#: The Slurm releases the end-to-end tests run on by default (make test): the oldest still common (Debian 12's)
#: and the newest (Debian testing's). 24.11 (Debian 13's) stays runnable: --slurm-release 24.11, make test-release.
RELEASES = ("22.05", "26.05")
KNOWN_RELEASES = ("22.05", "24.11", "26.05")


def pytest_generate_tests(metafunc):
    """Every test that needs the cluster runs once per release (ids ...[slurm-22.05], ...[slurm-26.05]);
    ``@pytest.mark.slurm_releases("22.05")`` (on a test, a module or one parameter) narrows it, and
    ``--slurm-release`` / CLUSTERDDP_TEST_RELEASES choose."""
    if "slurm_release" in metafunc.fixturenames:
        metafunc.parametrize("slurm_release", list(selected_releases(metafunc.config)), indirect=True,
                             ids=lambda r: f"slurm-{r}", scope="session")


def pytest_collection_modifyitems(config, items):
    """Leave out the runs on releases a test's slurm_releases marker does not name (release-independent work
    runs once; the closest marker wins, so a parameter's overrides its function's and module's)."""
    keep, drop = [], []
    never = never_in_make_test((item.nodeid, item.get_closest_marker("slurm_releases")) for item in items)
    if never:  # (issue 79: every cluster test runs on at least one release make test runs)
        raise pytest.UsageError(f"{never[0]}: its slurm_releases names none of the releases make test runs "
                                f"({', '.join(RELEASES)}), so CI would never run it; add one of them")
    for item in items:
        release = getattr(item, "callspec", None) and item.callspec.params.get("slurm_release")
        marker = item.get_closest_marker("slurm_releases")
        (drop if release and marker and release not in marker.args else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def never_in_make_test(marked) -> list:
    """The test ids (of ``(id, slurm_releases marker or None)``) whose marker names no release of RELEASES."""
    return [nodeid for nodeid, marker in marked if marker is not None and not set(marker.args) & set(RELEASES)]


def selected_releases(config) -> tuple:
    given = config.getoption("--slurm-release") or os.environ.get("CLUSTERDDP_TEST_RELEASES", "")
    chosen = tuple(r for r in given.replace(",", " ").split() if r) or RELEASES
    unknown = [r for r in chosen if r not in KNOWN_RELEASES]
    if unknown:
        raise pytest.UsageError(f"--slurm-release {unknown[0]}: expected one of {', '.join(KNOWN_RELEASES)}")
    return chosen


@pytest.fixture(scope="session")
def slurm_release(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def slurm_cluster(slurm_release):
    """A running 2-node cluster of ``slurm_release``; yields the environment (SLURM_CONF, and for a release in a
    root of its own (24.11, 26.05) the release's clients first on PATH, also set for this process while it is up)."""
    why = cluster_impossible()
    if why:
        pytest.skip(why)
    base = os.path.realpath(sys.base_prefix)
    if slurm_release != "22.05" and (base == "/usr" or base.startswith("/usr/") and not base.startswith("/usr/local")):
        # A release's root keeps its own /usr (Debian 13's, testing's); a venv of the machine's /usr/bin/python3 has no
        # interpreter there ("bad interpreter"), so every job would fail for a reason that is not clusterddp's.
        pytest.skip(f"Slurm {slurm_release} runs in a Debian root that keeps its own /usr, and the tests' Python "
                    f"is based on the machine's {base}: run them with a Python outside /usr (pyenv, /usr/local, "
                    "/opt), or choose --slurm-release 22.05")
    release = {**os.environ, "CLUSTERDDP_SLURM_RELEASE": slurm_release, "CLUSTERDDP_PYTHON": sys.executable}
    root = os.environ.get("CLUSTERDDP_SLURM_ROOT", f"/var/lib/clusterddp/slurm-{slurm_release}")
    if not shutil.which("slurmctld") or not shutil.which("sshd", path="/usr/sbin") or (
            slurm_release != "22.05" and not os.path.exists(f"{root}/.clusterddp-slurm-root")):
        subprocess.run([str(CLUSTER_SH), "install"], check=True, env=release)
    keep = os.environ.get("CLUSTERDDP_KEEP_CLUSTER") == "1"
    subprocess.run([str(CLUSTER_SH), "down"], check=False, env=release, capture_output=True)
    saved_path, saved_poll = os.environ["PATH"], os.environ.get(POLL_MAX)
    try:
        subprocess.run([str(CLUSTER_SH), "up"], check=True, env=release)
        if slurm_release != "22.05":
            os.environ["PATH"] = f"{CLUSTER_DIR}/bin{os.pathsep}{saved_path}"
        # --wait looks at a job at least once a second (not up to every 5 s): the cluster tests mostly wait.
        os.environ.setdefault(POLL_MAX, "1")
        yield dict(os.environ, SLURM_CONF=f"{CLUSTER_DIR}/slurm.conf")
    finally:
        os.environ["PATH"] = saved_path
        if saved_poll is None:
            os.environ.pop(POLL_MAX, None)
        if not keep:
            subprocess.run([str(CLUSTER_SH), "down"], check=False, env=release)


@pytest.fixture(autouse=True)
def private_state(tmp_path_factory, monkeypatch):
    """Every test's clusterddp state (job records, local runs' ids, quarantine) in a directory of its own, never the
    user's ~/.local/state: tests neither read what a user (or another test) filed nor leave records there."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture
def warm_start(monkeypatch):
    """Issue 79: the local jobs this test starts fork their ranks from warm servers (CLUSTERDDP_WARM_START, the
    documented default for --warm-start), where the claim is not the ranks' cold start: each rank then costs a fork,
    not torch's imports again. The cold paths keep their own tests (tests/test_local.py, one per launcher).
    CLUSTERDDP_TEST_COLD=1 runs them cold (to compare)."""
    if os.environ.get("CLUSTERDDP_TEST_COLD") != "1":
        monkeypatch.setenv("CLUSTERDDP_WARM_START", "1")


@pytest.fixture
def slurm_env(slurm_cluster, monkeypatch, tmp_path):
    """SLURM_CONF set for this test, and a private clusterddp state directory."""
    monkeypatch.setenv("SLURM_CONF", slurm_cluster["SLURM_CONF"])
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return slurm_cluster


#: Where runs side by side (tests/run_both.py) share what one of them computed once (the reference run below).
CACHE = "CLUSTERDDP_TEST_CACHE"


def reference_run(tmp_path_factory, nodes: int = 2, per_node: int = 2) -> Path:
    """resumable.py on ``nodes`` x ``per_node`` ranks (emulated nodes), never interrupted (local backend; the same
    gloo arithmetic as the cluster's ranks on this machine): its final parameters (``ref.pt``) and beside them each
    rank's steps and losses (``ref.log.rankN``). Made once per ``make test`` and shape: the first run that needs it
    makes it under a lock in $CLUSTERDDP_TEST_CACHE, the others wait and read it (without that variable: once per
    session)."""
    import fcntl

    from .test_requeue import job_args, steps, total_steps

    shared = os.environ.get(CACHE)
    name = f"reference-{nodes}x{per_node}"
    root = Path(shared) if shared else tmp_path_factory.getbasetemp()
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other runs wait here while one makes it
        if not (d / "done").exists():
            shutil.copy(SCRIPTS / "resumable.py", d)
            proc = run_cli("submit", "--local", "--launcher", "srun", "--nodes", str(nodes), "--procs-per-node",
                           str(per_node), *job_args(d, "ref", 0), cwd=d)
            assert proc.returncode == 0, proc.stderr
            assert [s for _, s in steps(d / "ref.log")] == list(range(1, total_steps(nodes * per_node) + 1))
            (d / "done").touch()
    return d / "ref.pt"


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> Path:
    """The 4-rank reference run on 2 emulated nodes (reference_run)."""
    return reference_run(tmp_path_factory)


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """The real console entry point in a subprocess (as a user types it)."""
    return subprocess.run([sys.executable, "-m", "clusterddp", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _strict() -> bool:
    """Under CI=true (.ci/run) a test that skips is a failure, and so is a run that collected nothing: a green CI
    means they all ran."""
    return os.environ.get("CI", "").lower() == "true"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    # Issue 57: every skip, not only the cluster and multi-rank ones: one gated on root or a tool would otherwise go
    # silent on a CI machine that lacks it (CI runs as root with every tool `make install-test` installs).
    if _strict() and report.skipped and not hasattr(report, "wasxfail"):
        why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        why = why[len("Skipped: "):] if why.startswith("Skipped: ") else why
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every test must run: {why}"


# CPU seconds each test took (setup to teardown): this process's and its reaped descendants' (ranks under Slurm's
# slurmd are not ours: not counted). tests/run_both.py asks for them (CPU_REPORT) and lists the most in DURATIONS.md:
# the suite's 2 cores are saturated, so CPU, not wall time, says what a cut would gain.
CPU_REPORT = "CLUSTERDDP_TEST_CPU_REPORT"
_CPU: dict = {}


def _cpu_now() -> float:
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _cpu_now()
    yield
    _CPU[item.nodeid] = _cpu_now() - before


def pytest_sessionfinish(session, exitstatus):
    report = os.environ.get(CPU_REPORT)
    if report and _CPU:
        top = sorted(_CPU.items(), key=lambda kv: -kv[1])
        try:
            Path(report).write_text(f"{sum(_CPU.values()):.0f} CPU-s in {len(_CPU)} tests\n" + "".join(
                f"{cpu:8.1f}s  {nodeid}\n" for nodeid, cpu in top[:25]), encoding="utf-8")
        except OSError:
            pass
    if _strict() and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("\nCI=true: this run collected no test, which is a failure here", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/*.sh from the current code")
    parser.addoption("--slurm-release", default="", help="Slurm releases for the cluster tests, e.g. 26.05 or "
                     "22.05,24.11 (default: 22.05 and 26.05; also CLUSTERDDP_TEST_RELEASES)")


def _separate_stderr_on_old_click() -> None:
    """click < 8.2 mixes stderr into ``Result.output`` and has no ``Result.stderr`` unless CliRunner is told
    ``mix_stderr=False``; the tests read both, as click 8.2+ gives them (output: both streams; stderr: its own).
    The lowest click setup.cfg admits is tested (test_newcomer.py), so the runner is made to give both there too."""
    import inspect

    import click.testing

    if "mix_stderr" not in inspect.signature(click.testing.CliRunner.__init__).parameters:
        return
    invoke = click.testing.CliRunner.invoke

    class Both(click.testing.Result):
        @property
        def output(self) -> str:  # both streams, as click 8.2+ (not interleaved: stdout first)
            return (self.stdout_bytes + (self.stderr_bytes or b"")).decode(self.runner.charset, "replace")

    def both(self, *args, **kwargs):
        self.mix_stderr = False
        result = invoke(self, *args, **kwargs)
        result.__class__ = Both
        return result

    click.testing.CliRunner.invoke = both


_separate_stderr_on_old_click()


def cli_runner() -> Any:
    """Click's CliRunner with stdout and stderr apart (Click >= 8.2 always keeps them apart, and refuses the flag)."""
    from click.testing import CliRunner

    try:
        return CliRunner(mix_stderr=False)
    except TypeError:
        return CliRunner()
