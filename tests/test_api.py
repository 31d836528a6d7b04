"""The Python API: JobSpec -> submitit, on the real test cluster and with the local fallback."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

import clusterddp
from clusterddp import JobSpec, SpecError
from clusterddp.api import JobFailed, executor_params

from .conftest import ROOT, run_cli


def allreduce_job(cfg):
    """Runs on every rank of the submitted job."""
    import torch
    import torch.distributed as dist

    from clusterddp import runtime

    env = runtime.init(timeout=60)
    t = torch.tensor([float(env.rank + 1)])
    dist.all_reduce(t)
    if env.rank == cfg.get("fail_rank", -1):
        raise ValueError(f"boom on rank {env.rank}")
    runtime.shutdown()
    return {"rank": env.rank, "world_size": env.world_size, "host": socket.gethostname(), "sum": t.item(),
            "local_rank": env.local_rank, "cfg": cfg}


@pytest.fixture(autouse=True)
def pickle_this_module_by_value():
    # Jobs run `python -m submitit...` elsewhere: ship these test functions by value, not by import path.
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_mapping_every_field():
    spec = JobSpec(nodes=3, gpus_per_node=4, cpus_per_task=6, mem="64G", time="1-00:00:30", partition="gpu",
                   account="proj", qos="high", constraint="a100", exclusive=True, job_name="sweep",
                   exclude=("node7", "gpu[01-03]"),
                   env=(("NCCL_DEBUG", "INFO"), ("ODD", "a b")), setup=("module load cuda",),
                   sbatch_args=("--mail-type=END", "--no-kill"))
    p = executor_params(spec)
    assert (p["nodes"], p["ntasks_per_node"], p["gpus_per_node"], p["cpus_per_task"]) == (3, 4, 4, 6)
    assert (p["mem"], p["time"], p["partition"], p["account"], p["qos"], p["constraint"]) == \
        ("64G", 24 * 60 + 1, "gpu", "proj", "high", "a100")
    assert p["exclusive"] is True and p["job_name"] == "sweep" and p["exclude"] == "node7,gpu[01-03]"
    assert p["additional_parameters"] == {"ignore_pbs": True, "mail_type": "END", "no_kill": True}
    assert "--kill-on-bad-exit=1" in p["srun_args"] and "--cpus-per-task=6" in p["srun_args"]
    setup = "\n".join(p["setup"])
    assert "export NCCL_DEBUG=INFO" in setup and "export ODD='a b'" in setup and "module load cuda" in setup
    assert "MASTER_ADDR=" in setup and "MASTER_PORT=$(( 20000 + 10#$SLURM_JOB_ID % 10000 ))" in setup
    assert "CLUSTERDDP_WORLD_SIZE=12" in setup
    assert executor_params(spec.replace(gpu_request="gres"))["gres"] == "gpu:4"
    assert executor_params(spec.replace(gpu_request="gpus-per-task", launcher="srun"))["gpus_per_task"] == 1
    cpu = executor_params(JobSpec(nodes=2, procs_per_node=3))
    assert cpu["ntasks_per_node"] == 3 and "gpus_per_node" not in cpu and "time" not in cpu


@pytest.mark.parametrize("kwargs,message", [
    (dict(script="train.py"), "use submit_script"),
    (dict(launcher="spawn"), "one task per rank"),
    (dict(template="mine"), "templates do not apply"),
    (dict(time="UNLIMITED"), "UNLIMITED cannot be expressed"),
])
def test_unsupported_fields_are_refused(kwargs, message):
    with pytest.raises(SpecError, match=message):
        executor_params(JobSpec(**kwargs))


def test_unknown_backend():
    with pytest.raises(SpecError, match="unknown backend 'slrum' \\(did you mean 'slurm'\\?\\)"):
        clusterddp.submit_function(allreduce_job, JobSpec(), {}, backend="slrum")


def check_results(results, world, hosts):
    assert [r["rank"] for r in results] == list(range(world))
    assert all(r["world_size"] == world and r["sum"] == world * (world + 1) / 2 for r in results)
    assert [r["host"] for r in results] == hosts


@pytest.mark.slurm
def test_function_job_on_two_nodes(slurm_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = clusterddp.submit_function(allreduce_job, JobSpec(nodes=2, gpus_per_node=2, time="5"), {"x": 1},
                                     backend="slurm")
    assert job.result()["rank"] == 0 and job.result()["cfg"] == {"x": 1}
    check_results(job.results(), 4, ["node1", "node1", "node2", "node2"])
    assert [r["local_rank"] for r in job.results()] == [0, 1, 0, 1]
    assert job.state == "COMPLETED"


@pytest.mark.slurm
def test_array_of_two_configs(slurm_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    jobs = clusterddp.map_array(allreduce_job, JobSpec(nodes=2, gpus_per_node=1, time="5"), [{"i": 0}, {"i": 1}],
                                max_parallel=1, backend="slurm")
    assert [j.job_id.split("_")[1] for j in jobs] == ["0", "1"]
    for i, job in enumerate(jobs):
        check_results(job.results(), 2, ["node1", "node2"])
        assert job.result()["cfg"] == {"i": i}
    # the throttle reached Slurm as the array's % limit
    array_id = jobs[0].job_id.split("_")[0]
    script = next(tmp_path.glob(f"clusterddp-runs/*-submitit/{array_id}/{array_id}_submission.sh")).read_text()
    assert "#SBATCH --array=0-1%1" in script, script
    # the configs are the trials of a sweep named after the function (one squeue call, the run directories)
    rows = json.loads(run_cli("sweep", "status", "allreduce_job", "--json", cwd=tmp_path).stdout)
    assert [(r["params"], r["state"], r["job"]) for r in rows] == [
        ({"i": "0"}, "COMPLETED", f"{array_id}_0"), ({"i": "1"}, "COMPLETED", f"{array_id}_1")]


def report_job(cfg):
    from clusterddp import runtime

    runtime.init(timeout=60)
    for step in range(2):
        runtime.report(step=step, loss=runtime.all_reduce_mean(cfg["lr"] * (2 - step)))
    runtime.shutdown()
    return cfg


@pytest.mark.ranks
def test_map_array_records_its_trials_for_sweep_status(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    jobs = clusterddp.map_array(report_job, JobSpec(gpus_per_node=0, procs_per_node=2), [{"lr": 0.5}, {"lr": 2}],
                                backend="local", name="api-sweep")
    assert [j.result() for j in jobs] == [{"lr": 0.5}, {"lr": 2}]
    rows = json.loads(run_cli("sweep", "status", "api-sweep", "--local", "--json", cwd=tmp_path).stdout)
    assert [(r["params"], r["state"], r["last"], r["best"]) for r in rows] == [
        ({"lr": "0.5"}, "COMPLETED", {"loss": 0.5}, {"loss": 0.5}),
        ({"lr": "2"}, "COMPLETED", {"loss": 2.0}, {"loss": 2.0})]
    again = run_cli("sweep", "api-sweep", "--rerun", "failed", "--local", cwd=tmp_path)
    assert again.returncode == 2 and "submitted by clusterddp.map_array" in again.stderr
    # Issue 41: a later call with the same name adds to the record; the earlier trials stay
    more = clusterddp.map_array(report_job, JobSpec(gpus_per_node=0, procs_per_node=2), [{"lr": 3}],
                                backend="local", name="api-sweep")
    assert [j.result() for j in more] == [{"lr": 3}]
    rows = json.loads(run_cli("sweep", "status", "api-sweep", "--local", "--json", cwd=tmp_path).stdout)
    assert sorted((r["params"]["lr"], r["state"]) for r in rows) == [("0.5", "COMPLETED"), ("2", "COMPLETED"),
                                                                     ("3", "COMPLETED")], rows


@pytest.mark.slurm
def test_raising_rank_gives_the_traceback(slurm_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = clusterddp.submit_function(allreduce_job, JobSpec(nodes=2, gpus_per_node=2, time="5"), {"fail_rank": 3},
                                     backend="slurm")
    with pytest.raises(JobFailed) as exc:
        job.result()
    text = str(exc.value)
    assert f"job {job.job_id}: rank 3 failed" in text
    assert "ValueError: boom on rank 3" in text and "Traceback" in text


@pytest.mark.ranks
def test_local_fallback_four_ranks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = clusterddp.submit_function(allreduce_job, JobSpec(nodes=2, gpus_per_node=2), {"y": 2}, backend="local")
    check_results(job.results(), 4, [socket.gethostname()] * 4)
    assert [r["local_rank"] for r in job.results()] == [0, 1, 0, 1]
    failing = clusterddp.submit_function(allreduce_job, JobSpec(procs_per_node=2), {"fail_rank": 1}, backend="local")
    with pytest.raises(JobFailed, match="ValueError: boom on rank 1"):
        failing.result()


@pytest.mark.ranks
def test_submit_script_local(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = clusterddp.submit_script(JobSpec(procs_per_node=2), str(ROOT / "tests" / "scripts" / "allreduce.py"),
                                   ["--echo", "x y"], backend="local")
    outputs = job.results()
    assert len(outputs) == 2 and all("RESULT" in o for o in outputs)
    assert '"sum": 3.0' in outputs[0] and '"argv": ["--echo", "x y"]' in outputs[0]


@pytest.mark.slurm
@pytest.mark.slurm_releases("22.05")  # the example's API path; submitit on 24.11: the other API tests
def test_example_on_the_cluster_and_locally(slurm_env, tmp_path):
    example = str(ROOT / "examples" / "submit_with_python.py")
    on_slurm = subprocess.run([sys.executable, example], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert on_slurm.returncode == 0, on_slurm.stderr
    assert "backend=slurm" in on_slurm.stdout and "rank 3 of 4 on node2: all-reduce sum 10.0" in on_slurm.stdout
    local = subprocess.run([sys.executable, example, "--backend", "local"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
    assert local.returncode == 0, local.stderr
    assert "backend=local" in local.stdout and "rank 3 of 4" in local.stdout and "sweep:" in local.stdout
