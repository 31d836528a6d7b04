"""Sweeps without a cluster (issue 27): grids and sweep files, trial identity, the array's batch script (bash
runs its case arm: every value byte for byte), runtime.report, the CLI's bad input (one line, exit 2, nothing
written), and a local sweep with a failing trial, --rerun failed and an identical resubmission."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from clusterddp import contract
from clusterddp.backends.slurm import script as render
from clusterddp.cli import cli
from clusterddp.errors import SpecError
from clusterddp.job.code import code_files, code_hash
from clusterddp.job.spec import JobSpec
from clusterddp.sweeps import grid as sweep
from clusterddp.sweeps.run import plan

from .conftest import SCRIPTS, run_cli

HOSTILE = ["it's", "$(touch /tmp/pwned)", "a b\tc", "line\nbreak", "*", "--lr", "{seed}", "é", "\\", ""]


def test_grids_are_a_cartesian_product_in_order():
    axes = sweep.parse_grids(["lr=0.1,0.01,0.001", "seed=0,1,2,3"])
    trials = sweep.trials(axes, {"code": "x"})
    assert len(trials) == 12 and [t.index for t in trials] == list(range(12))
    assert trials[0].params == (("lr", "0.1"), ("seed", "0")) and trials[5].params == (("lr", "0.01"), ("seed", "1"))
    assert len({t.key for t in trials}) == 12
    # the same point with other code is another trial; with the same code, the same one
    assert sweep.trials(axes, {"code": "y"})[0].key != trials[0].key
    assert sweep.trials(axes, {"code": "x"})[0].key == trials[0].key
    assert trials[5].env() == [("CLUSTERDDP_PARAM_LR", "0.01"), ("CLUSTERDDP_PARAM_SEED", "1")]
    assert trials[5].args(["--lr={lr}", "{seed}{seed}", "{other}", "{lr"]) == ["--lr=0.01", "11", "{other}", "{lr"]


def test_a_filled_value_is_never_read_again():
    t = sweep.Trial(0, (("a", "{b}"), ("b", "B")), "k")
    assert t.args(["{a}-{b}"]) == ["{b}-B"]


def test_the_array_is_compressed_and_throttled():
    trials = [sweep.Trial(i, (), str(i)) for i in (0, 1, 2, 3, 7, 9, 10)]
    assert sweep.job_array("s", trials, ()).indices(2) == "0-3,7,9-10%2"
    assert sweep.job_array("s", trials[:1], ()).indices(None) == "0"


def test_the_job_gets_its_array_as_data():
    """Issue 56: the job and its renderer take a sweep's trials as job/array's JobArray: each trial's variables,
    its filled-in arguments and its trial.json, built once by the sweep."""
    t = sweep.trials(sweep.parse_grids(["lr=0.1,0.01"]), {"code": "x"})[1]
    (task,) = sweep.job_array("s", [t], ["--lr={lr}", "{x}"]).trials
    assert (task.index, task.exports, task.args) == (1, (("CLUSTERDDP_PARAM_LR", "0.01"),), ("--lr=0.01", "{x}"))
    assert json.loads(task.record) == {"sweep": "s", "index": 1, "key": t.key, "params": {"lr": "0.01"}}
    assert task.env() == list(task.exports)


@pytest.mark.parametrize("grids, message", [
    (["lr="], "empty grid for 'lr'"),
    (["lr"], "expected NAME=V1,V2"),
    (["2lr=1,2"], "invalid parameter name '2lr'"),
    (["learning-rate=1"], "expected an identifier"),
    (["lr=0.1,0.1"], "duplicate value '0.1' for 'lr'"),
    (["lr=1", "lr=2"], "'lr' is given twice"),
    (["lr=1", "LR=2"], "would both be CLUSTERDDP_PARAM_LR"),
    (["master_port=1"], "one of spawn's placeholders"),
    ([], "at least one parameter"),
])
def test_bad_grids_are_named(grids, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace("[", r"\[")):
        sweep.trials(sweep.parse_grids(grids), {})


def test_a_sweep_file_has_lists_ranges_and_zips():
    data = {"grid": {"lr": [0.1, 0.01], "seed": {"start": 0, "stop": 3}, "tag": ["a b", True]},
            "zip": {"model": ["small", "large"], "batch": [64, 32]}}
    axes = sweep.parse_file(data, "sweep.toml")
    trials = sweep.trials(axes, {})
    assert len(trials) == 2 * 3 * 2 * 2
    assert dict(trials[0].params) == {"lr": "0.1", "seed": "0", "tag": "a b", "model": "small", "batch": "64"}
    assert dict(trials[1].params)["model"] == "large" and dict(trials[1].params)["batch"] == "32"
    assert dict(trials[2].params)["tag"] == "true"
    for bad, message in [({"zip": {"a": [1, 2], "b": [1]}}, "need one length"), ({"grids": {}}, "unknown table"),
                         ({"grid": {"a": {"stop": 2.5}}}, "whole numbers"), ({"grid": {"a": [[1]]}}, "not a string"),
                         ({"grid": {"a": [1, 1]}}, "duplicate value"),
                         # issue 41: sized before expansion (no MemoryError), and a grid that is not a table
                         ({"grid": {"a": {"stop": 2 ** 63 - 1}}}, r"has 9223372036854775807 values, more than "
                                                                  r"clusterddp's limit of 100000 trials"),
                         ({"grid": {"a": {"start": -2 ** 70, "stop": 2 ** 70}}}, "has too many values"),
                         ({"grid": 5}, r"\[grid\] is a table of NAME = \[values\]"),
                         ({"zip": [1, 2]}, r"\[zip\] is a table")]:
        with pytest.raises(SpecError, match=message):
            sweep.parse_file(bad, "f.toml")


def test_placeholders_must_be_parameters():
    axes = sweep.parse_grids(["lr=1,2"])
    sweep.check_placeholders(["--lr", "{lr}", '{"json": 1}'], axes, "torchrun")
    with pytest.raises(SpecError, match=r"placeholder \{seed\}, which no grid defines"):
        sweep.check_placeholders(["--seed={seed}"], axes, "torchrun")
    with pytest.raises(SpecError, match="no grid defines"):
        sweep.check_placeholders(["{master_addr}"], axes, "srun")
    sweep.check_placeholders(["{master_addr}"], axes, "spawn")


@pytest.mark.parametrize("launcher", ["torchrun", "srun", "spawn"])
def test_the_case_arm_gives_each_trial_its_values_byte_for_byte(tmp_path, launcher):
    """The array's script, rendered: bash -n passes, and bash running a trial's case arm gets every hostile value
    back unchanged, in the arguments and in CLUSTERDDP_PARAM_*."""
    axes = [sweep.Axis(("v",), tuple((h,) for h in HOSTILE if h)), sweep.Axis(("w",), (("x",), ("",)))]
    trials = tuple(sweep.trials(axes, {}))
    args = ("--v={v}", "{w}", "lit'{v}")
    tasks = sweep.job_array("s", trials, args)
    spec = JobSpec(script="train.py", args=args, launcher=launcher, nodes=2, sweep=tasks, array=tasks.indices(3))
    text = render.render(spec)
    assert "#SBATCH --array=0-17%3" in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    start = text.index('case "${SLURM_ARRAY_TASK_ID:-}" in')
    block = text[start:text.index("esac", start) + 4]
    probe = block + '\nprintf "%s\\0" "${CLUSTERDDP_ARGS[@]}" "$CLUSTERDDP_PARAM_V" "$CLUSTERDDP_PARAM_W" ' \
                    '"$CLUSTERDDP_TRIAL"; printf "%s" "$CLUSTERDDP_TRIAL_JSON" >&2\n'
    for t in trials:
        env = {"SLURM_ARRAY_TASK_ID": str(t.index), "PATH": os.environ["PATH"]}
        out = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, check=True)
        v, w = dict(t.params)["v"], dict(t.params)["w"]
        assert out.stdout.decode().split("\0")[:-1] == [f"--v={v}", w, f"lit'{v}", v, w, str(t.index)]
        assert json.loads(out.stderr) == t.record("s")
    assert not os.path.exists("/tmp/pwned")
    bad = subprocess.run(["bash", "-c", block], env={"SLURM_ARRAY_TASK_ID": "99"}, capture_output=True, text=True)
    assert bad.returncode == 1 and "not a trial of this sweep" in bad.stderr


def test_report_writes_on_rank_0_only(tmp_path, monkeypatch):
    from clusterddp.runtime import report

    monkeypatch.setenv(contract.RUN_DIR, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    assert report(step=1, loss=2.0) is False and not (tmp_path / contract.METRICS_FILE).exists()
    monkeypatch.setenv("RANK", "0")
    assert report(step=1, loss=2.0, acc=1) is True
    assert report(step=2, loss=float("nan")) is True
    lines = [json.loads(ln) for ln in (tmp_path / contract.METRICS_FILE).read_text().splitlines()]
    assert [ln["metrics"] for ln in lines] == [{"acc": 1.0, "loss": 2.0}, {"loss": "nan"}]
    import torch

    assert report(step=3, loss=torch.tensor(1.5)) is True
    assert json.loads((tmp_path / contract.METRICS_FILE).read_text().splitlines()[-1])["metrics"] == {"loss": 1.5}
    for bad in ({"loss": "x"}, {"loss": None}, {}):
        with pytest.raises(Exception, match="runtime.report"):
            report(step=3, **bad)
    monkeypatch.delenv(contract.RUN_DIR)
    assert report(step=1, loss=1.0) is False  # outside a job: nothing to record


def test_code_identity_follows_the_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / ".gitignore").write_text("data/\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"0" * 1000)
    spec = JobSpec(script="train.py")
    names = code_files(spec, tmp_path)
    assert names == [".gitignore", "train.py"]
    before = code_hash(tmp_path, names)
    (tmp_path / "data" / "big.bin").write_bytes(b"1" * 1000)  # ignored data: the same code
    assert code_hash(tmp_path, names) == before
    (tmp_path / "train.py").write_text("print(2)\n")
    assert code_hash(tmp_path, names) != before
    p = plan(spec, sweep.parse_grids(["lr=1,2"]), None, tmp_path)
    assert p.name == "train" and len(p.trials) == 2
    with open(tmp_path / "weights.bin", "wb") as fh:  # not ignored: code, and too much of it (sparse: no disk)
        fh.truncate(257 << 20)
    with pytest.raises(SpecError, match="more than 256 MiB of files that are not ignored"):
        plan(spec, sweep.parse_grids(["lr=1,2"]), None, tmp_path)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project directory (the state directory beside it: files written into the project are code)."""
    (tmp_path / "proj").mkdir()
    shutil.copy(SCRIPTS / "trial.py", tmp_path / "proj")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path / "proj")
    return tmp_path / "proj"


