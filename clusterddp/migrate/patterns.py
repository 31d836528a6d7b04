"""Small patterns of the rewrite that stand alone: GPU-count comparisons, 'cuda' literals, the makedirs race, and
a best-model decision that can be made the same on every rank. Imports libcst (loaded by ``transform``)."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

import libcst as cst

from .syntax import METRIC, code_of, dotted, keyword, positional
from .uniform import Flow, varies

Lines = List[Tuple[int, str]]

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


def fed_schedulers(wrapper: Any, flow: Flow, schedulers: Any) -> Tuple[Dict[int, List[Tuple[str, str]]], Lines]:
    """``sched.step(x)`` (ReduceLROnPlateau's) where ``x`` differs by rank: each rank would cut its own learning rate
    and the models drift apart. Where every rank reaches the step and ``x`` is a name, it is averaged right before
    (the statement's id -> (x, the change)); anything else is listed, as is ``param_groups[...]["lr"] = v`` with a
    ``v`` of the rank's own."""
    from libcst.metadata import ParentNodeProvider, PositionProvider

    where, parents = wrapper.resolve(PositionProvider), wrapper.resolve(ParentNodeProvider)
    averages: Dict[int, List[Tuple[str, str]]] = {}
    findings: Lines = []
    for node, at in where.items():
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "step" \
                and dotted(node.func.value) in schedulers and node.args and varies(node.args[0].value, flow):
            given, line = node.args[0].value, at.start.line
            statement = parents[parents[node]] if isinstance(parents[node], cst.Expr) else None
            if isinstance(given, cst.Name) and flow.per_rank(node) is None and \
                    isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
                averages.setdefault(id(statement), []).append((given.value, (
                    f"{given.value} = runtime.all_reduce_mean({given.value}) before `{code_of(node)}` (each rank's "
                    "own value would cut each rank's learning rate at another epoch: the models would drift apart; "
                    "the scheduler now steps on the ranks' average)")))
            else:
                findings.append((line, f"{code_of(node)}: the scheduler is given a value of the rank's own, so each "
                                       "rank may change its learning rate at another epoch and the models drift "
                                       "apart; give it runtime.all_reduce_mean of that value, where every rank "
                                       "gets to it"))
        elif isinstance(node, cst.AssignTarget) and isinstance(node.target, cst.Subscript) and \
                code_of(node.target).replace("'", '"').replace(" ", "").endswith('["lr"]'):  # (a param group's)
            assign = parents[node]
            if isinstance(assign, cst.Assign) and varies(assign.value, flow):
                findings.append((at.start.line, "a learning rate set from a value of the rank's own: each rank "
                                                "trains at its own rate and the models drift apart; average that "
                                                "value first (runtime.all_reduce_mean), where every rank gets to it"))
    return averages, findings


def without_init(guard: Any, init: str) -> Any:
    """The main guard without the runtime.init() the rewrite put first in it."""
    first = guard.body.body[0] if guard.body.body else None
    if first is not None and code_of(first).strip() == init:
        return guard.with_changes(body=guard.body.with_changes(body=guard.body.body[1:]))
    return guard


class Average(cst.CSTTransformer):
    """Inside a print: ``loss.item()`` -> ``runtime.all_reduce_mean(loss).item()`` (every rank takes part: the
    arguments are evaluated on every rank before print0 decides who prints)."""

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> Any:
        func = updated.func
        if isinstance(func, cst.Attribute) and func.attr.value == "item" and not updated.args and \
                isinstance(func.value, cst.Name) and METRIC.search(func.value.value):
            inner = cst.parse_expression(f"runtime.all_reduce_mean({func.value.value})")
            return updated.with_changes(func=func.with_changes(value=inner))
        return updated


def with_keyword(call: cst.Call, name: str, value: str) -> cst.Call:
    """``call`` with ``name=value`` after its last argument."""
    return call.with_changes(args=[*call.args[:-1], call.args[-1].with_changes(comma=cst.Comma(
        whitespace_after=cst.SimpleWhitespace(" "))), cst.Arg(cst.parse_expression(value), keyword=cst.Name(name),
                                                                 equal=TIGHT)])


def device_rewrite(original: cst.Call, updated: cst.Call, name: str, functional: Any = ()) -> Optional[Tuple[Any, str]]:
    """(the call rewritten, what changed) for a device the script names: ``.to("cuda")``, ``.cuda()``,
    ``torch.load`` without a map_location, torch's functional ``data_parallel`` (``functional``: the bare names it
    was imported as), ``torch.device("cuda")``; None for any other call."""
    given = positional(original)
    if isinstance(original.func, cst.Attribute) and original.func.attr.value == "to" and given and \
            cuda_literal(given[0].value):
        return updated.with_changes(args=[updated.args[0].with_changes(
            value=cst.parse_expression("runtime.device()")), *updated.args[1:]]), \
            f"{code_of(given[0].value)} -> runtime.device() (the rank's own GPU)"
    if isinstance(original.func, cst.Attribute) and original.func.attr.value == "cuda" and name != "torch.cuda":
        rest = [a for a in updated.args if a.keyword is not None]
        return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("to")), args=[cst.Arg(
            cst.parse_expression("runtime.device()"))] + rest), ".cuda() -> .to(runtime.device()) (the rank's own GPU)"
    if name == "torch.load" and keyword(original, "map_location") is None and len(given) == 1:
        return with_keyword(updated, "map_location", "runtime.device()"), (
            "torch.load(...) -> torch.load(..., map_location=runtime.device()) (what was saved from a GPU loads on "
            "this rank's own, not on GPU 0 in every rank)")
    if (name.endswith("parallel.data_parallel") or name in functional) and len(given) >= 2 and \
            not any(a.star for a in original.args) and keyword(original, "module_kwargs") is None:
        module, inputs = positional(updated)[0].value, positional(updated)[1].value
        called = code_of(module) if isinstance(module, (cst.Name, cst.Attribute)) else f"({code_of(module)})"
        # (its inputs: a tuple is the module's arguments, anything else its one argument, as torch's function reads)
        args = ", ".join(code_of(e.value) for e in inputs.elements) if isinstance(inputs, cst.Tuple) else \
            code_of(inputs)
        return cst.parse_expression(f"{called}({args})"), (
            f"{code_of(original)} -> {called}({args}) (each rank runs its module on its own GPU; the functional "
            "data_parallel spread one process over several)")
    if name == "torch.device" and "cuda" in code_of(original):
        return cst.parse_expression("runtime.device()"), \
            f"{code_of(original)} -> runtime.device() (cuda:LOCAL_RANK, or the CPU)"
    return None
