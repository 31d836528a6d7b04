"""Case tables shared by the tests (one module, imported where needed): the golden job specs, hostile values,
and a runner for rendered scripts under stand-in launchers."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from clusterddp import JobSpec
from clusterddp.sweeps.grid import job_array, parse_grids, trials

# A sweep's array (values a shell would misread among them), its keys from a fixed stand-in for the code's hash.
_SWEEP_ARGS = ("--lr", "{lr}", "--name=run-{tag}-{lr}")
_SWEEP = job_array("lr-search", trials(parse_grids(["lr=0.1,1e-3", "tag=it's,$(id) x"]), {"code": "0" * 16}),
                   _SWEEP_ARGS)

HERE = Path(__file__).parent
STANDINS = HERE / "standins"
ROOT = HERE.parent

HOSTILE_ARGS = ("--name", "it's a \"test\"", "$(touch pwned)", "`touch pwned`", "a;b|c&d", "line1\nline2",
                "back\\slash", "ümlaut ✓", "*", "~", "", "--", "{master_addr}")

# name -> spec: one per launcher, plus the options that change the rendering.
CASES = {
    "torchrun": JobSpec("train.py", args=("--epochs", "10", "--lr", "0.1"), nodes=2, gpus_per_node=8),
    "srun": JobSpec("train.py", args=("--epochs", "10"), nodes=2, gpus_per_node=4, launcher="srun",
                    cpus_per_task=8, mem="64G", time="1-12:00", partition="gpu", account="proj42", qos="normal"),
    "spawn": JobSpec("main.py", args=("--dist-url", "tcp://{master_addr}:{master_port}", "--world-size", "{nnodes}",
                                      "--rank", "{node_rank}", "--multiprocessing-distributed"),
                     nodes=2, gpus_per_node=8, launcher="spawn"),
    "cpu": JobSpec("train.py", nodes=2, procs_per_node=4, cpus_per_task=2, exclusive=True, constraint="skylake"),
    "gres_module": JobSpec("mypkg.train", module=True, nodes=4, gpus_per_node=2, gpu_request="gres",
                           setup=("module load cuda/12", "source ~/venv/bin/activate"), env=(("NCCL_DEBUG", "INFO"),),
                           sbatch_args=("--mail-type=END", "--no-kill"), master_port=29400, time="30"),
    "gpus_per_task": JobSpec("train.py", nodes=2, gpus_per_node=4, launcher="srun", gpu_request="gpus-per-task"),
    "pyxis": JobSpec("train.py", nodes=2, gpus_per_node=4, container_image="nvcr.io#nvidia/pytorch:24.05-py3",
                     array="0-3%2", after=("1234",)),
    "apptainer_srun": JobSpec("train.py", nodes=2, gpus_per_node=2, launcher="srun", apptainer="/images/my torch.sif"),
    "spares": JobSpec("train.py", nodes=2, spare_nodes=1, retries=3, gpus_per_node=2, launcher="srun", time="4:00:00",
                      expedite=True),
    "sweep": JobSpec("train.py", args=_SWEEP_ARGS, nodes=2, gpus_per_node=4,
                     output_dir="clusterddp-runs/sweep-lr-search", sweep=_SWEEP, array=_SWEEP.indices(2)),
    "hostile": JobSpec("my script.py", args=HOSTILE_ARGS, nodes=2, gpus_per_node=2,
                       job_name='x" --partition=evil # \\ $(id) `id` ;', output_dir="runs dir/100%",
                       partition="a b", env=(("WEIRD", "$(id) `id` 'q' \"dq\" \\ \n end"),),
                       sbatch_args=("--comment=has # hash and \"quotes\"",)),
}


#: Hostile values for every user-settable field and source (tests/test_security*.py).
CORPUS = [
    "'", '"', "it's \"q\"", "$(touch pwned)", "`touch pwned`", "a;touch pwned", "a|b&c", "#", "# x", "x #c",
    "%j %x %%", "%1", "\n", "x\n#PBS -N evil -o /tmp/evil-pbs #", "x\r\n#BSUB -J evil", "cr\r", "\t", "tab\there",
    "\0", "nul\0x", "ümlaut ✓", "\u202eRTL override", "\u2028sep", "-x", "--wrap=touch pwned;echo ", "--", "~",
    "~root/x", "{master_addr}", "{{ 7*7 }}", "{% raw %}", "x" * 100_000, "", " ", "\\", "\\n", "$'x'", "!!",
    "*", "a=b", "PWD[$(touch pwned)]", "\x7f", "\x1b[31mred", "/../..",
]


def has_control(value: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in value)


def run_rendered(spec, tmp: Path, env_names=(), extra_env=None, expect_ok: bool = True):
    """Run ``render(spec)`` under bash with stand-in srun/torchrun/scontrol and a fake Slurm environment; the
    recorder script (tests/scripts/record_argv.py) writes what arrived. Returns the record (or the process)."""
    from clusterddp.backends.slurm.script import render

    script = tmp / "job.sh"
    script.write_bytes(render(spec).encode("utf-8", "surrogateescape"))
    record = tmp / "record.json"
    if record.exists():
        record.unlink()
    env = dict(os.environ, PATH=f"{STANDINS}:{os.environ['PATH']}", SLURM_JOB_ID="4242",
               SLURM_JOB_NODELIST="node[1-2]", RECORD_FILE=str(record), RECORD_ENV_NAMES=json.dumps(list(env_names)),
               PYTHONPATH=str(ROOT))
    env.update(extra_env or {})
    proc = subprocess.run(["bash", str(script)], cwd=tmp, env=env, capture_output=True, text=True, timeout=60)
    assert not (tmp / "pwned").exists(), "a user value was executed"
    if not expect_ok:
        return proc
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(record.read_text(encoding="utf-8"))
