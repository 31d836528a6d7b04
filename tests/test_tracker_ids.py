"""Issue 56 item 5: the trackers' run id (``runtime.run_id()``: WANDB_RUN_ID with WANDB_RESUME=allow, MLflow's tag,
the checkpoints' owner) is one per job. The batch script's supervisor (``python -m clusterddp.healing next start``,
run here as the batch script runs it) writes the job's identity at a new job's start; two jobs with one run directory
path (two clusters, or a job id Slurm gave again) get two ids, while a requeue and a retry keep the job's. Without the
identity file (an older batch script) the id is the path-only one of before; a damaged or linked one is not trusted."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional

import pytest

from clusterddp import contract
from clusterddp.runtime import ckptowner
from clusterddp.runtime.report import export_run_id, run_id

#: What W&B takes as a run id everywhere (and MLflow as a tag, and a file system as a name).
WANDB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def start(run_dir: Path, restart: int, cluster: Optional[str] = "alpha", job: str = "4242",
          extra: Optional[Dict[str, str]] = None) -> None:
    """The supervisor's ``start``, as templates/base.sh.j2 asks it (clusterddp_next), in a Slurm job's environment:
    the job's id and cluster (None: a Slurm without SLURM_CLUSTER_NAME), its restart count."""
    env = contract.without_parent_job(os.environ)
    env.update({"SLURM_JOB_ID": job, "SLURM_RESTART_COUNT": str(restart), "SLURM_JOB_PARTITION": "gpu",
                contract.RUN_DIR: str(run_dir), **(extra or {})})
    if cluster is not None:
        env["SLURM_CLUSTER_NAME"] = cluster
    proc = subprocess.run([sys.executable, "-m", "clusterddp.healing", "next", "start", "--began", str(time.time()),
                           "--run-dir", str(run_dir), "--hosts", "node1,node2,node3", "--bad", "", "--restart",
                           str(restart), "--attempt", "0", "--partition", "gpu", "--nodes", "2", "--per-node", "2",
                           "--retries", "2", "--max-requeues", "3", "--launcher", "srun", "--requeues"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.splitlines()[:2] == ["run", "node1,node2"], (proc.stdout, proc.stderr)


def tracker_id(run_dir: Path) -> Optional[str]:
    """What every rank of the job computes (runtime.run_id() with the batch script's CLUSTERDDP_RUN_DIR)."""
    return run_id({contract.RUN_DIR: str(run_dir)})


def path_only(run_dir: Path) -> str:
    """The id of before, from the path alone (spelled out here: a batch script of an older clusterddp gets it)."""
    path = os.path.abspath(run_dir).rstrip("/")
    name = re.sub(r"[^A-Za-z0-9_-]", "-", os.path.basename(path))[:40]
    return f"{name}-{hashlib.sha256(path.encode()).hexdigest()[:12]}"


def test_two_clusters_one_path_are_two_runs(tmp_path):
    """The same run directory path (the same job id too) on cluster A, then on cluster B: two ids, neither the
    path-only one (which both would have had, the second writing into the first's W&B run)."""
    run = tmp_path / "runs" / "train-4242"
    start(run, 0, cluster="alpha")
    first = tracker_id(run)
    assert json.loads((run / contract.IDENTITY_FILE).read_text())["cluster"] == "alpha"
    start(run, 0, cluster="beta")
    second = tracker_id(run)
    assert json.loads((run / contract.IDENTITY_FILE).read_text())["cluster"] == "beta"
    assert first != second and path_only(run) not in (first, second), (first, second)
    for found in (first, second):
        assert found is not None and found.startswith("train-4242-") and WANDB_ID.fullmatch(found), found


def test_a_job_id_given_again_is_another_run(tmp_path):
    """Slurm's job ids start over after its counter is reset: a new job 4242 on the same cluster, in the path the
    old job 4242 used, is another run."""
    run = tmp_path / "train-4242"
    start(run, 0)
    first = tracker_id(run)
    start(run, 0)
    assert tracker_id(run) != first


def test_an_array_task_is_named_as_squeue_names_it(tmp_path):
    start(tmp_path / "trial", 0, job="5001", extra={"SLURM_ARRAY_JOB_ID": "5000", "SLURM_ARRAY_TASK_ID": "3"})
    record = json.loads((tmp_path / "trial" / contract.IDENTITY_FILE).read_text())
    assert record["job"] == "5000_3" and re.fullmatch(r"[0-9a-f]{32}", record["token"]), record


def test_a_requeue_and_a_retry_keep_the_job_s_id(tmp_path):
    """A requeue (restart 1: another allocation, maybe another batch host) and a retry within the allocation (the
    supervisor's ``ended`` deciding to run again, setting the failed attempt's logs aside) keep the id; so does the
    checkpoint owner."""
    run = tmp_path / "train-4242"
    start(run, 0)
    job_id = tracker_id(run)
    written = (run / contract.IDENTITY_FILE).read_bytes()
    (run / "rank-0.out").write_text("step 10\n")
    (run / contract.STEP_ERR.format(restarts=0, attempt=0)).write_text("srun: error: node2: task 3: Killed\n")
    proc = subprocess.run([sys.executable, "-m", "clusterddp.healing", "next", "ended", "--run-dir", str(run),
                           "--hosts", "node1,node2,node3", "--nodes", "2", "--per-node", "2", "--retries", "2",
                           "--max-requeues", "3", "--requeues", "--status", "137", "--ran-on", "node1,node2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.split("\n")[0] in ("run", "gate"), (proc.stdout, proc.stderr)  # a retry here
    assert not (run / "rank-0.out").exists()  # (the attempt's logs were set aside: the retry happened)
    assert tracker_id(run) == job_id
    start(run, 1, cluster=None)  # the requeue: its start keeps the job's identity, whatever the host
    start(run, 2)
    assert tracker_id(run) == job_id and (run / contract.IDENTITY_FILE).read_bytes() == written
    me = ckptowner.owner({contract.RUN_DIR: str(run)})
    assert me == ckptowner.Owner(job_id, False)


def test_a_requeue_of_a_job_begun_without_one_keeps_the_path_id(tmp_path):
    """A job whose first allocation wrote no identity (a batch script of an older clusterddp, requeued after an
    upgrade) keeps the id it began with: a later restart writes none."""
    run = tmp_path / "train-7"
    start(run, 0)
    (run / contract.IDENTITY_FILE).unlink()
    assert tracker_id(run) == path_only(run)
    start(run, 1)
    assert not (run / contract.IDENTITY_FILE).exists() and tracker_id(run) == path_only(run)


def test_a_new_job_resumes_an_older_job_s_checkpoint(tmp_path):
    """The id is the checkpoint owner too: a new job with the same directory is another run, yet it continues from
    the older run's checkpoint, as documented (one directory, one line of work); a sweep's trial is still its trial."""
    run = tmp_path / "train-9"
    start(run, 0)
    old = tracker_id(run)
    start(run, 0)
    me = ckptowner.owner({contract.RUN_DIR: str(run)})
    assert me.run != old and not me.trial
    assert ckptowner.resumable(me, {"run": old, "trial": False})
    (run / contract.TRIAL_FILE).write_text(json.dumps({"sweep": "lr", "key": "abc", "index": 0}))
    assert ckptowner.owner({contract.RUN_DIR: str(run)}) == ckptowner.Owner("sweep-lr-trial-abc", True)


def test_export_sets_wandb_s_id(tmp_path, monkeypatch):
    run = tmp_path / "train-5"
    start(run, 0)
    monkeypatch.setenv(contract.RUN_DIR, str(run))
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    monkeypatch.delenv(contract.RUN_ID, raising=False)
    export_run_id()
    assert os.environ["WANDB_RUN_ID"] == os.environ[contract.RUN_ID] == tracker_id(run) != path_only(run)


def test_no_identity_file_is_the_path_only_id(tmp_path):
    run = tmp_path / "train-11"
    run.mkdir()
    assert tracker_id(run) == path_only(run)
    assert run_id({}) is None


GOOD = {"cluster": "alpha", "job": "1", "token": "0123456789abcdef0123456789abcdef"}


@pytest.mark.parametrize("content", [
    b"", b"not json", b"[1, 2]", b"{}", json.dumps(dict(GOOD, token="0123")).encode(),
    json.dumps(dict(GOOD, token="0123456789ABCDEF0123456789ABCDEF")).encode(),
    json.dumps(dict(GOOD, cluster=["alpha"])).encode(), json.dumps(dict(GOOD, job=1)).encode(),
    json.dumps({k: v for k, v in GOOD.items() if k != "job"}).encode(),
    json.dumps(dict(GOOD, cluster="x" * 129)).encode(),
    json.dumps(GOOD).encode() + b" " * 5000,  # too big for a record of ours
], ids=["empty", "text", "list", "no-fields", "short-token", "upper-token", "list-cluster", "int-job",
        "no-job", "long-cluster", "too-big"])
def test_a_malformed_identity_is_not_trusted(tmp_path, content):
    run = tmp_path / "train-12"
    run.mkdir()
    (run / contract.IDENTITY_FILE).write_bytes(content)
    assert tracker_id(run) == path_only(run)
    (run / contract.IDENTITY_FILE).write_text(json.dumps(GOOD))  # (the reader does take a good one)
    assert tracker_id(run) != path_only(run)


def test_a_linked_identity_is_not_trusted_and_a_new_job_replaces_the_link(tmp_path):
    """identity.json as a link (to another job's identity) is not read; a new job's start replaces the link itself,
    never writing through it."""
    other = tmp_path / "other"
    start(other, 0)
    target = (other / contract.IDENTITY_FILE).read_bytes()
    run = tmp_path / "train-13"
    run.mkdir()
    (run / contract.IDENTITY_FILE).symlink_to(other / contract.IDENTITY_FILE)
    assert tracker_id(run) == path_only(run)
    (run / contract.IDENTITY_FILE).unlink()
    os.mkfifo(run / contract.IDENTITY_FILE)  # nor a FIFO (which would block a reader)
    assert tracker_id(run) == path_only(run)
    (run / contract.IDENTITY_FILE).unlink()
    (run / contract.IDENTITY_FILE).symlink_to(other / contract.IDENTITY_FILE)
    start(run, 0)
    assert not (run / contract.IDENTITY_FILE).is_symlink() and (other / contract.IDENTITY_FILE).read_bytes() == target
    assert tracker_id(run) not in (path_only(run), tracker_id(other))


@pytest.mark.parametrize("name", ["train-4242", "ünïcödé run: 50% #1?", "x" * 200, "-", "a.b.c_d"])
def test_ids_are_valid_wandb_run_ids(tmp_path, name):
    run = tmp_path / name
    run.mkdir()
    bare = tracker_id(run)
    start(run, 0)
    found = tracker_id(run)
    for one in (bare, found):
        assert one is not None and WANDB_ID.fullmatch(one) and len(one) <= 53, one
    assert bare != found and bare.split("-")[:-1] == found.split("-")[:-1]  # the directory's name, then the hash