@pytest.mark.parametrize("extra, message", [
    (["--grid", "lr=", "trial.py"], "empty grid for 'lr'"),
    (["--grid", "lr=1", "trial.py", "--", "--seed", "{seed}"], "placeholder {seed}, which no grid defines"),
    (["--grid", "l-r=1", "trial.py"], "invalid parameter name 'l-r'"),
    (["--grid", "lr=1,1", "trial.py"], "duplicate value '1'"),
    (["--grid", "lr=1", "--name", "../x", "trial.py"], "invalid sweep name"),
    (["--grid", "lr=1", "--array", "0-3", "trial.py"], "--array and a sweep"),
    (["--grid", "lr=1", "--max-parallel", "0", "trial.py"], "--max-parallel must be at least 1"),
    (["--sweep-file", "nope.toml", "trial.py"], "cannot read nope.toml"),
    (["nosuch", "--rerun", "failed"], "no sweep named 'nosuch'"),
    (["--launcher", "spawn", "--grid", "a={world_size}", "trial.py", "--", "--x", "{a}"],
     "holds a spawn placeholder the spawn launcher would fill in again"),
    (["--launcher", "spawn", "--grid", "a={master", "--grid", "b=_port}", "trial.py", "--", "--x", "{a}{b}"],
     "becomes '{master_port}', which holds a spawn placeholder"),
])
def test_bad_input_is_one_line_and_submits_nothing(project, extra, message):
    result = CliRunner().invoke(cli, ["sweep", *extra])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.output
    assert not (project / "clusterddp-runs").exists()


