"""Issues 40 and 57: under CI=true (what .ci/run sets) a test that skips fails (a cluster or multi-rank test, and one
gated on root or a tool alike), and so does a run that collected nothing; elsewhere (a laptop without root) they skip
as before."""
from __future__ import annotations

import os
import subprocess
import sys

from .conftest import ROOT

SAMPLE = """import pytest

@pytest.mark.slurm
def test_cluster():
    pytest.skip("no cluster here")

@pytest.mark.ranks
def test_ranks():
    pytest.skip("no torch here")

def test_plain():
    pytest.skip("a test gated on a tool")
"""


def _pytest(path, ci, *extra):
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q",
                           str(path), *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_skips_fail_under_ci_and_only_there(tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    strict = _pytest(tmp_path, True)
    assert strict.returncode == 1 and "3 failed" in strict.stdout and "skipped" not in strict.stdout.splitlines()[-1], \
        strict.stdout + strict.stderr
    assert "skipped under CI=true, where every test must run: no cluster here" in strict.stdout
    assert "skipped under CI=true, where every test must run: a test gated on a tool" in strict.stdout
    relaxed = _pytest(tmp_path, False)
    assert relaxed.returncode == 0 and "3 skipped" in relaxed.stdout, relaxed.stdout + relaxed.stderr
    empty = _pytest(tmp_path, True, "-k", "nothing_matches")
    assert empty.returncode == 1 and "collected no test" in empty.stderr, empty.stdout + empty.stderr
    assert _pytest(tmp_path, False, "-k", "nothing_matches").returncode == 5


def test_a_cluster_test_no_release_of_make_test_runs_is_refused_at_collection():
    """Issue 79: a slurm_releases marker that names only releases make test does not run (24.11 alone) would leave
    the test out of CI for good; collection refuses it, naming the test. Every marker of the suite passes."""
    import pytest

    from .conftest import RELEASES, never_in_make_test

    only = pytest.mark.slurm_releases("24.11").mark
    both = pytest.mark.slurm_releases("24.11", RELEASES[-1]).mark
    assert never_in_make_test([("t::a", only), ("t::b", both), ("t::c", None)]) == ["t::a"]
