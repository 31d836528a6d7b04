"""Issue 26: `clusterddp drill` on this machine, with small scripts written for it (tests/scripts/drill_case.py): a
correct one passes every scenario; each mistake is named with its step and component; bad input is one line.
Real local runs (the local backend, gloo on CPU, real SIGKILLs of emulated nodes)."""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp.drill import Verdict, report
from clusterddp.job.spec import JobSpec

from .conftest import SCRIPTS

ranks = pytest.mark.ranks  # these start a real job's ranks (not in make test-fast)
ROOT = Path(__file__).resolve().parent.parent


def drill(tmp: Path, *args: str, shape=("--nodes", "1"), options=()) -> subprocess.CompletedProcess:
    """The drill of drill_case.py under the srun launcher: one process per rank and no torchrun agent, whose own
    torch import would double each run's start-up (the drill runs the job 5-7 times); the example's test below
    drills the default, torchrun."""
    shutil.copy(SCRIPTS / "drill_case.py", tmp)
    return subprocess.run([sys.executable, "-m", "clusterddp", "drill", "--launcher", "srun", *shape, *options,
                           "--json", "drill_case.py", "--", *args],
                          cwd=tmp, capture_output=True, text=True, timeout=900)


def verdicts(proc: subprocess.CompletedProcess) -> dict:
    return {v["scenario"]: v for v in json.loads(proc.stdout)["scenarios"]}


@ranks
def test_a_correct_script_passes_every_scenario_on_two_emulated_nodes(tmp_path):
    """(drill_case.py --live: its LR scheduler, whose rate decays each step so that a scheduler restored a step off
    changes every later loss, given to save() and load_latest() as the object; issue 55: peer heal keeps it. A
    GradScaler skips step 8 (an overflow), after the kills: the script counts iterations, one more than optimizer
    steps from there, which its save at step 9 tells peer heal, which stays on.)"""
    proc = drill(tmp_path, "--live", "--scaler-skip", "8", shape=("--nodes", "2", "--procs-per-node", "1"),
                 options=("--every-node",))
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs_named(proc.stdout, tmp_path)
    found = verdicts(proc)
    assert set(found) == {"stop", "kill-node1", "kill-node0"}, found  # (--every-node: each node in turn)
    assert found["stop"]["identical"] and found["stop"]["why"].endswith(": bit-identical"), found
    # The stop rode on node 0's kill, later in the same job (one job's runs for both): node 0's job's runs a to c
    assert re.match(r"stopped at step \d+ \(the time-limit signal\) in the same job, after the kill's resume",
                    found["stop"]["why"]), found["stop"]
    dirs = {p.parent.name for p in tmp_path.glob("clusterddp-drill/*/*/*.log")}
    assert dirs == {"reference", "kill-node0-then-stop", "kill-node1"}, dirs
    # issue 55: where a kill scenario resumed, and what it redid: either node lost, from the survivors' memory, the
    # scheduler with it (as a value, extra= turns peer heal off: tests/test_peer_heal.py; the checkpoint's line there)
    for name in ("kill-node1", "kill-node0"):
        assert found[name]["identical"] and re.search(
            r"a step after the first checkpoint, retried on a spare: bit-identical \(resumed from the survivors' "
            r"memory \(peer heal\) at step \d+, 0 step\(s\) redone\)$", found[name]["why"]), found[name]
    assert json.loads(proc.stdout)["steps"] == 12  # 2 epochs x 48 samples / (2 ranks x batch 4)
    logs = "".join(p.read_text() for p in tmp_path.glob("clusterddp-drill/*/*/*.log"))
    assert "peer heal is off" not in logs and "kept no state" not in logs, logs[-3000:]