def test_dry_run_prints_one_array(project):
    result = CliRunner().invoke(cli, ["sweep", "--dry-run", "--grid", "lr=0.1,0.2,0.3", "--grid", "seed=0,1",
                                      "--max-parallel", "2", "trial.py", "--", "--lr", "{lr}", "--seed", "{seed}"])
    assert result.exit_code == 0, result.output
    assert result.output.count("#SBATCH --array=0-5%2") == 1 and result.output.count("CLUSTERDDP_ARGS=(") == 6
    assert "6 trial(s) as one array" in result.output
    assert not (project / "clusterddp-runs").exists() and not (project.parent / "state").exists()


def test_sweep_help_teaches():
    result = CliRunner().invoke(cli, ["sweep", "--help"])
    assert result.exit_code == 0 and "ONE Slurm job array" in result.output and "sweep status" in result.output
    result = CliRunner().invoke(cli, ["sweep", "run", "--help"])
    assert "--max-parallel" in result.output and "--rerun" in result.output


@pytest.mark.ranks
def test_a_local_sweep_reruns_only_the_failed_trial(project):
    """--local: 4 trials one after another (2 ranks each), one fails by design; status; --rerun failed runs that
    one alone; the identical sweep again runs nothing; an edit of the script after submission is not run."""
    args = ["sweep", "--local", "--grid", "lr=0.1,0.5", "--grid", "seed=0,1", "--gpus", "0", "--procs-per-node", "2",
            "--launcher", "srun", "trial.py", "--", "--lr", "{lr}", "--seed", "{seed}", "--fail-when", "0.5,1"]
    first = run_cli(*args, cwd=project, env={**os.environ})
    assert first.returncode == 1, first.stderr
    assert first.stderr.count("COMPLETED in") == 3 and "trial 3 FAILED (exit 1)" in first.stderr
    status = run_cli("sweep", "status", "trial", "--local", "--json", cwd=project)
    rows = json.loads(status.stdout)
    assert [r["state"] for r in rows] == ["COMPLETED"] * 3 + ["FAILED"]
    csv_rows = run_cli("sweep", "status", "trial", "--local", "--csv", cwd=project).stdout.splitlines()
    assert csv_rows[0] == "trial,lr,seed,state,acc_last,acc_best,loss_last,loss_best,elapsed,job"
    assert csv_rows[4].startswith("3,0.5,1,FAILED,,,,,") and len(csv_rows) == 5
    assert rows[0]["params"] == {"lr": "0.1", "seed": "0"}
    assert rows[0]["last"]["loss"] == pytest.approx(0.1 + 0.5)  # step 2: lr * 1 + seed + mean rank (0.5)
    assert rows[0]["best"]["acc"] == rows[0]["last"]["acc"]
    seen = json.loads((Path(rows[1]["run_dir"]) / "seen.json").read_text())
    assert seen["argv"][:4] == ["--lr", "0.1", "--seed", "1"] and seen["params"]["CLUSTERDDP_PARAM_SEED"] == "1"
    assert seen["trial"] == "1" and seen["cwd"] == str(project)
    elsewhere = run_cli("sweep", "trial", "--rerun", "failed", "--local", cwd=project.parent)
    assert elsewhere.returncode == 2 and f"was submitted from {project}: rerun it from there" in elsewhere.stderr
    (project / "trial.py").write_text((project / "trial.py").read_text().replace('"original"', '"edited"'))
    again = run_cli("sweep", "trial", "--rerun", "failed", "--local", cwd=project)
    assert again.returncode == 1 and again.stderr.count("(1 of 1)") == 1 and "trial 3 (1 of 1)" in again.stderr
    rows2 = json.loads(run_cli("sweep", "status", "trial", "--local", "--json", cwd=project).stdout)
    assert json.loads((Path(rows2[3]["run_dir"]) / "seen.json").read_text())["version"] == "original"
    assert rows2[3]["run_dir"] != rows[3]["run_dir"] and rows2[:3] == rows[:3]
    (project / "trial.py").write_text((project / "trial.py").read_text().replace('"edited"', '"original"'))
    same = run_cli(*args, cwd=project)
    assert same.returncode == 0 and "nothing to submit: all 4 trial(s)" in same.stderr, same.stderr
    table = run_cli("sweep", "status", "trial", "--local", "--sort", "loss", cwd=project)
    assert table.returncode == 0, table.stderr
    head = table.stdout.splitlines()[1].split()
    assert head[:4] == ["trial", "lr", "seed", "state"] and "loss" in head
    assert [ln.split()[0] for ln in table.stdout.splitlines()[2:6]] == ["0", "2", "1", "3"]  # by loss, failed last
    # issue 42: the sweep's goodput, its trials' ledgers added up
    from clusterddp.observe import goodput

    ledgers = [goodput.ledger(Path(r["run_dir"])) for r in rows2]
    total = sum(g.total for g in ledgers)
    last = table.stdout.rstrip().splitlines()[-1]
    assert last.startswith("sweep goodput ") and last.endswith("(its trials together)"), table.stdout
    # its trials record no step (trial.py calls neither runtime.step() nor should_stop()): not measured, never 0%
    # (issue 56), with what the trials were allocated
    amount = f"{total / 60:.3g} node-minutes" if total >= 60 else f"{total:.3g} node-seconds"
    assert last.startswith("sweep goodput not measured: no step was recorded") and f"; {amount} allocated" in last, \
        (last, total)


