"""The contract between the batch script and the ranks is defined once (clusterddp/contract.py): the templates'
readable literals, the local backend, the Python API and the runtime all agree with it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from clusterddp import JobSpec, contract
from clusterddp.api import setup_lines
from clusterddp.backends.local.plan import make_plan
from clusterddp.backends.record import JobRecord
from clusterddp.backends.slurm.script import render

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "templates"
RUNTIME = ROOT / "clusterddp" / "runtime"


def exported(text: str) -> set:
    names = set()
    for line in text.splitlines():
        m = re.match(r"\s*export ([A-Z_][A-Z0-9_]*)=", line)
        if m:
            names.add(m.group(1))
        m = re.match(r"\s*export (CLUSTERDDP_[A-Z_]+(?:=\S*)?(?: CLUSTERDDP_[A-Z_]+=\S*)*)$", line)
        if m:
            names |= {part.split("=")[0] for part in m.group(1).split()}
    return {n for n in names if n.startswith("CLUSTERDDP_")}


@pytest.mark.parametrize("launcher", ["torchrun", "srun", "spawn"])
def test_the_script_exports_the_contract(launcher):
    plain = exported(render(JobSpec("t.py", launcher=launcher)))
    assert plain == set(contract.EXPORTED)
    requeuing = exported(render(JobSpec("t.py", launcher=launcher, time="30")))
    assert requeuing == set(contract.EXPORTED) | {contract.STOP_FILE}


def test_the_local_backend_and_the_api_set_the_same_names(tmp_path):
    plan = make_plan(JobSpec("t.py", nodes=2, procs_per_node=2), str(tmp_path), 29500, 1, [])
    local = {name for name, _ in plan.common if name.startswith("CLUSTERDDP_")}
    assert local == set(contract.EXPORTED) | {contract.STOP_FILE, contract.LOCAL}
    api = exported("\n".join(setup_lines(JobSpec(launcher="srun"))))
    assert api == set(contract.EXPORTED) - {contract.RUN_DIR}  # submitit jobs keep their own folder


def test_the_runtime_reads_names_only_through_the_contract():
    for path in sorted(RUNTIME.glob("*.py")):
        code = re.sub(r'"""[\s\S]*?"""', "", path.read_text())  # docstrings may name variables
        code = "\n".join(line.split("#")[0] for line in code.splitlines())
        literals = re.findall(r"""["']CLUSTERDDP_[A-Z_]+["']""", code)
        assert not literals, f"{path.name} spells {literals}: use clusterddp.contract"


def test_spawn_placeholders_match():
    text = (TEMPLATES / "spawn.sh.j2").read_text()
    pairs = dict(re.findall(r'a="\$\{a//\\\{(\w+)\\\}/"\$(\w+)"\}"', text))
    assert pairs == contract.PLACEHOLDERS
    values = {name: f"<{name}>" for name in contract.PLACEHOLDERS}
    filled = contract.fill_placeholders("{master_addr}:{master_port}{{nnodes}}", values)
    assert filled == "<master_addr>:<master_port>{<nnodes>}"
    assert contract.fill_placeholders("{node_rank}", {**values, "node_rank": "{world_size}"}) == "{world_size}"


def test_log_and_stop_file_names_match():
    srun = render(JobSpec("t.py", launcher="srun", time="30"))
    torchrun = render(JobSpec("t.py", launcher="torchrun"))
    assert f'--output="${{RUN_DIR//%/%%}}/{contract.RANK_LOG_PATTERN}"' in srun
    assert f'--output="${{RUN_DIR//%/%%}}/{contract.NODE_LOG_PATTERN}"' in torchrun
    assert f'"$RUN_DIR/{contract.STOP_FILE_NAME.format(restarts="$CLUSTERDDP_RESTARTS")}"' in srun
    stem = JobSpec("t.py").file_stem
    assert f"#SBATCH --output=clusterddp-runs/{contract.batch_log(stem, '%j')}" in srun
    assert f'RUN_DIR=clusterddp-runs/{contract.run_dir(stem, "")}"$SLURM_JOB_ID"' in srun
    record = JobRecord("1", "s", "b", "/r", "torchrun", 2, 2)
    assert record.rank_log(3) == (Path("/r") / contract.NODE_LOG.format(node=1),
                                  contract.TORCHRUN_PREFIX.format(local_rank=1))
    assert JobRecord("1", "s", "b", "/r", "srun", 2, 2).rank_log(3)[0] == Path("/r") / contract.RANK_LOG.format(rank=3)


def test_port_scheme_matches():
    text = render(JobSpec("t.py"))
    assert f"MASTER_PORT=$(( {contract.PORT_BASE} + 10#$SLURM_JOB_ID % {contract.PORT_SPAN} ))" in text
    assert list(contract.port_candidates(contract.PORT_BASE + contract.PORT_SPAN - 1))[:2] == [
        contract.PORT_BASE + contract.PORT_SPAN - 1, contract.PORT_BASE]


def test_parent_job_variables_are_dropped_by_one_rule():
    import clusterddp.backends.hosts as hosts

    environ = {"SLURM_JOB_ID": "1", "SLURM_CONF": "/etc/slurm.conf", "SBATCH_PARTITION": "x", "SRUN_CPUS": "1",
               "HOME": "/h"}
    assert contract.without_parent_job(environ) == {"SLURM_CONF": "/etc/slurm.conf", "HOME": "/h"}
    import inspect

    import clusterddp.backends.local.run as local_run

    for module in (hosts, local_run):
        assert "without_parent_job" in inspect.getsource(module)
        assert 'startswith(("SLURM_"' not in inspect.getsource(module)


def test_the_job_side_imports_only_the_shared_modules():
    """clusterddp/runtime/ is the job side: its imports are torch, the standard library, itself, and five
    shared modules (errors, hostlist, contract, rollcall, datafiles); never click, jinja2, submitit or a login-side
    module."""
    import ast
    import subprocess
    import sys

    allowed = {"errors", "hostlist", "contract", "rollcall", "datafiles"}
    shared = RUNTIME.parent / "rollcall.py"  # shared by both sides: it may import only the contract
    assert {n.module for n in ast.walk(ast.parse(shared.read_text())) if isinstance(n, ast.ImportFrom)
            and n.level} == {None}, "rollcall.py imports more than clusterddp.contract"
    assert "from . import contract" in shared.read_text()
    for path in sorted(RUNTIME.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 2:
                names = [node.module] if node.module else [a.name for a in node.names]
                assert set(names) <= allowed, f"{path.name} imports clusterddp.{names}"
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert not node.module.startswith(("clusterddp", "click", "jinja2", "submitit")), path.name
            if isinstance(node, ast.Import):
                assert not [a.name for a in node.names if a.name.split(".")[0] in
                            ("clusterddp", "click", "jinja2", "submitit")], path.name
    code = "import clusterddp.runtime, sys; print('\\n'.join(sys.modules))"
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              cwd=ROOT).stdout.split())
    ours = {m for m in mods if m.startswith("clusterddp")}
    assert ours <= {"clusterddp", "clusterddp.errors", "clusterddp.hostlist", "clusterddp.contract",
                    "clusterddp.rollcall", "clusterddp.datafiles", "clusterddp.version"} | {
        m for m in ours if m.startswith("clusterddp.runtime")}, ours
    assert not {"click", "jinja2", "submitit", "torch"} & mods  # torch too: it loads on first use
