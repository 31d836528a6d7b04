"""The CLI through Click's CliRunner: exit codes, stdout and stderr; and what it imports."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp.cli import cli

from .conftest import cli_runner

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "train.py").write_text("print('hi')\n")
    return cli_runner()


def test_dry_run_prints_the_script_and_writes_nothing(runner):
    r = runner.invoke(cli, ["submit", "--dry-run", "--nodes", "2", "--gpus", "8", "train.py", "--", "--epochs", "10"])
    assert r.exit_code == 0, r.stderr
    assert "#SBATCH --nodes=2" in r.stdout and "#SBATCH --gpus-per-node=8" in r.stdout
    assert "--nnodes=2 --nproc-per-node=8" in r.stdout and "train.py --epochs 10 &" in r.stdout
    assert "world size 16" in r.stderr and "nothing submitted" in r.stderr
    assert subprocess.run(["bash", "-n"], input=r.stdout, text=True).returncode == 0
    assert not Path("clusterddp-runs").exists()  # a dry run writes nothing


def test_gpus_per_node_alias_and_render_to_file(runner):
    r = runner.invoke(cli, ["render", "--gpus-per-node", "4", "-o", "job.sh", "train.py"])
    assert r.exit_code == 0, r.stderr
    assert "#SBATCH --gpus-per-node=4" in Path("job.sh").read_text()
    assert "wrote job.sh" in r.stderr and r.stdout == ""
    # sbatch cannot create the log directory itself: a script submitted by hand needs it to exist
    assert Path("clusterddp-runs").is_dir() and "created clusterddp-runs/" in r.stderr


@pytest.mark.parametrize("argv,code,message", [
    (["--nodes", "0", "train.py"], 2, "nodes must be at least 1, got 0"),
    (["--gpus", "-1", "train.py"], 2, "gpus_per_node must be at least 0, got -1"),
    (["--time", "2h", "train.py"], 2, "invalid time limit '2h': expected MM, MM:SS, HH:MM:SS"),
    (["missing.py"], 2, "training script 'missing.py' not found"),
    (["--launcher", "mpirun", "train.py"], 2, "unknown launcher 'mpirun'"),
    (["--env", "NOVALUE", "train.py"], 2, "--env 'NOVALUE' has no '='"),
    (["--env", "BAD-NAME=1", "train.py"], 2, "invalid environment variable name 'BAD-NAME'"),
    (["--gpus", "2", "--procs-per-node", "4", "train.py"], 2, "conflicting options"),
    (["--template", "nope", "train.py"], 2, "unknown template 'nope'"),
    (["--job-name", "a\nb", "train.py"], 2, "contains a newline"),
    (["--nodes", "two", "train.py"], 2, "'two' is not a valid integer"),
    (["train.py", "--epochs", "3"], 2, "put script arguments after --"),
    (["--array", "0-3x", "train.py"], 2, "invalid --array '0-3x'"),
    (["--after", "12ab", "train.py"], 2, "invalid --after '12ab'"),
    (["--apptainer", "a.sif", "--container-image", "b", "train.py"], 2, "choose one container runtime"),
])
def test_bad_input_one_clear_line(runner, argv, code, message):
    for command in ("render", "submit"):
        r = runner.invoke(cli, [command, *argv])
        assert r.exit_code == code, (command, r.stdout, r.stderr)
        assert message in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert r.exception is None or isinstance(r.exception, SystemExit), r.exception


def test_wait_with_array_is_refused(runner):
    r = runner.invoke(cli, ["submit", "--array", "0-3", "--wait", "train.py"])
    assert r.exit_code == 2 and "--wait follows one job" in r.stderr


def test_failing_sbatch_keeps_the_script(runner, tmp_path, monkeypatch):
    """A real Slurm cannot be made to fail this way on demand, so a fake sbatch stands in."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: "
                                 "Invalid partition name specified' >&2\nexit 1\n")
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    r = runner.invoke(cli, ["submit", "--no-check", "-p", "nosuch", "train.py"])
    assert r.exit_code == 1
    assert "Invalid partition name specified" in r.stderr and "sbatch --parsable" in r.stderr
    kept = list(Path("clusterddp-runs").glob("train-*.sbatch"))
    assert len(kept) == 1 and str(kept[0]) in r.stderr
    assert "#SBATCH --partition=nosuch" in kept[0].read_text()


