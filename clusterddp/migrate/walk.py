"""The syntax the early-stopping rule reads (stopping.py): the names a statement reads and sets, the names that
hold no number, its comparisons, calls and ifs; the blocks of a loop; the names given a computed value. Imports
libcst (loaded by ``transform``)."""
from __future__ import annotations

from typing import Any, Iterable, List, Set, Tuple

import libcst as cst


class Walk(cst.CSTVisitor):
    """Names read (not an attribute's or a keyword's name), names assigned, comparisons and calls; not in defs."""

    def __init__(self, deep: bool = False) -> None:
        self.deep = deep  # into defs and classes too
        self.ifs: List[Any] = []
        self.elifs: Set[int] = set()  # (no statement can go before one)
        self.reads: List[Any] = []
        self.assigned: Set[str] = set()
        self.odd: Set[str] = set()  # names that hold no number: a loop's item, a string, a collection
        self.comparisons: List[Any] = []
        self.calls: List[Any] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.reads.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False

    def _target(self, target: Any, value: Any = None, odd: bool = False) -> None:
        if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)) and \
                len(target.elements) == len(value.elements):  # best, wait = float("inf"), 0
            for t, v in zip(target.elements, value.elements):
                self._target(t.value, v.value, odd)
            return
        found = {n.value for n in names(target)}
        self.assigned |= found
        if odd or isinstance(value, (cst.BaseString, cst.List, cst.Tuple, cst.Dict, cst.Set, cst.ListComp)):
            self.odd |= found

    def visit_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            self._target(t.target, node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._target(node.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._target(node.target, node.value)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._target(node.target, node.value)

    def visit_For(self, node: cst.For) -> None:
        self._target(node.target, odd=True)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._target(node.target, odd=True)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._target(node.name, odd=True)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        self.comparisons.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def visit_If(self, node: cst.If) -> None:
        if isinstance(node.orelse, cst.If):
            self.elifs.add(id(node.orelse))
        self.ifs.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return self.deep

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return self.deep

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def names(node: Any) -> Iterable[Any]:
    if isinstance(node, cst.Name):
        yield node
    elif isinstance(node, (cst.Tuple, cst.List)):
        for element in node.elements:
            yield from names(element.value)
    elif isinstance(node, cst.StarredElement):
        yield from names(node.value)


def walk(*nodes: Any, deep: bool = False) -> Walk:
    found = Walk(deep)
    for node in nodes:
        node.visit(found)
    return found


def blocks(body: Any, loop: Any) -> Iterable[Tuple[Any, Any]]:
    """(block, the innermost loop around it) for each block of statements in ``body`` (the indented block of
    ``loop``) and under it, not in defs or except handlers (only the ranks that raised get there)."""
    if not isinstance(body, cst.IndentedBlock):
        return
    yield body.body, loop
    for st in body.body:
        parts: List[Any] = []
        if isinstance(st, cst.If):
            other: Any = st
            while isinstance(other, cst.If):  # (an elif's body: a block; the elif itself is not in one)
                parts.append(other.body)
                other = other.orelse
            parts += [other.body] if other is not None else []
        elif isinstance(st, (cst.For, cst.While, cst.With, cst.Try)):
            parts = [st.body] + [p.body for p in (getattr(st, "orelse", None), getattr(st, "finalbody", None)) if p]
        for part in parts:
            yield from blocks(part, st if isinstance(st, (cst.For, cst.While)) else loop)


def sources(module: Any) -> Set[str]:
    """Names given a computed value somewhere: not only constants, other names, tests and their negations (a
    counter, a flag, a copy: ``bad_epochs += 1``, ``stop = bad >= patience``, ``best = val_loss``)."""
    found: Set[str] = set()
    plain = (cst.Name, cst.Integer, cst.Float, cst.Comparison, cst.BooleanOperation, cst.UnaryOperation)

    def given(target: Any, value: Any) -> None:
        if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)) and \
                len(target.elements) == len(value.elements):
            for t, v in zip(target.elements, value.elements):
                given(t.value, v.value)
        elif not isinstance(value, plain):
            found.update(n.value for n in names(target))

    class _Values(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for t in node.targets:
                given(t.target, node.value)

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            given(node.target, node.value)

    module.visit(_Values())
    return found


def _bound_names(node: Any) -> Iterable[str]:
    """The names a target binds (``history[epoch] = x``: ``history``)."""
    if isinstance(node, cst.Name):
        yield node.value
    elif isinstance(node, (cst.Tuple, cst.List)):
        for element in node.elements:
            yield from _bound_names(element.value)
    elif isinstance(node, (cst.StarredElement, cst.Subscript, cst.Attribute)):
        yield from _bound_names(node.value)


class _Bound(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: Set[str] = set()

    def visit_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            self.names.update(_bound_names(t.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.names.update(_bound_names(node.target))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.names.update(_bound_names(node.target))

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.names.update(_bound_names(node.target))

    def visit_For(self, node: cst.For) -> None:
        self.names.update(_bound_names(node.target))

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self.names.update(_bound_names(node.target))

    def visit_AsName(self, node: cst.AsName) -> None:  # (with ... as x, except ... as e)
        self.names.update(_bound_names(node.name))

    def visit_Param(self, node: cst.Param) -> None:
        self.names.add(node.name.value)


def bound(module: Any) -> Set[str]:
    """Every name the module binds (assignments, loop targets, parameters)."""
    found = _Bound()
    module.visit(found)
    return found.names
