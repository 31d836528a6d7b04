"""Golden sbatch files (plain text, reviewable diffs), `bash -n` on every render, template lookup."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from clusterddp import JobSpec, TemplateError, __version__
from clusterddp.backends.slurm.script import available_templates, render

from .cases import CASES

GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = Path(__file__).parent.parent / "examples"

def bash_n(text: str) -> None:
    proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def masked(text: str) -> str:
    """The version is masked in golden files, so that a release does not rewrite them all."""
    return text.replace(f"Rendered by clusterddp {__version__}:", "Rendered by clusterddp <version>:")


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name, request):
    raw = render(CASES[name])
    bash_n(raw)
    assert "<version>" not in raw and f"clusterddp {__version__}:" in raw
    text = masked(raw)
    path = GOLDEN / f"{name}.sh"
    if request.config.getoption("--update-golden"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run pytest --update-golden and review the diff"
    assert text == path.read_text(), f"{name} differs from {path}; if intended: pytest --update-golden"


def test_two_nodes_eight_gpus_render():
    """2 nodes, 8 GPUs per node: 16 ranks, user arguments unchanged."""
    text = render(CASES["torchrun"])
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --gpus-per-node=8\n" in text
    assert "--nnodes=2 --nproc-per-node=8" in text and "world size 16" in text
    assert "train.py --epochs 10 --lr 0.1 &\n" in text


@pytest.mark.parametrize("launcher", ["torchrun", "srun", "spawn"])
@pytest.mark.parametrize("gpus,procs", [(0, None), (0, 3), (1, None), (8, None)])
def test_every_launcher_renders_valid_bash(launcher, gpus, procs):
    spec = JobSpec("t.py", nodes=3, gpus_per_node=gpus, procs_per_node=procs, launcher=launcher, cpus_per_task=2)
    text = render(spec)
    bash_n(text)
    assert f"world size {spec.world_size}" in text
    assert '--cpus-per-task="$SLURM_CPUS_PER_TASK"' in text  # Slurm 22.05 does not pass it on to srun


def test_hostile_directives_stay_on_their_line():
    text = render(CASES["hostile"])
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert '#SBATCH --job-name="x\\" --partition=evil # \\\\ $(id) `id` ;"' in directives
    assert '#SBATCH --partition="a b"' in directives
    assert '#SBATCH --output="runs dir/100%%/x_--partition_evil_id_id-%j.out"' in directives


def test_user_template_dir_first(tmp_path, monkeypatch):
    site = EXAMPLES / "site-templates"
    text = render(CASES["torchrun"], template_dirs=[str(site)])
    assert "NCCL_SOCKET_IFNAME" in text and "-m clusterddp.runtime.agent --nnodes=2" in text
    bash_n(text)
    # The same through the environment variable.
    monkeypatch.setenv("CLUSTERDDP_TEMPLATE_DIR", str(site))
    assert render(CASES["torchrun"]) == text
    # A template of one's own, by name.
    (tmp_path / "mine.sh.j2").write_text('{% extends "srun.sh.j2" %}{% block setup %}echo mine{% endblock %}')
    monkeypatch.delenv("CLUSTERDDP_TEMPLATE_DIR")
    mine = render(CASES["srun"].replace(template="mine"), template_dirs=[str(tmp_path)])
    assert "echo mine" in mine and "mine" in available_templates([str(tmp_path)])


def test_unknown_template_lists_the_available_ones():
    with pytest.raises(TemplateError, match="unknown template 'nope'.*available templates are spawn, srun, torchrun"):
        render(CASES["torchrun"], template="nope")


def test_template_with_undefined_value_is_an_error(tmp_path):
    (tmp_path / "bad.sh.j2").write_text("{{ no_such_value }}\n")
    with pytest.raises(TemplateError, match="undefined"):
        render(CASES["torchrun"], template="bad", template_dirs=[str(tmp_path)])


def test_missing_template_dir(tmp_path):
    with pytest.raises(TemplateError, match="does not exist"):
        render(CASES["torchrun"], template_dirs=[str(tmp_path / "nope")])


RANK_THAT_STOPS = r'''
import os, pathlib, signal, sys, time
# scontrol answered MASTER_ADDR's hostnames; now it is gone from where the batch script runs (the README's "a
# container?"). The batch shell is this rank's parent (stand-in srun and the launcher line exec).
os.unlink(sys.argv[1])
os.kill(os.getppid(), signal.SIGUSR2)  # the time-limit warning, as Slurm sends it to the batch shell
stop = pathlib.Path(os.environ["CLUSTERDDP_STOP_FILE"])
deadline = time.monotonic() + 30
while not stop.exists() and time.monotonic() < deadline:
    time.sleep(0.1)
print("checkpointed and stopped" if stop.exists() else "never asked to stop", flush=True)
'''


def test_a_requeue_without_scontrol_says_so_and_exits_76(tmp_path):
    """README, "Time limits": if scontrol is missing where the batch script runs when the job should requeue, it
    says so and exits 76 (NO_SCONTROL) instead of pretending to requeue. The rendered script under bash, with the
    stand-in srun and a stand-in scontrol that the rank removes before the time-limit signal."""
    import os
    import shutil
    import sys

    from clusterddp.contract import EXIT

    from .cases import STANDINS

    own = tmp_path / "bin"  # this test's own scontrol, so that removing it touches nothing shared
    own.mkdir()
    shutil.copy(STANDINS / "scontrol", own / "scontrol")
    (tmp_path / "rank.py").write_text(RANK_THAT_STOPS)
    script = tmp_path / "job.sh"
    script.write_text(render(JobSpec("rank.py", launcher="srun", time="10", stop_grace=5, python=sys.executable,
                                     args=(str(own / "scontrol"),))))
    shutil.copy(STANDINS / "srun", own / "srun")
    tools = tmp_path / "tools"  # the system's commands, less a real scontrol (this machine may have Slurm)
    tools.mkdir()
    for d in reversed(os.environ["PATH"].split(os.pathsep)):
        for tool in (Path(d).iterdir() if d and Path(d).is_dir() else ()):
            if tool.name not in ("scontrol", "srun"):
                (tools / tool.name).unlink(missing_ok=True)
                (tools / tool.name).symlink_to(tool)
    env = dict(os.environ, PATH=f"{own}:{tools}", SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="node[1-2]",
               PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert not (own / "scontrol").exists()
    assert proc.returncode == EXIT["NO_SCONTROL"] == 76, proc.stdout + proc.stderr
    rank_log = tmp_path / "clusterddp-runs" / "rank-4242" / "rank-0.out"
    assert rank_log.read_text().strip() == "checkpointed and stopped", rank_log.read_text()
    assert ("clusterddp: scontrol is not available where this job runs (a container?): cannot requeue; the last "
            "checkpoint is kept") in proc.stderr, proc.stderr