@pytest.mark.parametrize("argv, command", [
    (["submit", "train.py"], "sinfo"), (["submit", "--no-check", "train.py"], "sbatch"), (["status", "123"], "squeue"),
    (["status", "123", "456"], "squeue"), (["cancel", "123"], "squeue"), (["logs", "123"], "squeue"),
    (["stacks", "123"], None), (["doctor"], "sinfo")])
def test_no_slurm_on_path_is_said_in_one_line(runner, monkeypatch, tmp_path, argv, command):
    """A laptop without Slurm: every command says so in one line with the ways forward, and never calls a job
    unknown when Slurm was not asked."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    r = runner.invoke(cli, argv)
    if command is None:  # stacks needs a record of the job first: a usage error that says what to pass instead
        assert r.exit_code == 2 and "pass the run directory instead" in r.stderr
        return
    assert r.exit_code == 1, r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("clusterddp: error")]
    assert len(lines) == 1, r.stderr  # (with --no-check a second line says where the written script is kept)
    assert f"Slurm is not installed here: `{command}` is not on PATH" in lines[0]
    assert "--local runs the job on this machine" in lines[0] and "SLURM_CONF=" in lines[0]
    assert "unknown" not in r.stderr and "Traceback" not in r.output


def test_help_teaches(runner):
    for command in ("submit", "render"):
        r = runner.invoke(cli, [command, "--help"])
        assert r.exit_code == 0
        for word in ("torchrun (default)", "srun", "spawn", "world size = --nodes x --gpus", "16 ranks",
                     "{master_addr}", "--gpus-per-node"):
            assert word in r.stdout, word


def test_unknown_job_id_is_clear(runner):
    r = runner.invoke(cli, ["status", "12x"])
    assert r.exit_code == 2 and "invalid job id '12x'" in r.stderr  # a usage error: it never reaches Slurm


def _imported_modules(code: str) -> set:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, cwd=ROOT, check=True).stdout
    return set(out.split())


def test_cli_never_imports_torch_or_submitit(tmp_path):
    mods = _imported_modules("import clusterddp.cli")
    assert "torch" not in mods and "submitit" not in mods and "click" in mods
    (tmp_path / "t.py").write_text("")
    code = (f"import os; os.chdir({str(tmp_path)!r})\nfrom clusterddp.cli import main\n"
            "try:\n    main(['submit', '--dry-run', '--nodes', '2', '--gpus', '8', 't.py'])\nexcept SystemExit: pass")
    mods = _imported_modules(code)
    assert "jinja2" in mods and "torch" not in mods and "submitit" not in mods


def test_python_dash_m_and_console_script(tmp_path):
    (tmp_path / "t.py").write_text("")
    r = subprocess.run([sys.executable, "-m", "clusterddp", "render", "t.py"], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout.startswith("#!/bin/bash\n")


def test_runtime_never_imports_the_login_side():
    mods = _imported_modules("import clusterddp.runtime")
    assert "click" not in mods and "jinja2" not in mods and "submitit" not in mods



def test_a_link_that_cannot_be_moved_from_the_next_log_path_cancels_the_job(runner, tmp_path, monkeypatch):
    """Issue 41 (the batch-log link): a link planted at the new job's log path that cannot be moved aside (here the
    output directory turns immutable once sbatch ran, as a place the user cannot change would be) is never left for
    Slurm to write through: the job is cancelled and the error names the path. A real Slurm cannot be made to race
    this way on demand, so stand-in sbatch and scancel record what they were asked."""
    if os.getuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr (an immutable directory)")
    fake, out = tmp_path / "bin", tmp_path / "clusterddp-runs"
    fake.mkdir()
    out.mkdir()
    (fake / "sbatch").write_text(f"#!/bin/sh\nchattr +i {out} || exit 9\necho 4242\n")
    (fake / "scancel").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/scancel.txt\n")
    for tool in ("sbatch", "scancel"):
        (fake / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    victim = tmp_path / "victim"
    (out / "train-4242.out").symlink_to(victim)
    try:
        r = runner.invoke(cli, ["submit", "--no-check", "train.py"])
    finally:
        subprocess.run(["chattr", "-i", str(out)], check=True)
    assert r.exit_code == 1, r.output
    assert f"job 4242 cancelled before it could write anything: {out}/train-4242.out or {out}/train-4242 is in" \
        in r.stderr, r.stderr
    assert "could not be moved aside" in r.stderr and "Traceback" not in r.output
    assert (tmp_path / "scancel.txt").read_text() == "4242\n" and not victim.exists()
