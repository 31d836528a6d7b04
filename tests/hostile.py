"""Hostile values shared by the security tests (one table, imported where needed)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).parent
STANDINS = HERE / "standins"
ROOT = HERE.parent

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
    from clusterddp.render import render

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