@ranks
@pytest.mark.parametrize("mistake, scenario, expected", [
    ("scheduler", "stop", r"everything the checkpoint holds was restored, yet the run differs at step (\d+) \(resumed "
                          r"from step (\d+)\): state outside the checkpoint \(an LR scheduler"),
    ("random", "kill", r"differs from the reference at step 1, before the interruption: the script is not "
                       r"deterministic \(Python's random"),
    ("noload", "stop", r"did not resume: started again at step 0 \(the script never calls load_latest\)"),
    ("loader", "stop", r"differs after the resume \(step (\d+)\): the checkpoint holds the loader but load_latest did "
                       r"not restore it"),
    # issue 41: every run's exit code counts (a resumed run that crashes after its last checkpoint was a PASS)
    ("crash-resumed", "stop", r"and run again: the run that finishes the job ended with exit 1 \(see \S+b\.log\)"),
])
def test_each_mistake_is_named(tmp_path, mistake, scenario, expected):
    """Each mistake in the one scenario kind it is asserted on (``--only``: 3 runs of the script, not 5)."""
    proc = drill(tmp_path, "--mistake", mistake, options=("--only", scenario))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    found = verdicts(proc)
    assert set(found) == {scenario} and json.loads(proc.stdout)["only"] == [scenario], found
    stop = found[scenario]
    m = re.search(expected, stop["why"])
    assert not stop["identical"] and m, stop
    if mistake == "scheduler":  # the first difference comes after the resume, where the scheduler started over
        assert int(m.group(1)) > int(m.group(2)) == 12, stop


