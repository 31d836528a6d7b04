"""Hostile input through the real sbatch of the test cluster: what Slurm records and runs is exactly what
clusterddp reports, and no value ever runs as code (no marker file appears)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterddp.job.sbatch_options import REQUIRED_VALUE, known_in, no_value_in

from .cases import CORPUS, has_control
from .conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.slurm
RECORDER = Path(__file__).parent / "scripts" / "record_argv.py"


@pytest.fixture
def work(slurm_env, tmp_path):
    for script in SCRIPTS.glob("*.py"):
        shutil.copy(script, tmp_path)
    (tmp_path / ".git").mkdir()  # a project root: no profile from above the test directory
    return tmp_path, dict(slurm_env)


def scontrol(job_id: str, env: dict) -> dict:
    """`scontrol show job` (multi-line form: Command, WorkDir, StdOut and Comment each own their line)."""
    text = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, env=env).stdout
    fields = {}
    for line in text.split("\n"):
        line = line.strip()
        for key in ("Command", "WorkDir", "StdOut", "Comment"):
            if line.startswith(key + "="):
                fields[key] = line[len(key) + 1:]
                if key in ("StdOut", "Command"):  # the same file: Slurm keeps a './' from the directive
                    fields[key] = os.path.normpath(fields[key])
        if line.startswith("JobId="):
            fields["JobName"] = line.split(" JobName=", 1)[1]
    return fields


def wait_all(job_ids, env, timeout=240):
    deadline = time.monotonic() + timeout
    pending = set(job_ids)
    while pending and time.monotonic() < deadline:
        out = subprocess.run(["squeue", "--noheader", "--format=%i"], capture_output=True, text=True, env=env).stdout
        pending &= set(out.split())
        time.sleep(0.5)
    assert not pending, f"jobs still running: {pending}"


def submitted(proc) -> dict:
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.split()[0]
    lines = dict(line.strip().split(None, 1) for line in proc.stderr.splitlines()[1:] if line.startswith("  "))
    return {"job_id": job_id, "script": lines["script"], "log": lines["log"]}


@pytest.mark.parametrize("source", ["cli", "env", "profile"])
def test_output_dir_like_an_option_never_becomes_one(work, source):
    d, env = work
    value = "--wrap=touch PWNED;echo "
    args = ["submit", "--wait", "--launcher", "srun", "--nodes", "2", "--gpus", "1", "plumbing.py"]
    if source == "cli":
        args[1:1] = ["--output-dir", value]
    elif source == "env":
        env["CLUSTERDDP_OUTPUT_DIR"] = value
    else:
        (d / "clusterddp.toml").write_text(f'[defaults]\noutput_dir = "{value}"\n')
    proc = run_cli(*args, cwd=d, env=env)
    job = submitted(proc)
    fields = scontrol(job["job_id"], env)
    assert fields["Command"] == job["script"] and Path(job["script"]).is_file()
    assert fields["StdOut"] == job["log"] and Path(job["log"]).is_file()
    assert fields["WorkDir"] == str(d)
    assert Path(job["script"]).parent == d / value
    assert not list(d.rglob("PWNED")), "a value ran as sbatch --wrap"
    assert "ended COMPLETED" in proc.stderr


def test_doctor_output_dir_like_an_option(work):
    d, env = work
    proc = run_cli("doctor", "--nodes", "2", "--output-dir", "--wrap=touch PWNED;echo ", cwd=d, env=env)
    assert proc.returncode == 0, proc.stderr
    assert not list(d.rglob("PWNED")) and (d / "--wrap=touch PWNED;echo ").is_dir()


def test_line_breaks_cannot_rename_or_redirect_the_job(work):
    d, env = work
    values = ["x\n#PBS -N other -o /tmp/other-%j.out #", "y\r\n#BSUB -J other2", "z\n#SBATCH --job-name=other3"]
    env_args = [a for i, v in enumerate(values) for a in ("-e", f"NOTE{i}={v}")]
    env_args += ["-e", f"RECORD_FILE={d / 'record.json'}", "-e", "RECORD_ENV_NAMES=" + json.dumps(
        ["NOTE0", "NOTE1", "NOTE2", "SLURM_JOB_NAME"])]
    job_args = ["--launcher", "srun", "--job-name", "mine", *env_args, "record_argv.py", "--", *values]
    proc = run_cli("submit", "--wait", *job_args, cwd=d, env=env)
    job = submitted(proc)
    # the script sbatch got is byte for byte the one a dry run prints
    dry = run_cli("submit", "--dry-run", *job_args, cwd=d, env=env)
    assert Path(job["script"]).read_bytes() == dry.stdout.encode()
    fields = scontrol(job["job_id"], env)
    assert fields["JobName"] == "mine" and fields["StdOut"] == job["log"]
    got = json.loads((d / "record.json").read_text())
    assert got["argv"] == values and got["env"] == {"NOTE0": values[0], "NOTE1": values[1], "NOTE2": values[2],
                                                    "SLURM_JOB_NAME": "mine"}
    assert not list(Path("/tmp").glob("other-*.out"))


def test_every_hostile_value_reaches_slurm_and_the_rank_exactly(work):
    """The corpus in the job name, a comment, an environment value and an argument, one job per value; a value
    a field cannot hold is refused by that field before anything is written (test_security.py checks how)."""
    d, env = work
    jobs = {}
    for i, value in enumerate(CORPUS):
        if "\0" in value:
            continue
        name_ok = not has_control(value) and value.strip() and len(value.encode()) <= 1024
        record = d / f"record-{i}.json"
        args = ["submit", "--launcher", "srun", "--job-name", value if name_ok else f"v{i}",
                "--sbatch-arg=--comment=" + (value if name_ok else f"v{i}"), "-e", f"V={value}",
                "-e", f"RECORD_FILE={record}", "-e", 'RECORD_ENV_NAMES=["V", "SLURM_JOB_NAME"]',
                "record_argv.py", "--", value]
        proc = run_cli(*args, cwd=d, env=env)
        jobs[i] = (submitted(proc), name_ok, record)
    wait_all([j["job_id"] for j, _, _ in jobs.values()], env)
    for i, (job, name_ok, record) in jobs.items():
        value = CORPUS[i]
        fields = scontrol(job["job_id"], env)
        got = json.loads(record.read_text(encoding="utf-8"))
        assert got["argv"] == [value] and got["env"]["V"] == value, i
        if name_ok:
            assert got["env"]["SLURM_JOB_NAME"] == value, (i, got["env"]["SLURM_JOB_NAME"])
            # scontrol ends the Comment line with a space of its own.
            assert fields["Comment"].rstrip(" ") == value.rstrip(" "), (i, fields["Comment"])
        assert fields["StdOut"] == job["log"] and fields["Command"] == job["script"]
    assert not list(d.rglob("pwned")) and not list(d.rglob("PWNED"))


def test_option_table_matches_the_installed_sbatch(slurm_env, slurm_release):
    """sbatch_options.py was read off Slurm 22.05, 24.11 and 26.05: each release's sbatch lists the names the table
    gives it (from getopt's 'ambiguous; possibilities' answers) and the same argument kinds."""
    def ask(arg: str) -> str:
        proc = subprocess.run(["sbatch", "--test-only", arg], capture_output=True, text=True, env=slurm_env,
                              stdin=subprocess.DEVNULL)
        return proc.stderr.splitlines()[0] if proc.stderr else ""

    found = set()
    for letter in "abcdefghijklmnopqrstuvwxyz":
        answer = ask("--" + letter)
        if "possibilities:" in answer:
            found |= {w.strip("'")[2:] for w in answer.split("possibilities:")[1].split()}
        elif "requires an argument" in answer or "allow an argument" in answer:
            found.add(answer.split("'--")[1].split("'")[0])
    assert found == known_in(slurm_release)
    for name in sorted(found):
        if name in REQUIRED_VALUE:
            assert "requires an argument" in ask("--" + name), name
        if name in no_value_in(slurm_release):
            assert "allow an argument" in ask(f"--{name}=x"), name


@pytest.mark.parametrize("check", [True, False])
def test_a_reused_job_id_never_mixes_with_an_earlier_jobs_files(work, check):
    """A reset id counter (or a second cluster sharing the directory) hands out an id whose log and run
    directory already exist: they are kept under another name and the new job gets fresh ones. With the
    pre-flight checks the job is submitted held until then; with --no-check the files move right after sbatch.
    Issue 41: a link planted at the batch log's path (dangling: slurmstepd would create its target as the user)
    is moved aside the same way; nothing is written through it."""
    d, env = work
    flags = [] if check else ["--no-check"]
    first = submitted(run_cli("submit", *flags, "--wait", "--launcher", "srun", "plumbing.py", cwd=d, env=env))
    # The test cluster hands out ids in order, and sbatch --test-only takes one too.
    nxt = str(int(first["job_id"]) + (2 if check else 1))
    old_log = d / "clusterddp-runs" / f"plumbing-{nxt}.out"
    old_run = d / "clusterddp-runs" / f"plumbing-{nxt}"
    victim = d / "victim.txt"
    old_log.symlink_to(victim)
    old_run.mkdir()
    (old_run / "rank-0.out").write_text("an earlier job's rank log\n")
    proc = run_cli("submit", *flags, "--wait", "--launcher", "srun", "plumbing.py", cwd=d, env=env)
    job = submitted(proc)
    assert job["job_id"] == nxt, "the test expects consecutive ids"
    assert f"kept as {old_log}.1" in proc.stderr and f"kept as {old_run}.1" in proc.stderr
    assert os.readlink(f"{old_log}.1") == str(victim) and not os.path.lexists(victim)
    assert Path(f"{old_run}.1/rank-0.out").read_text() == "an earlier job's rank log\n"
    assert not old_log.is_symlink() and "MASTER_ADDR" in old_log.read_text()
    assert "ended COMPLETED" in proc.stderr


def test_a_job_held_on_purpose_stays_held(work):
    d, env = work
    job = submitted(run_cli("submit", "--sbatch-arg=--hold", "plumbing.py", cwd=d, env=env))
    fields = subprocess.run(["scontrol", "show", "job", job["job_id"]], capture_output=True, text=True,
                            env=env).stdout
    assert "JobState=PENDING" in fields and "Reason=JobHeldUser" in fields
    subprocess.run(["scancel", job["job_id"]], env=env, check=True)


@pytest.mark.slurm_releases("26.05")  # the supervisor's check is Python, the same on every release: one is enough
def test_a_run_directory_below_one_others_can_change_is_refused_on_the_cluster(work):
    """Issue 41 (whole paths), on the real cluster: a run directory below a directory others may write (0777, not
    sticky: they could rename what it holds, and swap the run directory after the check) ends the job with one line
    before anything is written there; below a sticky one (1777, like /tmp) the same job runs. Both jobs at once."""
    d, env = work
    for name, mode in (("open", 0o777), ("sticky", 0o1777)):
        (d / name).mkdir()
        os.chmod(d / name, mode)
    argv = [sys.executable, "-m", "clusterddp", "submit", "--wait", "--launcher", "srun"]
    jobs = {name: subprocess.Popen([*argv, "--output-dir", str(d / name / "runs"), "plumbing.py"], cwd=d, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name in ("open", "sticky")}
    done = {name: proc.communicate(timeout=240) for name, proc in jobs.items()}
    assert jobs["sticky"].returncode == 0, done["sticky"]
    assert jobs["open"].returncode == 1, done["open"]
    job_id = done["open"][0].split()[0]
    log = (d / "open" / "runs" / f"plumbing-{job_id}.out").read_text()
    assert (f"the run directory {d}/open/runs/plumbing-{job_id} is not this job's own ({d}/open above it is "
            "writable by group and others, who could swap it)") in log, log
    assert not (d / "open" / "runs" / f"plumbing-{job_id}").exists()