@pytest.mark.ranks
def test_local_trials_run_side_by_side_with_max_parallel(project):
    """--local --max-parallel 2: two trials at once, each in a process of its own with its output in a log."""
    from clusterddp.healing import attempts

    proc = run_cli("sweep", "--local", "--max-parallel", "2", "--grid", "lr=0.1,0.2", "--grid", "seed=0", "--gpus", "0",
                   "--procs-per-node", "2", "--launcher", "srun", "trial.py", "--", "--lr", "{lr}", "--seed",
                   "{seed}", "--sleep", "1", cwd=project)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(run_cli("sweep", "status", "trial", "--local", "--json", cwd=project).stdout)
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"]
    (a,), (b,) = (attempts.read(Path(r["run_dir"])) for r in rows)
    assert a.start < b.end and b.start < a.end  # they overlapped
    for i in (0, 1):  # each trial's output in its own log, and a share of the CPUs (2 cores / 4 ranks: 1 each)
        log = (project / "clusterddp-runs" / "sweep-trial" / "logs" / f"trial-{i}.log").read_text()
        assert "running 2 ranks on CPU with gloo, 1 thread(s) per rank" in log, log


def test_status_without_the_queue_is_an_error_not_missing_trials(project, tmp_path):
    """When squeue cannot answer, queued trials must not look as if they never ran (a resubmission would run them
    twice): one line, exit 1."""
    from clusterddp.sweeps.run import SweepRecord

    rec = SweepRecord("q", "here", str(project / "clusterddp-runs" / "sweep-q"), {"script": "trial.py"},
                      trials={"k": {"index": 0, "params": [["lr", "1"]], "code": "c"}},
                      submissions=[{"job_id": "77", "time": 0, "tasks": {"0": "k"}}], submitted_from=str(project))
    rec.save()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\n"
                                    "exit 1\n")
    (bin_dir / "squeue").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = run_cli("sweep", "status", "q", cwd=project, env=env)
    assert proc.returncode == 1 and "MISSING" not in proc.stdout, proc.stdout
    assert "Unable to contact slurm controller" in proc.stderr and "Traceback" not in proc.stderr