@ranks
def test_a_stop_that_fails_in_the_kill_s_job_is_run_alone_and_named_alone(tmp_path):
    """The stop rides on node 0's kill; where that job differs from the reference, each scenario runs alone, so the
    verdicts name the one that fails and pass the other. Here the scheduler is stepped after should_stop() (a
    practitioner's case): the stop's save holds it a step behind the periodic saves, which come after the update.
    Peer heal's copy, taken at should_stop(), would be as wrong: the first save finds its step's should_stop() and
    save() saw other states, so peer heal goes off and the kill resumes, right, from the checkpoint; the stop's
    verdict names the ordering, not "state outside the checkpoint" (the scheduler is in it)."""
    proc = drill(tmp_path, "--mistake", "schedafter", shape=("--nodes", "2", "--procs-per-node", "1"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    found = verdicts(proc)
    assert not found["stop"]["identical"], found
    assert ("sched changed between step 3's should_stop() and its save() (a sched.step(), scaler.update() or a "
            "per_rank= value updated between them); a save at should_stop() (the stop's) then holds another state") \
        in found["stop"]["why"], found
    assert found["kill-node0"]["identical"] and "from its checkpoint" in found["kill-node0"]["why"], found
    logs = "".join(p.read_text() for p in tmp_path.glob("clusterddp-drill/*/kill-node0/*.log"))
    assert "peer heal is off for this run: sched changed between step 3's should_stop() and its save()" in logs
    assert "differs from the reference; now each alone, to name the cause" in proc.stderr, proc.stderr
    dirs = {p.parent.name for p in tmp_path.glob("clusterddp-drill/*/*/*.log")}
    assert dirs == {"reference", "kill-node0-then-stop", "stop", "kill-node0"}, dirs


@ranks
@pytest.mark.parametrize("mistake, expected", [
    ("nocheckpoint", "clusterddp: error: the script saved no checkpoint through clusterddp.runtime.Checkpointer"),
    ("fails", "clusterddp: error: the script fails on its own in the reference run (exit 1), before any "
              "interruption: the drill needs a script that completes; its output: "),
])
def test_a_script_the_drill_cannot_use_is_one_line(tmp_path, mistake, expected):
    proc = drill(tmp_path, "--mistake", mistake)
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-1].startswith(expected), proc.stderr
    assert "Traceback" not in proc.stderr


@ranks
def test_too_few_steps_and_an_absolute_checkpoint_directory_are_one_line(tmp_path):
    short = drill(tmp_path, "--epochs", "0")
    assert short.returncode == 1 and "the script ran 0 step(s) (should_stop() calls)" in short.stderr.splitlines()[-1]
    late = drill(tmp_path, "--epochs", "1", "--ckpt-every", "12")  # 12 steps on one rank, the first save at 12
    assert late.returncode == 1 and late.stderr.splitlines()[-1].endswith(
        "saved its first checkpoint at step 12: the drill stops a run 2 steps after its first checkpoint, before its "
        "end; give it more steps (a short epoch) or checkpoint earlier (this script's --ckpt-every, e.g. after -- add "
        "--ckpt-every 3)"), late.stderr
    outside = drill(tmp_path, "--ckpt-dir", str(tmp_path / "abs"))
    assert outside.returncode == 1, outside.stderr
    refusal = outside.stderr.splitlines()[-1]
    assert "writes its checkpoints outside the directory it runs in" in refusal
    # Issue 41: the advice is the run directory, never a fixed one that every trial of a sweep would share
    assert "keep them under $CLUSTERDDP_RUN_DIR" in refusal and "give a relative checkpoint directory" not in refusal


def _run(code, *attempts):
    """A Run of rank 0 from (loaded step or None, first step, last step, value offset) per process: its values are
    the step number plus the offset (an offset other than 0: a run that differs)."""
    from clusterddp.drill.verdicts import Run

    events = []
    for loaded, first, last, off, stop in attempts:
        events.append({"e": "load", "step": loaded, "n": 0})
        for n, step in enumerate(range(first, last + 1)):
            events += [{"e": "value", "v": [float(step + off).hex()], "n": n}, {"e": "step", "n": n + 1}]
        if stop:
            events.append({"e": "stop", "n": last - first + 1})
    return Run(code, {0: events}, Path("x.log"))


@pytest.mark.parametrize("given, named", [(12, False), (11, True)])
def test_a_stop_saved_before_the_step_s_work_is_named_as_such(given, named):
    """A practitioner's case: should_stop() at the top of the loop, its batch already drawn. The stop's save (step
    11 at the 12th call) holds a loader position a batch ahead; the resumed run skips that batch. The verdict said
    "state outside the checkpoint"; it now names the question asked too early."""
    from clusterddp.drill.verdicts import compare

    ref = _run(0, (None, 1, 20, 0, False))
    stopped = _run(0, (None, 1, 12, 0, True))
    stopped.events[0].append({"e": "save", "step": given, "path": "/nonexistent", "n": 12})
    resumed = _run(0, (12, 13, 20, 1, False))  # (values differ from step 13 on)
    verdict = compare("stop", "stopped at step 12", ref, [stopped, resumed], 12)
    assert not verdict.identical and verdict.step == 13
    assert ("its save at the stop was given step 11 at should_stop() call 12: should_stop() was asked before the "
            "step's work" in verdict.why) == named, verdict.why


@pytest.mark.parametrize("change, first", [(None, None), ("second value", 7), ("last step cut", None)])
def test_every_value_a_step_reports_is_compared_in_order_with_the_reference_s(change, first):
    """A practitioner's case: a script that reports two values at a step (an accuracy, then a loss) failed every
    drill as "not deterministic": each value was compared with the reference's last of that step. Each process's
    values at a step are compared in order (a process killed mid-step reported the first of them)."""
    from clusterddp.drill.verdicts import Run, compare

    def run(*processes):
        events = []
        for loaded, first_step, last, off in processes:
            events.append({"e": "load", "step": loaded, "n": 0})
            for n, step in enumerate(range(first_step, last + 1)):
                events += [{"e": "value", "v": [float(step).hex()], "n": n},
                           {"e": "value", "v": [float(step * 10 + (off if step >= 7 else 0)).hex()], "n": n},
                           {"e": "step", "n": n + 1}]
        return Run(0, {0: events}, Path("x.log"))

    ref = run((None, 1, 10, 0))
    killed = run((None, 1, 6, 0))
    if change == "last step cut":  # (killed after step 7's first report: a prefix of the step's values)
        killed.events[0].append({"e": "value", "v": [float(7).hex()], "n": 6})
    resumed = run((6, 7, 10, 1 if change == "second value" else 0))
    verdict = compare("kill", "killed", ref, [killed, resumed], 6)
    assert verdict.identical == (first is None) and verdict.step == first, verdict


@pytest.mark.parametrize("case, ok", [
    ("right", True),
    ("the stopped run failed", False),   # its save at the stop crashed: the resume from the checkpoint before hides it
    ("the retry started over", False),   # a retry from step 0 of a deterministic script matches: no resume proven
    ("differs", False),
])
def test_one_job_for_the_stop_and_the_kill_passes_both_only_when_all_of_it_is_right(case, ok, monkeypatch):
    """The drill's stop rides on node 0's kill: both PASS from that one job only where the retry resumed, every run
    after the kill ended 0 and every value is the reference's; else each runs alone, and where each passes alone the
    job that met both is named a FAIL of its own (never a PASS by omission)."""
    from clusterddp.drill import Drill
    from clusterddp.drill.verdicts import Verdict as V

    ref = _run(0, (None, 1, 8, 0, False))
    retry = (None, 1, 0, 0, False) if case == "the retry started over" else (3, 4, 5, 0, True)
    runs = [_run(1 if case == "the stopped run failed" else 0, (None, 1, 4, 0, False), retry),
            _run(0, (5, 6, 8, 1 if case == "differs" else 0, False))]
    if case == "the retry started over":
        runs[0] = _run(0, (None, 1, 4, 0, False), (None, 1, 5, 0, True))
    drill = Drill(JobSpec("train.py", nodes=2), Path("."), 60, note=lambda *_: None)
    alone = []
    monkeypatch.setattr(drill, "_stop", lambda *a: alone.append("stop") or V("stop", True, "alone: bit-identical"))
    healed = _run(0, (None, 1, 4, 0, False), (3, 4, 8, 0, False))  # (the kill alone: resumed at 3, right)
    monkeypatch.setattr(drill, "_kill_runs", lambda node: alone.append("kill") or (node, [healed]))
    got = {v.scenario: v for v in drill._paired(ref, 8, 0, runs)}
    assert (alone == []) == ok, (case, alone)
    if ok:
        assert set(got) == {"stop", "kill-node0"} and got["stop"].why.startswith("stopped at step 5 ")
    else:  # (both alone pass here: the job that met both is the FAIL)
        assert set(got) == {"stop", "kill-node0", "kill-node0-then-stop"}, got
        assert not got["kill-node0-then-stop"].identical, got
        assert got["kill-node0-then-stop"].why.endswith("(each alone is bit-identical: the two in one job are not)")


def test_a_partial_drill_says_what_it_did_not_prove():
    spec = JobSpec(script="train.py", nodes=1)
    good = [Verdict("stop", True, "stopped at step 6 (the time-limit signal) and run again: bit-identical")]
    assert report(spec, 12, good, ("stop",)).splitlines()[-1] == (
        "clusterddp drill: every scenario run (stop only) bit-identical; drill without --only to prove the rest")
    assert report(spec, 12, good).splitlines()[-1].endswith("every scenario bit-identical: the script resumes exactly")
    killed = good + [Verdict("kill-node0", True, "... bit-identical (resumed from its checkpoint at step 4, ...)")]
    said = report(spec, 12, killed).splitlines()  # (a practitioner: a green 1-node drill never ran peer heal)
    assert said[-2] == ("clusterddp drill: one node: the kill resumed from a checkpoint; a job of 2 or more nodes that "
                        "loses one resumes from the survivors' memory (peer heal), which --nodes 2 drills"), said
    assert "one node" not in report(JobSpec(script="train.py", nodes=2), 12, killed)
    bad = [good[0]._replace(identical=False, why="...")]
    assert report(spec, 12, bad, ("stop",)).splitlines()[-1].startswith("clusterddp drill: fix the first difference")


def test_only_takes_the_scenario_kinds_and_names_them_when_wrong(tmp_path):
    from click.testing import CliRunner

    from clusterddp.cli import cli

    result = CliRunner().invoke(cli, ["drill", "--only", "preempt", "train.py"])
    assert result.exit_code == 2, result.output
    assert "'preempt' is not one of 'stop', 'kill'" in result.output, result.output


def logs_named(out: str, work: Path) -> str:
    """The end of each run log a failing drill names (\"see PATH\"), its runner's lines (not the ranks'): in a CI
    report, where the files are gone with the machine."""
    found = []
    for name in dict.fromkeys(re.findall(r"see (\S+?\.log)\)", out)):
        path = Path(name) if Path(name).is_absolute() else work / name
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if not ln.startswith("[rank ")] \
            if path.is_file() else ["(gone)"]
        found.append(f"\n--- {name}, its last lines but the ranks':\n" + "\n".join(lines[-60:]))
    return "".join(found)


