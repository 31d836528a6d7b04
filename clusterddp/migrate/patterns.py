"""Small patterns of the rewrite that stand alone: GPU-count comparisons, 'cuda' literals, the makedirs race, and
a best-model decision that can be made the same on every rank. Imports libcst (loaded by ``transform``)."""
from __future__ import annotations

import re
from typing import Any, Optional

import libcst as cst

from .syntax import code_of, dotted
from .uniform import Flow, varies

_GPU_COUNT = re.compile(r"device_count\(|\bn_?gpus?\b|\bnum_gpus?\b|\bgpu_count\b|\bgpus\b|device_ids|gpu_ids")


def cuda_literal(node: Any) -> bool:
    """'cuda' or 'cuda:0' (DataParallel's first GPU): under DDP the rank's own GPU."""
    return isinstance(node, cst.SimpleString) and node.evaluated_value in ("cuda", "cuda:0")


def makedirs_unless_exists(node: cst.If) -> Any:
    """X for ``if not os.path.exists(X): os.makedirs(X)`` (nothing else in it, no else); None otherwise."""
    call = makedirs_call(node)
    return None if call is None else code_of(call.args[0].value)


def makedirs_call(node: cst.If) -> Any:
    """The ``os.makedirs(X)`` call of ``if not os.path.exists(X): os.makedirs(X)``; None for any other if."""
    test = node.test
    if node.orelse is not None or not isinstance(test, cst.UnaryOperation) or \
            not isinstance(test.operator, cst.Not) or not isinstance(test.expression, cst.Call) or \
            dotted(test.expression.func) != "os.path.exists" or len(test.expression.args) != 1:
        return None
    body = node.body.body if isinstance(node.body, cst.IndentedBlock) else node.body.body
    only = body[0] if len(body) == 1 else None
    if isinstance(only, cst.SimpleStatementLine) and len(only.body) == 1:
        only = only.body[0]
    if isinstance(only, cst.Expr) and isinstance(only.value, cst.Call) and dotted(only.value.func) == "os.makedirs" \
            and len(only.value.args) == 1 and only.value.args[0].keyword is None and \
            code_of(only.value.args[0].value) == code_of(test.expression.args[0].value):
        return only.value
    return None


TIGHT = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


class Retest(cst.CSTTransformer):
    """Each comparison of a GPU count (``device_count() > 1``, ``len(args.gpus) > 1``, ``n_gpu > 1``) -> the world
    size; the rest of the test as it was."""

    def __init__(self) -> None:
        self.done = False

    def leave_Comparison(self, original: cst.Comparison, updated: cst.Comparison) -> Any:
        if not _GPU_COUNT.search(code_of(original)):
            return updated
        self.done = True
        return cst.parse_expression("runtime.world_size() > 1").with_changes(lpar=original.lpar, rpar=original.rpar)


def best_decision(node: cst.If, flow: Flow) -> Optional[str]:
    """A for ``if A < best: best = A; ...`` (any of < > <= >=) where A differs by rank, every rank reaches the if and
    its block is plain statements: the decision a script means to take on the whole set's score. None otherwise."""
    test = node.test
    if node.orelse is not None or flow.if_control.get(id(node), flow) is not None or \
            not isinstance(test, cst.Comparison) or len(test.comparisons) != 1 or \
            not isinstance(test.comparisons[0].operator, (cst.LessThan, cst.GreaterThan, cst.LessThanEqual,
                                                         cst.GreaterThanEqual)) or \
            not isinstance(test.left, cst.Name) or not varies(test.left, flow):  # (averaged already: shared)
        return None
    score, best = test.left.value, code_of(test.comparisons[0].comparator)
    body = node.body.body if isinstance(node.body, cst.IndentedBlock) else []
    plain = all(isinstance(st, cst.SimpleStatementLine) for st in body)
    keeps = any(isinstance(small, cst.Assign) and code_of(small.value) == score and
                any(code_of(t.target) == best for t in small.targets)
                for st in body if isinstance(st, cst.SimpleStatementLine) for small in st.body)
    return score if plain and keeps else None