def test_status_asks_slurm_once_for_every_trial_of_every_array(project, tmp_path):
    """README "its status is one squeue": two arrays, four trials (one queued, the others never ran) -> one squeue
    call and no other Slurm command (a recording stand-in squeue; the others fail if asked)."""
    from clusterddp.sweeps.run import SweepRecord

    sweep_dir = project / "clusterddp-runs" / "sweep-q"
    trials = {f"k{i}": {"index": i, "params": [["lr", str(i)]], "code": "c"} for i in range(4)}
    rec = SweepRecord("q", "here", str(sweep_dir), {"script": "trial.py"}, trials=trials,
                      submissions=[{"job_id": "77", "time": 0, "tasks": {"0": "k0", "1": "k1"}},
                                   {"job_id": "78", "time": 1, "tasks": {"2": "k2", "3": "k3"}}],
                      submitted_from=str(project))
    rec.save()
    log = tmp_path / "slurm.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "sacct", "scontrol", "scancel", "sinfo", "srun"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexit 1\n')
        (bin_dir / name).chmod(0o755)
    (bin_dir / "squeue").write_text(f'#!/bin/sh\necho "squeue $*" >> "{log}"\necho "78_3|PENDING|0:00"\n'
                                    'echo "99_0|RUNNING|1:00"\n')  # (another job of this user's: not the sweep's)
    (bin_dir / "squeue").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    rows = json.loads(run_cli("sweep", "status", "q", "--json", cwd=project, env=env).stdout)
    assert [(r["trial"], r["job"], r["state"]) for r in rows] == [
        (0, "77_0", "MISSING"), (1, "77_1", "MISSING"), (2, "78_2", "MISSING"), (3, "78_3", "PENDING")]
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["squeue"]


