"""Pre-flight checks: the offer of the cluster against the request, before queueing."""
from __future__ import annotations

import os

import pytest

from clusterddp import JobSpec
from clusterddp.backends.slurm.commands import Partition, _gpu_count
from clusterddp.backends.slurm.preflight import PreflightError, check_cluster, check_local

from .conftest import SCRIPTS, run_cli

GPU = Partition("gpu", nodes=8, max_time_s=2 * 86400, gpus_per_node=4, cpus_per_node=64, mem_mb_per_node=512000,
                default=True)
CPU = Partition("cpu", nodes=100, max_time_s=None, gpus_per_node=0, cpus_per_node=32, mem_mb_per_node=128000)
PARTS = {"gpu": GPU, "cpu": CPU}


@pytest.mark.parametrize("kwargs,message", [
    (dict(partition="gpux"), "partition 'gpux' does not exist; partitions here: cpu, gpu"),
    (dict(gpus_per_node=8, nodes=2), "partition gpu has 4 GPUs per node; you asked for 8: use --nodes 4 --gpus 4 "
                                     "for world size 16"),
    (dict(gpus_per_node=8, nodes=8), "the most it offers is --nodes 8 --gpus 4 (world size 32)"),
    (dict(nodes=9, gpus_per_node=4), "partition gpu has 8 node(s); you asked for 9"),
    (dict(partition="cpu", gpus_per_node=1), "partition cpu has no GPUs"),
    (dict(gpus_per_node=4, cpus_per_task=32), "64 CPUs per node; 4 rank(s) x 32 CPUs need 128: use --cpus-per-task 16"),
    (dict(gpus_per_node=4, mem="600G"), "512000 MB of memory per node; you asked for --mem 600G"),
    (dict(gpus_per_node=4, time="3-00:00:00"), "allows at most 2-00:00:00; you asked for 3-00:00:00"),
    (dict(gpus_per_node=4, requeue=True), "allows at most 2-00:00:00; you asked for UNLIMITED"),
])
def test_cluster_offer_vs_request(kwargs, message):
    with pytest.raises(PreflightError) as exc:
        check_cluster(JobSpec("t.py", **kwargs), PARTS)
    assert message in str(exc.value)


def test_fitting_requests_pass():
    assert check_cluster(JobSpec("t.py", nodes=8, gpus_per_node=4, cpus_per_task=16, mem="500G", time="1-00"),
                         PARTS) == []
    assert check_cluster(JobSpec("t.py", partition="cpu", nodes=50, procs_per_node=32), PARTS) == []


def test_gres_parsing():
    assert [_gpu_count(g) for g in ("gpu:2", "gpu:a100:4(S:0-1)", "gpu:2,shard:8", "(null)", "")] == [2, 4, 2, 0, 0]


def test_local_checks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    (tmp_path / "a-file").write_text("")
    check_local(JobSpec("t.py"))
    with pytest.raises(PreflightError, match="not found"):
        check_local(JobSpec("missing.py"))
    with pytest.raises(PreflightError, match="output directory 'a-file/runs' is not writable here"):
        check_local(JobSpec("t.py", output_dir="a-file/runs"))


@pytest.mark.slurm
def test_preflight_on_the_test_cluster(slurm_env, tmp_path):
    import shutil

    shutil.copy(SCRIPTS / "allreduce.py", tmp_path)
    env = dict(os.environ)
    too_many = run_cli("submit", "--nodes", "2", "--gpus", "4", "allreduce.py", cwd=tmp_path, env=env)
    assert too_many.returncode == 2, too_many.stderr
    assert "partition debug has 2 GPUs per node; you asked for 4" in too_many.stderr
    assert not list(tmp_path.glob("clusterddp-runs/*.sbatch"))  # refused before anything was written
    nopart = run_cli("submit", "-p", "gpu", "allreduce.py", cwd=tmp_path, env=env)
    assert nopart.returncode == 2 and "partition 'gpu' does not exist; partitions here: debug" in nopart.stderr
    # what only Slurm itself knows: sbatch --test-only
    feature = run_cli("submit", "--constraint", "nosuchfeature", "allreduce.py", cwd=tmp_path, env=env)
    assert feature.returncode == 2 and "sbatch --test-only refused the job" in feature.stderr, feature.stderr
    # --no-check goes straight to sbatch, whose refusal is a runtime error with its stderr
    unchecked = run_cli("submit", "--no-check", "--nodes", "2", "--gpus", "4", "allreduce.py", cwd=tmp_path, env=env)
    assert unchecked.returncode == 1 and "Requested node configuration is not available" in unchecked.stderr


@pytest.mark.slurm
def test_parent_job_variables_do_not_leak(slurm_env, tmp_path):
    import shutil

    from clusterddp.backends.slurm.commands import Slurm, parse_scontrol

    slurm = Slurm.here()

    shutil.copy(SCRIPTS / "allreduce.py", tmp_path)
    # as if submitting from inside another job: sbatch would read SBATCH_PARTITION as an option
    env = dict(os.environ, SBATCH_PARTITION="bogus", SLURM_CPUS_PER_TASK="99", SLURM_CPU_BIND="map_cpu:7",
               SLURM_JOB_ID="424242", SRUN_CPUS_PER_TASK="99")
    proc = run_cli("submit", "--nodes", "2", "--gpus", "1", "allreduce.py", "--wait", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert parse_scontrol(slurm.run(["scontrol", "-o", "show", "job", job_id]).stdout)["Partition"] == "debug"
