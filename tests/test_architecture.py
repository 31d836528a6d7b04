"""Issues 24 and 38: the package's import graph has no circle (imports inside functions and ``TYPE_CHECKING``
imports count: a type-only circle is still two modules that cannot be understood apart). The graph is read from
the source with ast, so a circle that only shows on some code path is caught too."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

from .conftest import ROOT

PACKAGE = ROOT / "clusterddp"


def _modules() -> Dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _targets(module: str, node: ast.AST, is_package: bool, known: Dict[str, Path]) -> List[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        names = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
    out = []
    for name in names:
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in known and name != module:
            out.append(name)
    return out


def _edges(module: str, path: Path, known: Dict[str, Path]) -> Set[str]:
    edges: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            edges.update(_targets(module, node, path.name == "__init__.py", known))
    return edges


def import_graph() -> Dict[str, Set[str]]:
    known = _modules()
    return {module: _edges(module, path, known) for module, path in known.items()}


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_circle():
    graph = import_graph()
    assert len(graph) > 30 and "clusterddp.contract" in graph["clusterddp.runtime.stop"]  # read at all
    found = circles(graph)
    detail = {m: sorted(w for w in graph[m] if w in c) for c in found for m in c}
    assert not found, f"import circles: {found}; edges inside them: {detail}"


# Issue 56: the login side's wings, floor by floor from the bottom; a wing imports only wings on floors below its
# own (and the shared leaves at the top of the package). The job is data at the bottom: sweeps hand it and the
# renderer a job/array.JobArray, and observe reads a run's metrics itself (observe/metrics.py), so no arrow runs up.
FLOORS = [{"job"}, {"healing"}, {"backends"}, {"observe"}, {"sweeps", "migrate", "drill", "doctor"}, {"api"},
          {"cli"}, {"__main__"}]
# Arrows up that are allowed, each with its reason.
UP_ALLOWED = {("clusterddp.job.clusters", "clusterddp.backends.registry"):
              "a [clusters.NAME] table's backend name is checked against the registry, a leaf of names"}


def wing_arrows_up(graph: Dict[str, Set[str]]) -> List[str]:
    """Every import from a wing to one on its own floor or above (less UP_ALLOWED), as "module -> module"."""
    floor = {wing: n for n, wings in enumerate(FLOORS) for wing in wings}

    def wing(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else ""

    return [f"{m} -> {t}" for m, targets in sorted(graph.items()) for t in sorted(targets)
            if wing(m) in floor and wing(t) in floor and wing(m) != wing(t)
            and floor[wing(t)] >= floor[wing(m)] and (m, t) not in UP_ALLOWED]


def test_the_wings_import_downwards_only():
    assert not wing_arrows_up(import_graph())


def test_an_arrow_up_is_found():
    graph = {"clusterddp.job.spec": {"clusterddp.sweeps.grid", "clusterddp.contract"},
             "clusterddp.observe.report": {"clusterddp.sweeps.status", "clusterddp.healing.attempts"},
             "clusterddp.sweeps.status": {"clusterddp.observe.metrics"}, "clusterddp.drill": {"clusterddp.migrate"},
             "clusterddp.job.clusters": {"clusterddp.backends.registry"}}
    assert wing_arrows_up(graph) == ["clusterddp.drill -> clusterddp.migrate",
                                     "clusterddp.job.spec -> clusterddp.sweeps.grid",
                                     "clusterddp.observe.report -> clusterddp.sweeps.status"]


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_function_level_and_relative_imports_are_edges(tmp_path):
    tree = ast.parse("def f():\n    from .. import contract\n    from .state import STATE\n")
    known = {"clusterddp.contract": Path(), "clusterddp.runtime.state": Path(), "clusterddp.runtime.stop": Path()}
    got = [t for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
           for t in _targets("clusterddp.runtime.stop", node, False, known)]
    assert got == ["clusterddp.contract", "clusterddp.runtime.state"]


def test_the_readme_exit_code_table_is_the_contracts():
    from clusterddp.contract import EXIT_CODES

    text = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    section = text.split("## Exit codes", 1)[1].split("\n#", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    assert [(int(r[0][2:]), r[1].strip("`"), r[2].rstrip(" |")) for r in rows] == [
        (e.code, e.name, e.meaning) for e in EXIT_CODES]


def test_templates_write_no_exit_number_of_their_own():
    """The templates' exit codes come from the contract's table (``exit.NAME``), not from literals."""
    import re

    for path in (ROOT / "templates").rglob("*.j2"):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert not re.search(r"\bexit [1-9]|STATUS=[1-9]", line), f"{path.name}:{number}: {line.strip()}"


def test_no_module_is_over_the_size_the_house_keeps():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")}
    assert len(sizes) > 30
    assert not {name: n for name, n in sizes.items() if n > 350}, sorted(sizes.items(), key=lambda kv: -kv[1])[:5]


def _functions():
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{path.relative_to(ROOT)}:{node.name}", node.end_lineno - node.lineno + 1


def test_no_function_is_over_sixty_lines():
    sizes = dict(_functions())
    assert len(sizes) > 300
    assert not {name: n for name, n in sizes.items() if n > 60}


def test_the_top_of_the_package_is_wings_and_shared_leaves():
    """Issue 38: at most 20 entries at the top of clusterddp/ (folders and leaf modules), and no family of modules
    grouped by a name prefix there (cli_*, sweep_*): a family is a folder."""
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    assert len(entries) <= 20, entries
    stems = [p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("__")]
    families = {s.split("_")[0] for s in stems if "_" in s}
    assert not {f: [s for s in stems if s == f or s.startswith(f + "_")] for f in families}
    for folder in [p for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"]:
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8")))
        assert doc and len(doc) > 40, f"{folder.name}/__init__.py says what the folder holds"


def _argv_heads(path: Path) -> Set[str]:
    """The first words of list literals in ``path`` (the argv lists it runs)."""
    heads = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant) \
                and isinstance(node.elts[0].value, str):
            heads.add(node.elts[0].value)
    return heads


def test_slurm_and_ssh_commands_run_in_one_place_each():
    """Slurm's commands only under backends/slurm/, ssh and rsync only under backends/ssh/; no ambient cluster
    variable (a ContextVar) anywhere on the login side."""
    slurm = {"sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo"}
    found = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        heads = _argv_heads(path)
        if heads & slurm and not rel.startswith("backends/slurm/"):
            found[rel] = sorted(heads & slurm)
        if heads & {"ssh", "rsync"} and not rel.startswith("backends/ssh/"):
            found[rel] = sorted(heads & {"ssh", "rsync"})
        if "ContextVar" in path.read_text(encoding="utf-8") and not rel.startswith("runtime/"):
            found[rel] = ["ContextVar"]
    assert not found
    assert _argv_heads(PACKAGE / "backends" / "slurm" / "commands.py") >= {"sbatch", "squeue", "scancel"}


def test_only_the_backends_ask_whether_a_cluster_is_remote():
    """Issue 56: callers ask the host what it can do (``host.files_here``), never test ``.remote`` themselves: where a
    job's files are is the backend's knowledge (the cluster table defines the field; the backends read it)."""
    found = []
    for path in _modules().values():
        rel = str(path.relative_to(PACKAGE))
        if rel.startswith("backends/") or rel == "job/clusters.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "remote":
                found.append(f"{rel}:{node.lineno}")
    assert not found


def test_no_module_imports_another_modules_private_name():
    found = []
    known = _modules()
    for module, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{module}: {alias.name}")
    assert not found


def test_every_link_of_the_readme_and_the_guides_leads_somewhere():
    """Issue 43: the README is the front door and docs/ the guides; a moved section leaves no dead link."""
    import re

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(pages) >= 18 and len((ROOT / "README.md").read_text().splitlines()) < 200
    dead = [(page.name, target) for page in pages
            for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8"))
            if not (page.parent / target).exists()]
    assert not dead, dead


def test_every_command_shown_in_the_readme_and_the_guides_is_one_the_cli_knows():
    """Issue 43: each `clusterddp ...` line of a code block in README.md and docs/ names a command (a sweep
    sub-command too) and only options that command has. The commands themselves run in the tests of their
    features (submit, migrate, drill, status, top, report, sweep, ...); this catches a guide that drifted."""
    import re
    import shlex

    import click

    from clusterddp.cli import cli

    ctx = click.Context(cli)
    checked = 0
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in page.read_text(encoding="utf-8").splitlines():
            m = re.match(r"^ {4}(?:\$ )?(clusterddp [^#]*)", line)
            if not m or ":" in m.group(1).split()[1] or "|" in m.group(1):
                continue  # output lines ("clusterddp drill: ...") and "cancel|stacks" shorthand
            words = shlex.split(m.group(1).split(";")[0].rstrip("\\ "))[1:]
            command = cli.get_command(ctx, words[0])
            assert command is not None, (page.name, line)
            if isinstance(command, click.Group):  # sweep: its sub-command, or `run` (its default)
                name = words[1] if len(words) > 1 and words[1] in command.list_commands(ctx) else "run"
                command = command.get_command(ctx, name)
            known = {o for p in command.params for o in p.opts + p.secondary_opts}
            given = [w.split("=")[0] for w in words[: words.index("--") if "--" in words else len(words)]
                     if w.startswith("-") and w != "-"]
            assert set(given) <= known, (page.name, line, sorted(set(given) - known))
            checked += 1
    assert checked >= 25, checked


# The guides' command lines that cannot run on this machine as written, and the test that runs them for real.
NOT_RUN_HERE = {
    "stacks 1234": "a running job's: test_hangs runs stacks on real hung jobs",
    "top 4242": "a Slurm job id: test_self_healing runs top JOBID on the test cluster",
    "migrate train.py --check -- --epochs 2": "4 ranks: test_migrate runs the README's migrate --check",
    "submit --cluster hpc --nodes 2 --gpus 8 train.py --wait -- --epochs 10": "over SSH: test_remote",
    "status": "the jobs of every cluster: test_remote",
    "logs 12345 --rank 3 -f": "a remote job's: test_remote",
    "cancel|stacks 12345; clusterddp doctor --cluster hpc ...": "remote: test_remote",
    "sweep status lr-search --sort loss": "a submitted sweep's: test_sweep",
    "sweep lr-search --rerun failed": "a submitted sweep's: test_sweep",
}


def guide_lines() -> list:
    """Every `clusterddp ...` line of a code block in docs/ (continuation lines joined; comments cut)."""
    import re

    found = []
    for page in sorted((Path(__file__).parent.parent / "docs").glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"^ {4}(?:\$ )?clusterddp ([^#]*)", line)
            if not m or m.group(1).split()[0].endswith(":"):
                continue  # output ("clusterddp drill: ...")
            text, j = m.group(1).rstrip(), i
            while text.endswith("\\"):
                j += 1
                text = text[:-1].rstrip() + " " + lines[j].strip()
            found.append((page.name, text.strip()))
    return found


def test_every_guide_command_runs_here_or_names_the_test_that_runs_it(tmp_path, monkeypatch):
    """Issue 43: each command line of docs/ runs here as written (a Slurm submission as --dry-run: no cluster with
    GPUs here), on a DataParallel train.py, or is in NOT_RUN_HERE with the test that runs it for real. (Here, not in
    test_cli.py: migrate needs its extra, which the lowest-versions run of test_cli.py does not install.)"""
    import shlex
    import shutil

    from clusterddp.cli import cli

    from .conftest import cli_runner

    shutil.copy(Path(__file__).parent / "scripts" / "migrate" / "dp_train.py", tmp_path / "train.py")
    (tmp_path / "main.py").write_text("print('main')\n")
    monkeypatch.chdir(tmp_path)
    ran, runner = [], cli_runner()
    for page, line in guide_lines():
        if line in NOT_RUN_HERE:
            continue
        words = shlex.split(line)
        if words[0] in ("submit", "sweep") and "--dry-run" not in words:
            words.insert(1, "--dry-run")
        result = runner.invoke(cli, words, catch_exceptions=False)
        assert result.exit_code == 0, (page, line, result.output)
        if "--dry-run" in words:  # the script printed, as sbatch would get it
            assert result.stdout.startswith("#!/bin/bash\n#SBATCH ") and "nothing submitted" in result.output, line
        ran.append(line)
    assert len(ran) == 8 and {w.split()[0] for w in ran} == {"submit", "migrate", "sweep"}, ran
    assert {line for _, line in guide_lines()} >= set(NOT_RUN_HERE)  # no stale entry
    assert (tmp_path / "train_ddp.py").is_file() and (tmp_path / "ddp.py").is_file()


# Issue 75: the project holds only code written for it. What another project's file carries at its top when it is
# copied: a licence tag, a copyright line, a licence's own sentences. The words are split so that this file does not
# match itself.
FOREIGN = [
    "SPDX-" + "License-Identifier", "Licensed " + "under the", "Copy" + "right (c)", r"Copy" + r"right \d{4}",
    "All rights " + "reserved", "Permission is " + "hereby granted", "GNU General " + "Public License",
    "THE SOFTWARE IS " + "PROVIDED", r"byte[- ]for[- ]byte " + "cop",
]


def foreign_marks(text: str) -> list:
    """The marks of a copied file in ``text``: each pattern of FOREIGN found, case aside."""
    import re

    return [p for p in FOREIGN if re.search(p, text, re.IGNORECASE)]


def test_no_file_in_the_tree_carries_another_project_s_licence_or_copyright():
    import subprocess

    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    found = {}
    for name in filter(None, files):
        path = ROOT / name.decode()
        if path.is_file() and path.stat().st_size < 2_000_000:
            marks = foreign_marks(path.read_text(errors="replace"))
            if marks:
                found[name.decode()] = marks
    assert not found, found
    assert len([f for f in files if f.startswith(b"tests/")]) > 50  # the listing saw the tests


def test_the_copied_file_finder_finds_a_copied_header():
    header = "# " + "Copy" + "right 2019 Someone Else. All rights " + "reserved.\n# " + "Licensed " + \
             "under the Apache License, Version 2.0\n"
    assert len(foreign_marks(header + "import torch\n")) == 3
    assert foreign_marks("# a DataParallel script in the shape of a published one\n") == []