def test_what_counts_as_code_outputs_inside_and_links_out_of_the_project(tmp_path, monkeypatch):
    """Issue 41: an absolute --output-dir inside the project is outputs, not code (a repeat is not a new code
    version); a link out of the project is its target's content (an edit there is a new version, and the snapshot
    holds the file, not a link that would break); a link inside it stays a link."""
    from clusterddp.sweeps.run import snapshot

    project, outside = tmp_path / "proj", tmp_path / "shared"
    project.mkdir()
    outside.mkdir()
    monkeypatch.chdir(project)
    (project / "train.py").write_text("import helper\n")
    (outside / "helper.py").write_text("X = 1\n")
    (project / "helper.py").symlink_to(outside / "helper.py")           # absolute, out of the project
    (project / "up.py").symlink_to("../shared/helper.py")               # relative, out of the project
    (project / "same.py").symlink_to("train.py")                        # inside
    (project / "runs" / "sweep-x").mkdir(parents=True)
    (project / "runs" / "sweep-x" / "result.txt").write_text("1\n")
    spec = JobSpec(script="train.py", output_dir=str(project / "runs"))
    names = code_files(spec, project)
    assert names == ["helper.py", "same.py", "train.py", "up.py"], names
    before = code_hash(project, names)
    (project / "runs" / "sweep-x" / "result.txt").write_text("2\n")
    assert code_hash(project, code_files(spec, project)) == before    # outputs: the same code
    (outside / "helper.py").write_text("X = 2\n")
    assert code_hash(project, names) != before                         # the linked file changed: new code
    snap = snapshot(project, names, tmp_path / "out" / "sweep-x" / "code" / code_hash(project, names))
    assert not (snap / "helper.py").is_symlink() and (snap / "helper.py").read_text() == "X = 2\n"
    assert not (snap / "up.py").is_symlink() and (snap / "same.py").is_symlink()
    assert snapshot(project, names, snap) == snap                      # it holds the code its name says


def test_an_array_script_slurm_would_refuse_is_one_line_before_anything_is_made(project):
    """Issue 41: about 20,000 trials make an array script over Slurm's default 4 MiB max_script_size; sbatch would
    refuse it. Said with the number of trials that fit (a submission checks it before its snapshot or record)."""
    values = ",".join(str(i) for i in range(20000))
    for extra in (["--dry-run"],):
        result = CliRunner().invoke(cli, ["sweep", *extra, "--grid", f"lr={values}", "trial.py", "--", "--lr", "{lr}"])
        assert result.exit_code == 2, result.output
        lines = [ln for ln in result.output.splitlines() if ln]
        assert len(lines) == 1 and "Slurm refuses batch scripts over 4 MiB (max_script_size" in lines[0], lines
        assert "for 20000 trials" in lines[0] and "sweeps of at most about" in lines[0]
        assert not (project / "clusterddp-runs").exists() and not (project.parent / "state").exists()


