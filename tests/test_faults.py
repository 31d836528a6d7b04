"""Issue 25, points 1 and 5: a node fault told from a program fault, and the node at fault quarantined. On the real
test cluster: every rank process on node2 SIGKILLed mid-run (a lost node, as far as the job can tell) against a
Python exception in one rank; 4 ranks on 2 nodes, srun and torchrun."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterddp.healing import attempts

from .conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.slurm


@pytest.fixture
def work(slurm_env, tmp_path):
    for script in ("resumable.py", "allreduce.py"):
        shutil.copy(SCRIPTS / script, tmp_path)
    return tmp_path


def _rank_pids(node: str, script: str) -> list:
    """The training processes on ``node`` (its network namespace): the script's own, not torchrun's agent."""
    pids = subprocess.run(["ip", "netns", "pids", f"cddp-{node}"], capture_output=True, text=True).stdout.split()
    found = []
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        if any(w.endswith(script) for w in words) and "clusterddp.runtime.agent" not in words and not any(
                "torchrun" in w or w.endswith("/bash") or w == "bash" for w in words[:2]):  # (an agent, warm or not)
            found.append(int(pid))
    return found


@pytest.mark.slurm_releases("22.05")
@pytest.mark.parametrize("launcher", ["torchrun"])
def test_a_wedged_node_is_an_infrastructure_fault_and_quarantined(work, launcher):
    """Issue 53: node evidence is what the program cannot print. node2's ranks frozen (a wedged node: they cannot
    answer), node1's answer the hang watchdog's roll call: node2's fault, quarantined (the job has no retry here:
    --wait judges it from the files). Torchrun only (issue 57): the same wedge under srun, on both releases, is
    test_self_healing.test_without_a_spare_the_job_requeues_itself_without_the_node_at_fault."""
    log = work / "run.log"
    job = subprocess.Popen(
        [sys.executable, "-m", "clusterddp", "submit", "--launcher", launcher, "--nodes", "2", "--gpus", "2",
         "--time", "10", "--retries", "0", "--hang-timeout", "0:20", "--wait", "resumable.py", "--", "--ckpt-dir",
         str(work / "ck"), "--out", str(work / "o.pt"),
         "--steps-log", str(log), "--step-sleep", "0.3"], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    deadline = time.monotonic() + 120
    while (not log.exists() or len(log.read_text().splitlines()) < 4) and time.monotonic() < deadline:
        time.sleep(0.2)
    victims = _rank_pids("node2", "resumable.py")
    assert len(victims) == 2, victims  # ranks 2 and 3
    for pid in victims:
        os.kill(pid, signal.SIGSTOP)
    out, err = job.communicate(timeout=180)
    assert job.returncode != 0, err
    job_id = out.strip().splitlines()[0]
    assert "clusterddp: fault: infrastructure on node2: the hang watchdog ended the job" in err, err
    assert "on node2 did not answer the roll call" in err and "(a node or the network, not the program)" in err, err
    assert "clusterddp: quarantined node2: later submissions leave it out for 24 h" in err, err
    assert "clusterddp: first failure" not in err  # the others' tracebacks are reactions, not the cause
    status = run_cli("status", job_id, cwd=work)
    assert "fault: infrastructure on node2: " in status.stdout, status.stdout + status.stderr
    listed = run_cli("nodes", cwd=work)
    assert listed.returncode == 0 and listed.stdout.splitlines()[1].startswith("node2 "), listed.stdout
    assert f"  {job_id}  " in listed.stdout.splitlines()[1], listed.stdout
    dry = run_cli("submit", "--dry-run", "--nodes", "1", "resumable.py", cwd=work)
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --exclude=node2" in dry.stdout.splitlines(), dry.stdout
    assert "leaving out node(s) quarantined after a fault: node2 (job " in dry.stderr, dry.stderr
    anyway = run_cli("submit", "--dry-run", "--no-quarantine", "--nodes", "1", "resumable.py", cwd=work)
    assert "--exclude" not in anyway.stdout
    forgot = run_cli("nodes", "--forget", "node2", cwd=work)
    assert forgot.returncode == 0 and "node2 is no longer quarantined" in forgot.stderr
    assert "--exclude" not in run_cli("submit", "--dry-run", "--nodes", "1", "resumable.py", cwd=work).stdout


@pytest.mark.parametrize("launcher", ["srun", pytest.param("torchrun", marks=pytest.mark.slurm_releases("22.05"))])
def test_a_python_exception_is_a_program_fault_and_quarantines_nothing(work, launcher):
    """One rank raises: the job ends (the others are not left waiting in their collective until the time limit:
    the process's bound is 4 of the job's 10 minutes), FAILED, with the traceback as the first failure."""
    proc = run_cli("submit", "--launcher", launcher, "--nodes", "2", "--gpus", "2", "--time", "10", "--wait",
                   "allreduce.py", "--", "--fail-rank", "3", cwd=work, timeout=240)
    assert proc.returncode != 0
    assert "ended FAILED" in proc.stderr and "first failure" in proc.stderr, proc.stderr
    assert "deliberate failure on rank 3" in proc.stderr  # the traceback, as before
    fault = [line for line in proc.stderr.splitlines() if line.startswith("clusterddp: fault: ")]
    assert len(fault) == 1 and fault[0].startswith("clusterddp: fault: program: "), proc.stderr
    assert "deliberate failure on rank 3 (the program); evidence: " in fault[0], fault  # (issue 57: always cited)
    assert re.search(r'; evidence: (rank-3|node-1)\.out: "\[rank3\]: RuntimeError: deliberate failure on rank 3"$',
                     fault[0]), fault
    assert "quarantined" not in proc.stderr
    assert run_cli("nodes", cwd=work).stdout.startswith("no node is quarantined on cluster 'here'")
    job_id = proc.stdout.split()[0]
    (only,) = attempts.read(work / "clusterddp-runs" / f"allreduce-{job_id}")  # one attempt: never retried
    assert (only.fault, only.next) == ("program", "end") and "deliberate failure on rank 3" in only.why, only


@pytest.mark.slurm_releases("22.05")
def test_a_job_that_cannot_fit_beside_the_quarantine_is_refused(work):
    """Never exclude so many nodes that the job cannot run: one line, nothing submitted."""
    from clusterddp.healing import quarantine

    quarantine.add("here", ["node2", "node3"], "rank 2 killed", "41")
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True).stdout
    proc = run_cli("submit", "--nodes", "2", "--gpus", "1", "allreduce.py", cwd=work)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # as every request the cluster cannot hold
    assert proc.stdout == "" and proc.stderr.splitlines()[-1] == (
        "clusterddp: error: partition debug has 3 node(s) and 2 of them are left out (node2,node3: --exclude or "
        "quarantined after a fault), so 1 remain; you asked for 2: use fewer --nodes, or the left-out nodes anyway "
        "(clusterddp nodes --forget NODE, or submit --no-quarantine)"), proc.stderr
    assert subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout == before
    quarantine.forget("here", "node2")
    quarantine.forget("here", "node3")
    spares = run_cli("submit", "--nodes", "2", "--spare-nodes", "2", "--gpus", "1", "allreduce.py", cwd=work)
    assert spares.returncode == 2 and spares.stderr.splitlines()[-1] == (
        "clusterddp: error: partition debug has 3 node(s); you asked for 2 and 2 spare(s), 4 in all: use at most "
        "--spare-nodes 1 with --nodes 2"), spares.stderr
    assert subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout == before


@pytest.mark.slurm_releases("26.05")
def test_an_abort_is_the_program_s_and_after_the_work_it_blames_no_node(work):
    """Issue 39. During the work, one rank's abort() with nothing said (SIGABRT: the process ended itself) is the
    program's: not retried though a spare is there, no node blamed. After the work (its runtime.shutdown() done),
    on 2 nodes with none to spare: the job reaches its final state by itself, one attempt, nothing excluded or
    quarantined, and status says which rank aborted, where and when."""
    shutil.copy(SCRIPTS / "after_work.py", work)
    during = run_cli("submit", "--launcher", "srun", "--nodes", "2", "--spare-nodes", "1", "--gpus", "2", "--time",
                     "5", "--wait", "after_work.py", "--", "--when", "during", cwd=work, timeout=240)
    assert during.returncode != 0, during.stderr
    (only,) = attempts.read(work / "clusterddp-runs" / f"after_work-{during.stdout.split()[0]}")
    assert (only.fault, only.fault_nodes, only.next) == ("program", (), "end"), only
    assert "rank(s) 3 on node2: aborted" in only.why and "SIGABRT" in only.why, only
    after = run_cli("submit", "--launcher", "srun", "--nodes", "2", "--gpus", "2", "--time", "5", "--wait",
                    "after_work.py", "--", "--when", "after", cwd=work, timeout=240)
    job_id = after.stdout.split()[0]
    assert after.returncode != 0 and f"job {job_id} ended FAILED" in after.stderr, after.stderr
    (only,) = attempts.read(work / "clusterddp-runs" / f"after_work-{job_id}")
    assert (only.fault, only.fault_nodes, only.next, only.nodes) == ("after-work", (), "end", ("node1", "node2"))
    assert re.match(r"rank 3 on node2 aborted after its work ended \(its shutdown\(\) was done at \d\d:\d\d:\d\d\): "
                    r"the job's results are intact$", only.why), only.why
    status = run_cli("status", job_id, cwd=work)
    assert "fault: after-work: rank 3 on node2 aborted after its work ended" in status.stdout, status.stdout
    assert "clusterddp: quarantined" not in after.stderr + during.stderr
    assert run_cli("nodes", cwd=work).stdout.startswith("no node is quarantined")


@pytest.mark.slurm_releases("26.05")
def test_a_rank_over_the_job_s_memory_is_out_of_memory_the_program_s_and_blames_no_node(work):
    """Issue 39. The 26.05 test cluster limits memory as a site does (tests/slurm/cluster.sh: each step's use
    polled, a step over its limit killed by Slurm). One rank taking more than --mem allows: named out of memory with
    Slurm's numbers and line, the program's, not retried though a spare is there, no node blamed."""
    shutil.copy(SCRIPTS / "memory_hog.py", work)
    proc = run_cli("submit", "--launcher", "srun", "--nodes", "2", "--spare-nodes", "1", "--gpus", "2", "--time", "5",
                   "--mem", "300M", "--wait", "memory_hog.py", cwd=work, timeout=240)
    job_id = proc.stdout.split()[0]
    assert proc.returncode != 0 and f"job {job_id} ended FAILED" in proc.stderr, proc.stderr
    (only,) = attempts.read(work / "clusterddp-runs" / f"memory_hog-{job_id}")
    assert (only.fault, only.fault_nodes, only.next, only.nodes) == ("program", (), "end", ("node1", "node2")), only
    used = re.match(r"out of memory on node2: Slurm killed the step there when it used (\d+) MiB, over the job's "
                    r"limit of 300 MiB per node: the program, not the node", only.why)
    assert used and int(used.group(1)) > 300, only.why
    assert re.match(r'rank-[23]\.out: "\[[0-9T:.-]+\] error: StepId=' + job_id + r'\.\d+ exceeded memory limit '
                    r'\(\d+ > 314572800\), being killed"$', only.evidence), only.evidence
    status = run_cli("status", job_id, cwd=work)
    assert "fault: program: out of memory on node2" in status.stdout, status.stdout
    assert "clusterddp: quarantined" not in proc.stderr
    assert run_cli("nodes", cwd=work).stdout.startswith("no node is quarantined")
