"""End to end on the real 2-node Slurm test cluster (tests/slurm/cluster.sh): real sbatch, srun, torchrun, gloo."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clusterddp.backends.slurm.commands import Slurm, parse_scontrol
from clusterddp.backends.slurm.script import render
from clusterddp.contract import PORT_BASE, PORT_SPAN

from .cases import CASES
from .conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.slurm

SPAWN_ARGS = ["--dist-url", "tcp://{master_addr}:{master_port}", "--world-size", "{nnodes}", "--rank", "{node_rank}",
              "--procs", "{gpus_per_node}", "--multiprocessing-distributed"]


@pytest.fixture
def work(slurm_env, tmp_path_factory):
    """A job directory on the (shared) file system, with the test training scripts."""
    d = tmp_path_factory.mktemp("job")
    for script in SCRIPTS.glob("*.py"):
        shutil.copy(script, d)
    env = dict(os.environ)
    return d, env


def results(run_dir: Path) -> list:
    out = []
    for log in sorted(run_dir.glob("*.out")):
        for line in log.read_text(errors="replace").splitlines():
            if "RESULT " in line:
                out.append(json.JSONDecoder().raw_decode(line.split("RESULT ", 1)[1])[0])
    return out


def submit(work, *args, timeout=240):
    d, env = work
    return run_cli("submit", *args, cwd=d, env=env, timeout=timeout)


def job_id_of(proc) -> str:
    return proc.stdout.strip().splitlines()[0]


#: A job name with every character that could break out of an #SBATCH line, and an output directory with a
#: space and a "%" (sbatch's own placeholder character): the launcher jobs below carry both.
HOSTILE_NAME = 'x" --partition=evil # \\ $(id) `id`'
SAFE_NAME = "x_--partition_evil_id_id"  # what clusterddp makes of it for file names
ODD_DIR = "out dir/50%"


@pytest.mark.parametrize("launcher", ["torchrun", "srun", "spawn"])
def test_two_nodes_two_gpus_each_launcher(work, launcher):
    """One real gloo job per launcher carries: the rank layout (block order, though the environment asks srun for
    cyclic), arguments passed through exactly, per-rank logs, `logs --rank`, a hostile job name reaching Slurm
    intact, an odd output directory, and the apptainer stand-in wrapping every task."""
    d, env = work
    script = "allreduce_spawn.py" if launcher == "spawn" else "allreduce.py"
    extra = SPAWN_ARGS if launcher == "spawn" else []
    bin_dir = d / "bin"  # only the apptainer stand-in: the real srun must stay in charge
    bin_dir.mkdir()
    shutil.copy(Path(__file__).resolve().parent / "standins" / "apptainer", bin_dir)
    record = d / "apptainer.log"
    env2 = dict(env, PATH=f"{bin_dir}:{env['PATH']}", APPTAINER_RECORD=str(record), SLURM_DISTRIBUTION="cyclic")
    proc = run_cli("submit", "--launcher", launcher, "--nodes", "2", "--gpus", "2", "--time", "5",
                   "--job-name", HOSTILE_NAME, "--output-dir", ODD_DIR, "--apptainer", "/images/t.sif", script,
                   "--wait", "--", *extra, "--echo", "a b", "$HOME", "it's", cwd=d, env=env2, timeout=240)
    assert proc.returncode == 0, proc.stderr
    job_id = job_id_of(proc)
    assert "RUNNING" in proc.stderr and f"job {job_id} ended COMPLETED, exit code 0" in proc.stderr
    fields = parse_scontrol(subprocess.run(["scontrol", "--oneliner", "show", "job", job_id], capture_output=True,
                                           text=True, env=env).stdout)
    assert fields["JobName"] == HOSTILE_NAME and fields["Partition"] == "debug", fields
    out_dir = d / "out dir" / "50%"  # "%%" in the directive made one literal "%"
    run_dir = out_dir / f"{SAFE_NAME}-{job_id}"
    res = results(run_dir)
    assert sorted(r["rank"] for r in res) == [0, 1, 2, 3], res
    for r in res:
        assert r["world_size"] == 4 and r["master_addr"] == "node1" and r["sum"] == 10.0
        assert r["host"] == ("node1" if r["rank"] < 2 else "node2"), r
        assert r["argv"][-4:] == ["--echo", "a b", "$HOME", "it's"]
        assert r["local_rank"] == r["rank"] % 2
    # the container wraps each Slurm task: every rank (srun) or every node's agent (torchrun, spawn); and the
    # supervisor's two questions in the batch shell (before the attempt, after it)
    assert record.read_text().splitlines() == ["APPTAINER opts=--nv image=/images/t.sif"] * (
        (4 if launcher == "srun" else 2) + 2)
    # per-rank logs where the README says
    if launcher == "srun":
        assert sorted(p.name for p in run_dir.glob("rank-*.out")) == [f"rank-{i}.out" for i in range(4)]
        assert all(r["cuda_visible_devices"] == "0,1" for r in res)  # Slurm set it from the fake GPUs
    else:
        assert sorted(p.name for p in run_dir.glob("node-*.out")) == ["node-0.out", "node-1.out"]
    if launcher == "torchrun":
        assert len(list(run_dir.glob("torchrun/*/attempt_0/*/stdout.log"))) == 4
    batch_log = out_dir / f"{SAFE_NAME}-{job_id}.out"
    assert "MASTER_ADDR=node1" in batch_log.read_text()
    # logs --rank N prints that rank's output
    logs = run_cli("logs", job_id, "--rank", "3", cwd=d, env=env)
    assert logs.returncode == 0 and '"rank": 3' in logs.stdout, logs.stdout + logs.stderr
    if launcher == "spawn":  # the script's own processes share their node's log
        assert "node-1.out holds ranks 2-3" in logs.stderr
    else:
        assert '"rank": 2' not in logs.stdout


def test_cpu_only_job_gets_its_cpus_and_a_fallback_port_every_node_uses(work):
    """--gpus 0 (gloo, no CUDA_VISIBLE_DEVICES), --cpus-per-task reaching the ranks' step (Slurm 22.05 does not
    pass it from sbatch to srun), and the job-id port taken on every node before the job starts: the head node
    picks the next free one and every rank rendezvouses there (a torch-free job: plumbing.py)."""
    d, env = work
    proc = submit(work, "--launcher", "srun", "--nodes", "2", "--gpus", "0", "--procs-per-node", "2",
                  "--cpus-per-task", "3", "--sbatch-arg=--hold", "plumbing.py", "--", "--show-step")
    assert proc.returncode == 0, proc.stderr
    job_id = job_id_of(proc)
    port = PORT_BASE + int(job_id) % PORT_SPAN
    holders = [hold_port(node, port) for node in ("node1", "node2", "node3")]
    try:
        subprocess.run(["scontrol", "release", job_id], check=True, env=env, capture_output=True)
        final = Slurm.here().wait(job_id)
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
    assert final.state == "COMPLETED", final
    res = results(d / "clusterddp-runs" / f"plumbing-{job_id}")
    assert sorted(r["rank"] for r in res) == [0, 1, 2, 3]
    for r in res:
        assert r["cuda_visible_devices"] is None and r["sum"] == 10.0, r
        assert r["master_port"] == port + 1, (port, r)  # the fallback, the same on both nodes
        assert r["omp_num_threads"] == "3" and r["slurm_cpus_per_task"] == "3", r
    (step,) = [r["step"] for r in res if r.get("step")]
    assert re.search(r"\bTRES=cpu=12\b", step), step  # 4 ranks x 3 CPUs: srun was given --cpus-per-task


def hold_port(node: str, port: int) -> subprocess.Popen:
    """A process listening on ``port`` in ``node``'s network namespace until killed."""
    holder = subprocess.Popen(
        ["ip", "netns", "exec", f"cddp-{node}", sys.executable, "-c",
         "import socket, sys, time; s = socket.create_server(('', int(sys.argv[1]))); print('held', flush=True); "
         "time.sleep(600)", str(port)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held", f"could not hold port {port} on {node}"
    return holder


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_cases_pass_sbatch_test_only(slurm_env, tmp_path, name, slurm_release):
    """Each golden case, shrunk to fit the test cluster (2 nodes, 2 GPUs, partition debug), is accepted; an
    expedited requeue (the spares case) where the release knows it (26.05's test cluster allows it; 22.05's sbatch
    refuses --requeue=expedite, which submit says before sbatch: test_expedite_where_the_cluster_does_not_allow_it)."""
    spec = CASES[name]
    spec = spec.replace(expedite=spec.expedite if slurm_release == "26.05" else None)
    spec = spec.replace(partition=None, account=None, qos=None, constraint=None, mem=None,
                        cpus_per_task=spec.cpus_per_task and 2,
                        nodes=min(spec.nodes, 2), gpus_per_node=min(spec.gpus_per_node, 2),
                        procs_per_node=None if spec.gpus_per_node else spec.procs_per_node,
                        sbatch_args=tuple(a for a in spec.sbatch_args if not a.startswith("--mail")), after=())
    script = tmp_path / "job.sh"
    script.write_text(render(spec))
    proc = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and "to start at" in proc.stderr, proc.stderr


@pytest.mark.slurm_releases("22.05")
def test_expedite_where_the_cluster_does_not_allow_it_is_refused_before_sbatch(work):
    """Issue 39: --expedite on a cluster without expedited requeue is one line (exit 2) before anything is queued."""
    proc = submit(work, "--launcher", "srun", "--time", "10", "--expedite", "plumbing.py")
    assert proc.returncode == 2, proc.stderr
    assert "--expedite: this cluster does not allow an expedited requeue" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_request_that_cannot_fit_fails_at_submit(work):
    proc = submit(work, "--launcher", "srun", "--no-check", "--nodes", "2", "--gpus", "4", "plumbing.py")
    assert proc.returncode == 1
    assert "sbatch failed" in proc.stderr and "Requested node configuration is not available" in proc.stderr
    assert "the script is kept at" in proc.stderr and "Traceback" not in proc.stderr


def test_two_jobs_submitted_together_share_nodes_with_ports_of_their_own(work):
    """Two 2-node jobs of 1 GPU each fit on the same two nodes (2 GPUs each) at once: Slurm places them on shared
    nodes, and each job's ranks meet at a MASTER_PORT of its own (a shared port would join or fail them)."""
    d, env = work
    ids = []
    for _ in range(2):
        proc = submit(work, "--launcher", "srun", "--nodes", "2", "--gpus", "1", "plumbing.py")
        assert proc.returncode == 0, proc.stderr
        ids.append(job_id_of(proc))
    for job_id in ids:
        w = run_cli("status", job_id, cwd=d, env=env)
        assert w.returncode == 0
    finals = []
    for job_id in ids:
        slurm = Slurm.here()

        finals.append(slurm.wait(job_id))
    assert [f.state for f in finals] == ["COMPLETED", "COMPLETED"]
    ports, hosts = set(), []
    for job_id in ids:
        res = results(d / "clusterddp-runs" / f"plumbing-{job_id}")
        assert sorted(r["rank"] for r in res) == [0, 1] and all(r["sum"] == 3.0 for r in res)
        hosts.append({r["host"] for r in res})
        text = (d / "clusterddp-runs" / f"plumbing-{job_id}.out").read_text()
        ports.add(text.split("MASTER_PORT=")[1].split()[0])
    assert len(ports) == 2
    assert hosts[0] & hosts[1], hosts  # they shared a node (else the ports' difference would prove nothing)


def test_status_logs_cancel(work):
    d, env = work
    proc = submit(work, "--nodes", "2", "--gpus", "1", "--launcher", "srun", "sleeper.py", "--", "300")
    assert proc.returncode == 0, proc.stderr
    job_id = job_id_of(proc)
    slurm = Slurm.here()

    deadline = time.monotonic() + 60
    while slurm.info(job_id).state != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.3)
    st = run_cli("status", job_id, cwd=d, env=env)
    assert st.returncode == 0 and "RUNNING" in st.stdout and "node[1-2]" in st.stdout, st.stdout
    rank_log = d / "clusterddp-runs" / f"sleeper-{job_id}" / "rank-1.out"
    while "started" not in (rank_log.read_text() if rank_log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.3)
    logs = run_cli("logs", job_id, "--rank", "1", cwd=d, env=env)
    assert logs.returncode == 0 and "sleeper rank 1 started" in logs.stdout
    follower = subprocess.Popen(["python3", "-m", "clusterddp", "logs", job_id, "--rank", "0", "--follow"], cwd=d,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    c = run_cli("cancel", job_id, cwd=d, env=env)
    assert c.returncode == 0, c.stderr
    out, _ = follower.communicate(timeout=60)  # --follow ends by itself when the job does
    assert "sleeper rank 0 started" in out
    final = slurm.wait(job_id)
    assert final.state == "CANCELLED"
    st = run_cli("status", job_id, cwd=d, env=env)
    assert "CANCELLED" in st.stdout
    batch = run_cli("logs", job_id, cwd=d, env=env)
    assert batch.returncode == 0 and f"job {job_id} (restart count 0) on node[1-2]" in batch.stdout


@pytest.mark.slurm_releases("22.05")  # clusterddp's own follow loop: the same on every release
def test_wait_with_a_bad_poll_setting_warns_once_and_still_follows(work):
    d, env = work
    proc = run_cli("submit", "--nodes", "1", "--gpus", "0", "--procs-per-node", "1", "--cpus-per-task", "1",
                   "sleeper.py", "--wait", "--", "4", cwd=d, env={**env, "CLUSTERDDP_POLL_MAX": "soon"}, timeout=240)
    assert proc.returncode == 0, proc.stderr
    warning = "CLUSTERDDP_POLL_MAX='soon' is not a number of seconds from 0.5 to 60"
    assert proc.stderr.count(warning) == 1, proc.stderr
    assert "COMPLETED" in proc.stdout + proc.stderr


def test_unknown_job_id(work):
    d, env = work
    for command in (["status", "999999"], ["cancel", "999999"], ["logs", "999999"]):
        proc = run_cli(*command, cwd=d, env=env)
        assert proc.returncode == 1, command
        assert "job 999999 is unknown to Slurm" in proc.stderr and "Traceback" not in proc.stderr


# Whole training runs, one per release: spawn on the oldest, srun on the newest. torchrun (the default) runs the
# example over SSH on 24.11 and 26.05 (test_remote.test_submit_wait_logs_over_ssh); every launcher's layout and
# arguments on every release: test_two_nodes_two_gpus_each_launcher.
@pytest.mark.parametrize("launcher", [pytest.param("spawn", marks=pytest.mark.slurm_releases("22.05")),
                                      pytest.param("srun", marks=pytest.mark.slurm_releases("24.11", "26.05"))])
def test_training_example_on_two_nodes(work, launcher):
    """examples/train_ddp.py as a 2-node x 2-GPU job (gloo on the fake GPUs' CPUs)."""
    d, _ = work
    shutil.copytree(Path(__file__).resolve().parent.parent / "examples", d / "examples", dirs_exist_ok=True)
    proc = submit(work, "--launcher", launcher, "--nodes", "2", "--gpus", "2", "--time", "10",
                  "examples/train_ddp.py", "--wait", "--", "--epochs", "1", "--images", "2", "--depth", "3",
                  "--max-steps", "2", timeout=300)
    assert proc.returncode == 0, proc.stderr
    job_id = job_id_of(proc)
    run_dir = d / "clusterddp-runs" / f"train_ddp-{job_id}"
    text = "".join(p.read_text(errors="replace") for p in sorted(run_dir.glob("*.out")))
    assert "world size 4 (2 node(s) x 2)" in text and "final loss" in text, text[-3000:]
    assert list((run_dir / "checkpoints").glob("ckpt-*.pt"))


def test_wait_ctrl_c_can_cancel(work):
    d, env = work
    cli = subprocess.Popen(["python3", "-m", "clusterddp", "submit", "--nodes", "1", "--gpus", "1", "--wait",
                            "--on-interrupt", "cancel", "sleeper.py", "--", "300"], cwd=d, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           # Ctrl-C as at a terminal: a shell running the suite in the background ignores SIGINT
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    logs = d / "clusterddp-runs"
    while time.monotonic() < deadline and not any("started" in p.read_text() for p in logs.glob("sleeper-*/*.out")):
        time.sleep(0.3)
    cli.send_signal(2)  # SIGINT, as Ctrl-C
    out, err = cli.communicate(timeout=60)
    assert cli.returncode == 130 and "cancelled job" in err, err
    slurm = Slurm.here()

    assert slurm.wait(out.strip()).state == "CANCELLED"


def test_array_runs_each_task_as_a_ddp_job(work):
    d, env = work
    proc = submit(work, "--launcher", "srun", "--array", "0-1%1", "--nodes", "2", "--gpus", "1", "plumbing.py")
    assert proc.returncode == 0, proc.stderr
    array_id = job_id_of(proc)
    slurm = Slurm.here()

    finals = [slurm.wait(f"{array_id}_{i}") for i in range(2)]
    assert [f.state for f in finals] == ["COMPLETED", "COMPLETED"]
    run_dirs = [p for p in (d / "clusterddp-runs").iterdir() if p.is_dir()]
    assert len(run_dirs) == 2  # one per array task (each task has its own job id, port and logs)
    for run_dir in run_dirs:
        res = results(run_dir)
        assert sorted(r["rank"] for r in res) == [0, 1] and all(r["sum"] == 3.0 for r in res)


def test_failed_parent_leaves_the_child_pending_and_status_says_so(work):
    d, env = work
    parent = submit(work, "--launcher", "srun", "--nodes", "2", "--gpus", "1", "plumbing.py", "--", "--fail-rank", "1")
    assert parent.returncode == 0, parent.stderr
    parent_id = job_id_of(parent)
    child = submit(work, "--launcher", "srun", "--after", parent_id, "--nodes", "2", "--gpus", "1", "plumbing.py")
    assert child.returncode == 0, child.stderr
    child_id = job_id_of(child)
    slurm = Slurm.here()

    assert slurm.wait(parent_id).state == "FAILED"
    final = slurm.wait(child_id)  # returns: the dependency can never be met
    assert final.state == "PENDING" and final.reason == "DependencyNeverSatisfied"
    st = run_cli("status", child_id, cwd=d, env=env)
    assert "will never start" in st.stdout and f"clusterddp cancel {child_id}" in st.stdout
    waited = submit(work, "--launcher", "srun", "--after", parent_id, "--nodes", "1", "--gpus", "1", "plumbing.py",
                    "--wait")
    assert waited.returncode == 1 and "will never start" in waited.stderr
    for job in (child_id, job_id_of(waited)):
        run_cli("cancel", job, cwd=d, env=env)


def test_a_job_slurm_can_never_place_is_not_followed_forever(work):
    """What a self-requeue that excluded too many nodes would leave (ExcNodeList, and fewer nodes left in the
    partition than the job's count): Slurm keeps it PENDING with BadConstraints, forever. --wait's follow loop
    returns and status says it will never start."""
    d, env = work
    proc = submit(work, "--launcher", "srun", "--nodes", "2", "--gpus", "1", "--sbatch-arg=--hold", "plumbing.py")
    assert proc.returncode == 0, proc.stderr
    job_id = job_id_of(proc)
    slurm = Slurm.here()

    try:
        for change in (["update", f"JobId={job_id}", "ExcNodeList=node1,node2", "NumNodes=2-2"], ["release", job_id]):
            subprocess.run(["scontrol", *change], check=True, env=env, capture_output=True)
        deadline = time.monotonic() + 60
        while slurm.info(job_id).reason != "BadConstraints" and time.monotonic() < deadline:
            time.sleep(0.5)
        got = []  # slurm.wait in a thread: a follow loop that never returns fails the test instead of hanging it
        follower = threading.Thread(target=lambda: got.append(slurm.wait(job_id, max_poll=1)), daemon=True)
        follower.start()
        follower.join(timeout=30)
        assert got, f"slurm.wait still follows job {job_id}: {slurm.info(job_id)}"
        final = got[0]
        assert final.state == "PENDING" and final.reason == "BadConstraints", final
        st = run_cli("status", job_id, cwd=d, env=env)
        assert "BadConstraints: Slurm can never place it as asked" in st.stdout, st.stdout
        assert "will never start" in st.stdout and f"clusterddp cancel {job_id}" in st.stdout, st.stdout
    finally:
        run_cli("cancel", job_id, cwd=d, env=env)