def test_a_sweep_record_is_data_and_has_one_writer_at_a_time(project, tmp_path):
    """Issue 41: a damaged record (or another user's, or a link) is one line naming the file, for a rerun and for
    status; two submissions of one sweep take turns on its record (an flock beside it), so the second sees the
    first one's trials instead of submitting them again."""
    import subprocess
    import sys

    from clusterddp.sweeps.run import SweepRecord

    path = SweepRecord.path(".local", "broken")
    path.parent.mkdir(parents=True)
    for damage in ("{not json", '{"name": "broken", "cluster": ".local", "sweep_dir": "/x", "spec": {}, '
                                '"trials": {"k": {"index": "0", "params": []}}}', '["a list"]'):
        path.write_text(damage)
        for args in (["sweep", "broken", "--rerun", "failed", "--local"], ["sweep", "status", "broken", "--local"]):
            proc = run_cli(*args, cwd=project)
            lines = [ln for ln in proc.stderr.splitlines() if ln]
            assert proc.returncode == 1 and len(lines) == 1, proc.stderr
            assert f"the sweep record {path} is damaged (" in lines[0] and "Traceback" not in proc.stderr
    code = ("import time\nfrom clusterddp.sweeps.run import RecordLock\nwith RecordLock('.local', 'busy'):\n"
            "    print('held', flush=True)\n    time.sleep(2)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env={**os.environ})
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    from clusterddp.sweeps.run import RecordLock

    started = time.monotonic()
    with RecordLock(".local", "busy"):
        waited = time.monotonic() - started
    holder.wait(timeout=30)
    assert waited > 1.0, waited  # it waited for the other writer


def test_sweep_status_reads_odd_trial_files_and_metrics_as_data(project):
    """Issue 41: a trial.json whose key is a list, metrics.jsonl lines that are lists, an int of 400 digits, a
    step that is a boolean: status shows what is usable and never a traceback."""
    from clusterddp.sweeps.run import SweepRecord

    sweep_dir = project / "clusterddp-runs" / "sweep-odd"
    rec = SweepRecord("odd", ".local", str(sweep_dir), {"script": "trial.py"},
                      trials={"k0": {"index": 0, "params": [["lr", "0.1"]], "code": "c"}},
                      submissions=[{"job_id": "local", "time": 0, "tasks": {}}], submitted_from=str(project))
    rec.save()
    (sweep_dir / "odd-1").mkdir(parents=True)
    (sweep_dir / "odd-1" / "trial.json").write_text(json.dumps({"sweep": "odd", "key": ["k0"]}))
    good = sweep_dir / "odd-2"
    good.mkdir()
    (good / "trial.json").write_text(json.dumps({"sweep": "odd", "key": "k0"}))
    (good / "metrics.jsonl").write_text("\n".join([
        json.dumps([1, 2]), json.dumps({"metrics": [1]}), '{"step": 1, "metrics": {"loss": 1' + "0" * 400 + "}}",
        json.dumps({"step": True, "metrics": {"loss": 0.5, "acc": "x"}}), "not json"]) + "\n")
    proc = run_cli("sweep", "status", "odd", "--local", "--json", cwd=project)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["run_dir"] == str(good) and row["last"] == {"loss": 0.5}, row


def test_sweep_status_shows_the_table_and_one_line_per_unreadable_file(project):
    """Issue 58: a metrics.jsonl line nested 50,000 deep (what a trial's own script, or a hostile login node, can
    write), a 400-digit number, a trial.json whose key has the wrong type: the table, and one line per bad file."""
    from clusterddp.sweeps.run import SweepRecord

    sweep_dir = project / "clusterddp-runs" / "sweep-deep"
    rec = SweepRecord("deep", ".local", str(sweep_dir), {"script": "trial.py"},
                      trials={"k0": {"index": 0, "params": [["lr", "0.1"]], "code": "c"},
                              "k1": {"index": 1, "params": [["lr", "0.2"]], "code": "c"}},
                      submissions=[{"job_id": "local", "time": 0, "tasks": {}}], submitted_from=str(project))
    rec.save()
    for name, key, lines in (("deep-0", "k0", ["[" * 50_000 + "]" * 50_000, '{"step": 1, "metrics": {"loss": 0.25}}',
                                               '{"step": 2, "metrics": {"loss": 1' + "0" * 400 + "}}"]),
                             ("deep-1", "k1", ['{"step": 1, "metrics": {"loss": 0.5}}'])):
        (sweep_dir / name).mkdir(parents=True)
        (sweep_dir / name / "trial.json").write_text(json.dumps({"sweep": "deep", "key": key}))
        (sweep_dir / name / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (sweep_dir / "deep-9").mkdir()
    (sweep_dir / "deep-9" / "trial.json").write_text(json.dumps({"sweep": "deep", "key": {"k0": 1}}))
    proc = run_cli("sweep", "status", "deep", "--local", cwd=project)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].split()[:4] == ["trial", "lr", "state", "loss"], proc.stdout
    assert lines[2].split()[:5] == ["0", "0.1", "FAILED", "0.25", "0.25"], proc.stdout
    assert lines[3].split()[:5] == ["1", "0.2", "FAILED", "0.5", "0.5"], proc.stdout
    unread = [ln.strip() for ln in lines if ln.strip().startswith("not read:")]
    assert unread == ["not read: deep-9/trial.json: not a trial record (JSON with a string key); that run directory "
                      "is left out",
                      "not read: deep-0/metrics.jsonl: 2 line(s) not read (line 1: nested deeper than 64)"], lines
    as_json = run_cli("sweep", "status", "deep", "--local", "--json", cwd=project)
    assert as_json.returncode == 0 and len(json.loads(as_json.stdout)) == 2
    assert as_json.stderr.count("clusterddp: not read: ") == 2, as_json.stderr