def the_example_passes_the_drill_as_the_readme_says(work: Path, clusterddp: list, env: dict) -> None:
    """The README's drill line for the example, as written (``work`` holds examples/train_ddp.py; ``clusterddp``: the
    command, a fresh venv's in test_newcomer.py): its checkpoints where the README's contract puts them,
    under $CLUSTERDDP_RUN_DIR (issue 41: each scenario keeps one run directory across its runs, as a requeued or
    retried job does); the drill's default shape, 2 emulated nodes x 2 ranks (issue 56: a node can be lost), and
    checkpoints mid-epoch. At 4 ranks the example's running loss, saved as rank 0's extra=, made every resumed rank
    report rank 0's (a 2-rank drill with checkpoints at epoch ends never saw it); saved per_rank=, each rank
    resumes with its own (this test fails with the example's extra= version)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line = re.search(r"clusterddp drill examples/train_ddp\.py[^)\n]*", readme).group(0)
    proc = subprocess.run([*clusterddp, *shlex.split(line)[1:]], cwd=work, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, line + "\n" + proc.stdout + proc.stderr + logs_named(proc.stdout, work)
    assert "train_ddp.py, 2 node(s) x 2 rank(s)" in proc.stderr + proc.stdout
    assert "PASS  kill-node0" in proc.stdout and "kill-node1" not in proc.stdout, proc.stdout  # (rank 0's node)
    # (its running loss in one per_rank= dict kept in place: peer heal keeps it, and the drill's kill, at a step's
    # should_stop(), redoes nothing; made anew at each save, it resumed from its checkpoint, a step redone)
    assert re.search(r"PASS  kill-node0: .*\(resumed from the survivors' memory \(peer heal\) at step \d+, 0 step\(s\) "
                     r"redone\)\n", proc.stdout), proc.stdout
    assert proc.stdout.splitlines()[-1] == "clusterddp drill: every scenario bit-identical: the script resumes exactly"


def test_the_part_of_the_last_checkpoint_that_differs_is_named(tmp_path):
    """README: the drill names which part of the last checkpoint differs (model, optimizer, loader position, an
    ``extra=`` entry), and a random generator only where asked (it explains an earlier difference)."""
    import random

    import torch

    from clusterddp.drill.check import component

    def payload(**change) -> dict:
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        random.seed(1)
        out = {"step": 12, "model": model.state_dict(), "optimizer": opt.state_dict(),
               "loader": {"epoch": 1, "batches_done": 3}, "world_size": 1, "extra": {"best": torch.tensor(0.5)},
               "per_rank": [{"running": 1.5}],
               "rng": [{"python": list(random.getstate()[1]), "torch": torch.get_rng_state()}]}
        for key, value in change.items():
            out[key] = value(out[key])
        return out

    def path(name: str, **change) -> str:
        p = tmp_path / f"{name}.pt"
        torch.save(payload(**change), p)
        return str(p)

    same = path("same")
    assert component(same, path("again")) is None
    weights = {k: v.clone() for k, v in payload()["model"].items()}
    weights["bias"][0] += 1e-7
    assert component(same, path("model", model=lambda _: weights)) == "model"
    momentum = payload()["optimizer"]
    momentum["state"][0]["momentum_buffer"] = momentum["state"][0]["momentum_buffer"] * 2
    assert component(same, path("opt", optimizer=lambda _: momentum)) == "optimizer"
    assert component(same, path("loader", loader=lambda d: {**d, "batches_done": 4})) == "loader position"
    assert component(same, path("extra", extra=lambda _: {"best": torch.tensor(0.25)})) == "extra entry 'best'"
    # a scheduler whose rate has not changed yet, one step behind: only an int differs (a practitioner's case)
    sched = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.zeros(1)], lr=0.1), step_size=50)
    before = sched.state_dict()
    sched.step()
    plain = path("sched", extra=lambda e: {**e, "sched": before})
    assert component(plain, path("sched1", extra=lambda e: {**e, "sched": sched.state_dict()})) == "extra entry 'sched'"
    assert component(same, path("mine", per_rank=lambda _: [{"running": 1.25}])) == "per-rank entries"
    unseeded = path("rng", rng=lambda r: [{**r[0], "torch": torch.Generator().manual_seed(7).get_state()}])
    assert component(same, unseeded) is None  # a generator alone is not a difference of the run
    assert component(same, unseeded, generators=True) == "torch's CPU generator"


@ranks
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the process tree from /proc (Linux)")
def test_ctrl_c_on_the_drill_ends_every_process_it_started(tmp_path):
    """Issue 41: Ctrl-C on `clusterddp drill` left its run going, orphaned (the ranks live in sessions of their
    own). A torch-free script that never ends: the reference run's ranks are up, Ctrl-C, nothing of it is left."""
    import signal
    import subprocess
    import sys
    import time

    from .procs import descendants

    (tmp_path / "forever.py").write_text(
        "import os, pathlib, sys, time\n"
        "pathlib.Path(sys.argv[1], 'up-' + os.environ['RANK']).touch()\n"
        "time.sleep(600)\n")
    drill = subprocess.Popen([sys.executable, "-m", "clusterddp", "drill", "--nodes", "1", "--procs-per-node", "2",
                              "forever.py", "--", str(tmp_path)], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("up-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(list(tmp_path.glob("up-*"))) == 2, "the reference run's ranks never started"
        started = descendants(drill.pid)
        assert len(started) >= 3, started  # the local runner and its two ranks
    finally:
        drill.send_signal(signal.SIGINT)  # (also when an assert above failed: nothing of it outlives the test)
    _, err = drill.communicate(timeout=60)
    assert drill.returncode == 130, err
    left = [pid for pid in started if Path(f"/proc/{pid}").exists()
            and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    assert left == [], left


def test_the_drill_s_help_says_its_own_defaults_and_no_slurm_only_option():
    """(The practitioner review: --help said --nodes [default: 1] beside "by default 2 emulated nodes x 2 ranks",
    and listed --partition, --array, --container-image, which a local drill never uses.) They are still accepted."""
    from click.testing import CliRunner

    from clusterddp.cli import cli

    shown = CliRunner().invoke(cli, ["drill", "--help"], terminal_width=200).output
    nodes = next(line for line in shown.splitlines() if "-N, --nodes" in line)
    assert "[default: 2]" in nodes and "[default: 1]" not in nodes, nodes
    assert "[default: 2 where --nodes is left out" in " ".join(shown.split())
    for flag in ("--partition", "--array", "--container-image", "--sbatch-arg", "--expedite", "--after"):
        assert flag not in shown, flag
    refused = CliRunner().invoke(cli, ["drill", "--partition", "gpu", "--run-timeout", "0", "x.py"])
    assert "no such option" not in refused.output.lower(), refused.output


@ranks
def test_the_skeleton_passes_the_drill_line_its_docstring_gives(tmp_path):
    """(The practitioner review: the skeleton suggested `--time 1:00:00`, which requeues at the limit, yet it kept
    no checkpoint, so each requeue trained from scratch.) It resumes now; the drill line its docstring gives, run as
    written at the drill's default shape (2 emulated nodes x 2 ranks), passes, node 0's loss by peer heal."""
    made = subprocess.run([sys.executable, "-m", "clusterddp", "new", "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    line = next(x for x in (tmp_path / "train.py").read_text().splitlines() if "clusterddp drill" in x)
    argv = shlex.split(line.split("#")[0])
    assert argv[:2] == ["clusterddp", "drill"], line
    proc = subprocess.run([sys.executable, "-m", "clusterddp", *argv[1:]], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs_named(proc.stdout, tmp_path)
    assert "2 node(s) x 2 rank(s)" in proc.stdout and "every scenario bit-identical" in proc.stdout, proc.stdout
    healed = r"PASS  kill-node0: .* \(resumed from the survivors' memory \(peer heal\)"
    assert re.search(healed, proc.stdout), proc.stdout
