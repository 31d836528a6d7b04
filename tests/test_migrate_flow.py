"""Issue 54: a migration never puts a collective where only some ranks get. Checked three ways: a walker written
apart from the rewrite (plain `ast`, its own simpler idea of a per-rank value) over every migrated test script;
one construct at a time; and a script whose decisions really differ by rank, migrated and run as 4 ranks."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Set

import pytest

from clusterddp.migrate import migrate_source
from clusterddp.migrate.rules import report

from .conftest import SCRIPTS, run_cli
from .test_migrate import CASES

#: what waits for every rank (save_on_main unless told wait=False)
COLLECTIVES = {"all_reduce_mean", "barrier", "wrap", "save_on_main", "all_reduce", "broadcast"}


def _per_rank(tree: ast.AST) -> Set[str]:
    """Names that may differ by rank: a batch a loop yields (not a range's counter, not enumerate's index), and
    what is computed from one: anything assigned from an expression using such a name or calling ``.item()``,
    and what the script's functions return from them."""
    names: Set[str] = set()
    defs = {d.name: d for d in ast.walk(tree) if isinstance(d, ast.FunctionDef)}

    def uses(expr: ast.AST) -> bool:
        for node in ast.walk(expr):
            if isinstance(node, ast.Name) and node.id in names:
                return True
            if isinstance(node, ast.Attribute) and node.attr == "item":
                return True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defs and any(
                    r.value is not None and uses(r.value) for r in ast.walk(defs[node.func.id])
                    if isinstance(r, ast.Return)):
                return True
        return False

    def target_names(t: ast.AST) -> Set[str]:
        return {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}

    for _ in range(10):
        before = len(names)
        for node in ast.walk(tree):
            if isinstance(node, ast.For):
                it = node.iter
                if isinstance(it, ast.Call) and getattr(it.func, "id", "") == "range":
                    continue
                if isinstance(it, ast.Call) and getattr(it.func, "id", "") == "enumerate" and \
                        isinstance(node.target, ast.Tuple):
                    names |= target_names(node.target.elts[1])
                else:
                    names |= target_names(node.target)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None and \
                    uses(node.value):
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    names |= target_names(t)
        if len(names) == before:
            return names
    return names


def collectives_under_rank_tests(text: str) -> list:
    """(line, test) for every collective of the runtime that runs under an if/while whose test uses a per-rank
    value, in an except handler, or in a function called from such a place."""
    tree = ast.parse(text)
    names = _per_rank(tree)
    found = []
    apart_functions: Set[str] = set()

    def varies(test: ast.AST, shared: frozenset) -> bool:
        return any(isinstance(n, ast.Name) and n.id in names and n.id not in shared for n in ast.walk(test)) or \
            any(isinstance(n, ast.Attribute) and n.attr == "item" for n in ast.walk(test))

    def averaged(value: ast.AST) -> bool:
        """runtime.all_reduce_mean(...): a value every rank shares."""
        return isinstance(value, ast.Call) and getattr(value.func, "attr", getattr(value.func, "id", "")) == \
            "all_reduce_mean"

    def visit(node: ast.AST, apart: str, shared: frozenset = frozenset()) -> None:
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            waits = not any(k.arg == "wait" and isinstance(k.value, ast.Constant) and k.value.value is False
                            for k in node.keywords)
            if apart and name in COLLECTIVES and waits:
                found.append((node.lineno, apart))
            if apart and name not in apart_functions and any(
                    isinstance(d, ast.FunctionDef) and d.name == name for d in ast.walk(tree)):
                apart_functions.add(name)
        if isinstance(node, (ast.If, ast.While)) and not apart and varies(node.test, shared):
            apart = ast.unparse(node.test)
        if isinstance(node, ast.ExceptHandler):
            apart = apart or "except"
        if isinstance(node, ast.FunctionDef):
            apart = f"called under a per-rank test: {node.name}" if node.name in apart_functions else ""
            shared = frozenset()
        for _, value in ast.iter_fields(node):
            if isinstance(value, ast.AST):
                visit(value, apart, shared)
            elif isinstance(value, list):  # a block, in order: a name just averaged is shared until set again
                now = set(shared)
                for child in value:
                    if isinstance(child, ast.AST):
                        visit(child, apart, frozenset(now))
                    if isinstance(child, ast.Assign) and len(child.targets) == 1 and \
                            isinstance(child.targets[0], ast.Name):
                        (now.add if averaged(child.value) else now.discard)(child.targets[0].id)

    for _ in range(3):  # functions first seen called apart: once more
        found.clear()
        visit(tree, "")
    return found


