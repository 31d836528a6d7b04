"""clusterddp explain: the job as it will be, before the queue."""
from click.testing import CliRunner

from clusterddp import JobSpec
from clusterddp.cli import cli
from clusterddp.job.explain import explain


def test_explain_cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    r = CliRunner().invoke(cli, ["explain", "--nodes", "6", "--gpus", "8", "--time", "2:00:00", "train.py", "--",
                                 "--batch-size", "32"])
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "world size = 6 node(s) x 8 GPU(s) per node = 48 ranks" in out
    assert "  5       40-47           0-7" in out and "  ...\n" in out.replace("...     \n", "...\n")
    assert "global batch is 32 x 48 = 1536" in out and "1 CPU per rank" in out
    assert "MASTER_PORT  20000 + job id mod 10000" in out and "CLUSTERDDP_STOP_FILE" in out
    assert not (tmp_path / "clusterddp-runs").exists()


def test_explain_per_launcher_and_warnings():
    srun = explain(JobSpec("t.py", nodes=2, gpus_per_node=4, launcher="srun", cpus_per_task=8))
    assert "Slurm tasks: 4 per node (one per rank), 8 CPUs each" in srun and "SLURM_PROCID" in srun
    assert "1 CPU per rank" not in srun and "no --time" in srun
    spawn = explain(JobSpec("t.py", nodes=2, gpus_per_node=2, launcher="spawn"))
    assert "spawn launcher without placeholders" in spawn and "Slurm tasks: 1 per node" in spawn
    cpu = explain(JobSpec("t.py", nodes=1, procs_per_node=1, master_port=29500, args=("--x", "{master_addr}")))
    assert "world size 1" in cpu and "MASTER_PORT  29500 (--master-port" in cpu
    assert "filled in only by the spawn launcher" in cpu and "none (CPU, gloo)" in cpu
    assert "gpus-per-task" not in cpu
    narrow = explain(JobSpec("t.py", nodes=1, gpus_per_node=2, launcher="srun", gpu_request="gpus-per-task"))
    assert "each sees it as device 0" in narrow


def test_explain_says_which_requeue_a_node_fault_takes_and_expedite_needs_a_requeue(tmp_path, monkeypatch):
    """Issue 39 (item 5): explain names the path of a requeue after a node fault; --expedite without a requeue is a
    usage error that says how to turn requeue on."""
    for expedite, said in ((None, "expedited, starting again at once, where the cluster allows it"),
                           (True, "an expedited requeue: it starts again at once"),
                           (False, "after Slurm's requeue delay, 120 s by default")):
        assert said in explain(JobSpec("t.py", nodes=2, time="1:00:00", expedite=expedite))
    assert "expedite" not in explain(JobSpec("t.py", nodes=2))  # no requeue, no requeue path
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    r = CliRunner().invoke(cli, ["submit", "--dry-run", "--expedite", "train.py"])
    assert r.exit_code == 2 and "expedite (an expedited requeue) needs the job to requeue: give --time" in r.output
    assert "Traceback" not in r.output
    r = CliRunner().invoke(cli, ["submit", "--dry-run", "--time", "30", "--expedite", "train.py"])
    assert r.exit_code == 0 and "#SBATCH --requeue=expedite\n" in r.stdout, r.output


def test_a_dataparallel_script_not_migrated_is_warned_of_and_a_ddp_one_is_not(tmp_path, monkeypatch):
    """(The practitioner review: submit and explain said nothing of nn.DataParallel, which each rank would run over
    the GPUs it sees, on the whole data set.) The warning names migrate; a migrated or DDP script gets none."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dp.py").write_text("import torch.nn as nn\nmodel = nn.DataParallel(nn.Linear(4, 1))\n")
    (tmp_path / "ddp.py").write_text("from torch.nn.parallel import DistributedDataParallel as DDP\n"
                                     "# not nn.DataParallel(model): one process per GPU\nmodel = DDP(model)\n")
    (tmp_path / "ours.py").write_text("from clusterddp import runtime\nmodel = runtime.wrap(model)\n")
    for command in (["explain"], ["submit", "--dry-run"]):
        r = CliRunner().invoke(cli, [*command, "--nodes", "2", "--gpus", "4", "dp.py"])
        assert r.exit_code == 0 and "clusterddp: warning: dp.py uses nn.DataParallel and no DDP" in r.stderr, r.output
        assert "clusterddp migrate dp.py rewrites it" in r.stderr
        for fine in ("ddp.py", "ours.py"):
            r = CliRunner().invoke(cli, [*command, "--nodes", "2", "--gpus", "4", fine])
            assert r.exit_code == 0 and "DataParallel" not in r.stderr, r.output