def test_the_walker_finds_what_a_naive_rewrite_would_do():
    """The walker itself can fail: the naive rewrite (every print averaged, every save waiting) is caught."""
    naive = ("for x, y in loader:\n    loss = f(x, y)\n    if loss.item() > 1:\n"
             "        runtime.print0(runtime.all_reduce_mean(loss).item())\n"
             "def keep(m):\n    runtime.save_on_main(m, 'p')\nv = score(loader)\nif v < 3:\n    keep(m)\n"
             "def score(l):\n    t = 0\n    for b in l:\n        t += b.item()\n    return t\n")
    assert [line for line, _ in collectives_under_rank_tests(naive)] == [4, 6]


@pytest.mark.parametrize("case", CASES + [SCRIPTS / "migrate" / "dp_rank_branches.py"],
                         ids=[c.name for c in CASES] + ["dp_rank_branches.py"])
def test_no_migrated_script_has_a_collective_under_a_per_rank_test(case):
    m = migrate_source(case.read_text(), case.name)
    assert m.text is not None, m.left_alone
    assert collectives_under_rank_tests(m.text) == []


HEAD = "import torch\nimport torch.nn as nn\nmodel = nn.DataParallel(net)\n"
LOOP = "for i, (x, y) in enumerate(loader):\n    loss = crit(model(x), y)\n"


@pytest.mark.parametrize("body, kept, listed", [
    # a print on a shared counter: averaged (every rank is there)
    (LOOP + "    if i % 10 == 0:\n        print(loss.item())\n", "runtime.print0(runtime.all_reduce_mean(loss).item())",
     None),
    # a print on the rank's own loss: rank 0 alone, not averaged
    (LOOP + "    if loss.item() > 2:\n        print(loss.item())\n", "runtime.print0(loss.item())", None),
    # best-model saving on a metric of the rank's own: rank 0 saves without waiting, and it is listed
    (LOOP + "    if loss.item() < best:\n        torch.save(model.state_dict(), 'b.pt')\n",
     "runtime.save_on_main(model.state_dict(), 'b.pt', wait=False)", "rank 0 saves when its own values"),
    # the same through a helper of the script's
    ("def keep(m):\n    torch.save(m.state_dict(), 'b.pt')\n" + LOOP
     + "    if loss.item() < best:\n        keep(model)\n",
     "runtime.save_on_main(m.state_dict(), 'b.pt', wait=False)", "rank 0 saves when its own values"),
    # in an except handler: only the ranks that raised are there
    ("try:\n    run()\nexcept RuntimeError:\n    torch.save(model.state_dict(), 'crash.pt')\n",
     "runtime.save_on_main(model.state_dict(), 'crash.pt', wait=False)", "rank 0 saves when its own values"),
    # early stopping on the rank's own loss: the ranks leave the loop apart; DDP's backward would hang: listed
    (LOOP + "    loss.backward()\n    if loss.item() < 0.01:\n        break\n", "break", "leave or skip this loop"),
    # a NaN batch skipped by one rank: the same
    (LOOP + "    if torch.isnan(loss):\n        continue\n    loss.backward()\n", "continue",
     "leave or skip this loop"),
    # a backward only some ranks run
    (LOOP + "    if loss.item() > 0:\n        loss.backward()\n", "loss.backward()", "a backward that only some"),
    # a while loop on the rank's own value
    ("while err > 0.1:\n    err = crit(model(x), y)\n    err.backward()\n    print(err.item())\n",
     "runtime.print0(err.item())", "leave or skip this loop"),
    # a save after the loop: every rank gets there: it waits
    (LOOP + "torch.save(model.state_dict(), 'end.pt')\n", "runtime.save_on_main(model.state_dict(), 'end.pt')\n",
     None),
    # a condition on the arguments is the same everywhere
    ("if args.save:\n    torch.save(model.state_dict(), 'a.pt')\n",
     "runtime.save_on_main(model.state_dict(), 'a.pt')\n", None),
])
def test_each_control_construct(body, kept, listed):
    m = migrate_source(HEAD + body, "c.py")
    assert kept in m.text, m.text
    said = [what for _, what in m.findings if listed and listed in what]
    assert (len(said) == 1) if listed else not any("leave or skip" in w or "rank 0 saves" in w for _, w in m.findings)
    if listed:
        assert any(line.startswith("c.py:") and listed in line for line in report(m, "c.py", False))


@pytest.mark.ranks
def test_a_script_whose_decisions_differ_by_rank_runs_to_the_end_as_four_ranks(tmp_path):
    """The known right answer: migrated, dp_rank_branches.py finishes (a barrier or an average under its per-rank
    tests would hang it at the second epoch); rank 0 saved its best and the final model."""
    script = tmp_path / "branches.py"
    script.write_text((SCRIPTS / "migrate" / "dp_rank_branches.py").read_text())
    proc = run_cli("migrate", "branches.py", "--check", "--check-steps", "4", "--", "--epochs", "4", "--out",
                   str(tmp_path / "out"), cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"check: .*trained", proc.stderr), proc.stderr
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"best.pt", "best-again.pt", "final.pt"}
    assert Path(tmp_path / "branches_ddp.py").exists()


@pytest.mark.parametrize("body, averaged", [
    # the plain intent: keep the best score; each rank scored its own share, so the decision is made on the average
    (LOOP + "    here = loss.item()\n    if here < best:\n        best = here\n        torch.save(model, 'b.pt')\n",
     True),
    (LOOP + "    acc = score(model)\n    if acc >= best_acc:\n        best_acc = acc\n", True),
    # not that plain: a block with its own branch, a test under another per-rank test, no best kept: left as they are
    (LOOP + "    here = loss.item()\n    if here < best:\n        best = here\n        if here < 0.1:\n"
     "            torch.save(model, 'b.pt')\n", False),
    (LOOP + "    here = loss.item()\n    if loss.item() > 1:\n        if here < best:\n            best = here\n",
     False),
    (LOOP + "    here = loss.item()\n    if here < best:\n        torch.save(model, 'b.pt')\n", False),
    (LOOP + "    here = loss.item()\n    if here < best:\n        best = here\n    else:\n        stale += 1\n", False),
])
def test_a_best_model_decision_is_made_on_the_ranks_average(body, averaged):
    """Issue 54: where the intent is plain (keep the best score), the score is averaged over the ranks before the
    test, so every rank takes the same branch, as the one process did on the whole set; anything less plain keeps
    its rank-0-local save and is listed. Never a collective under a per-rank test either way (the walker)."""
    m = migrate_source(HEAD + body, "d.py")
    score = "acc" if "acc >=" in body else "here"
    assert (f"    {score} = runtime.all_reduce_mean({score})\n    if " in m.text) is averaged, m.text
    assert collectives_under_rank_tests(m.text) == []
    if averaged:
        assert not any("rank 0 saves when its own values" in what for _, what in m.findings), m.findings
        assert any("the decision is now every rank's" in what for _, what in m.changes)
