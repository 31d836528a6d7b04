"""Which code of a script runs the same on every rank: a collective (an averaged print, a save that waits for the
others) is only safe where every rank gets to it. Conservative by design: a value is the same on every rank only
when it is built from constants, loop counters, parsed arguments, the world size and results of collectives; the
rank's data, outputs, losses, random draws, clocks, files and any call not known to be pure are per rank.

Names are tracked by name over the whole module (a name per rank anywhere is per rank everywhere): coarse, so that
it may abstain where it need not, never the other way round.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import libcst as cst

from .exits import exits as _exits
from .exits import exits_if as _exits_if
from .syntax import dotted
from .walk import bound

#: Calls whose result is the same on every rank when their arguments are.
PURE = {"range", "len", "int", "float", "str", "bool", "min", "max", "abs", "round", "enumerate", "zip", "tuple",
        "list", "dict", "set", "sorted", "reversed", "isinstance", "hasattr", "getattr", "vars", "format", "repr",
        "math.ceil", "math.floor", "math.sqrt", "math.log", "math.exp", "os.path.join", "os.path.basename",
        "os.path.dirname", "os.path.splitext",
        # the job's nodes are alike (one partition): what a node has is what every node has
        "torch.cuda.is_available", "cuda.is_available", "torch.backends.mps.is_available", "torch.cuda.device_count",
        "cuda.device_count"}
#: Objects that are the same on every rank, whatever they yield later (iterating a loader is per rank).
MAKERS = ("DataLoader", "argparse.ArgumentParser", "ArgumentParser", "runtime.loader")
UNIFORM_METHODS = {"parse_args", "add_argument", "format", "get_last_lr", "join", "replace", "lower", "upper",
                   "startswith", "endswith", "split", "strip"}
UNIFORM_RUNTIME = {"runtime.all_reduce_mean", "runtime.world_size", "runtime.device"}
#: methods that put a value into their object (``history.append(val_loss)``: the list is the rank's own then)
MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "appendleft"}


class Flow:
    """The answer: per-rank names, the calls that run under per-rank control, the loops ranks leave apart."""

    def __init__(self) -> None:
        self.names: Set[str] = set()
        self.asking: Set[str] = set()              # the functions whose returns are being asked about
        self.params: Dict[str, List[str]] = {}     # module-level function -> its parameter names
        self.functions: Dict[str, List[Any]] = {}  # name -> its FunctionDefs (methods too)
        self.apart: Set[str] = set()               # functions called under per-rank control
        self.controlled: Dict[int, Any] = {}       # id(call) -> the statement whose per-rank test controls it
        self.diverging: List[Tuple[Any, Any]] = []  # (loop, the exit's statement): ranks leave or skip apart
        self.if_control: Dict[int, Any] = {}       # id(if) -> what controls it (None: every rank reaches it)
        # a what-if of the rewrite (stopping.py): reads of a value averaged before them; names taken as the same
        self.shared: Set[int] = set()              # id(Name) read after runtime.all_reduce_mean
        self.uniform: Set[str] = set()             # names never per rank (a helper fed averaged values)

    def per_rank(self, call: Any) -> Optional[Any]:
        """The statement whose test differs by rank and controls ``call``; None where every rank runs it."""
        return self.controlled.get(id(call))


def varies(node: Any, flow: "Flow") -> bool:
    """Whether the expression ``node`` may differ between ranks."""
    if isinstance(node, cst.Name):
        return node.value in flow.names and id(node) not in flow.shared
    if isinstance(node, cst.Call):
        name = dotted(node.func)
        if name in UNIFORM_RUNTIME or name.endswith(MAKERS):
            return False  # (a loader is one object on every rank: its length too; what it yields is per rank)
        own = flow.functions.get(name)
        if own is not None:  # the script's own function: per rank when what it returns is
            if name in flow.asking:
                return True  # (recursion: abstain)
            flow.asking.add(name)
            try:
                if any(varies(r, flow) for fn in own for r in _returns(fn)):
                    return True
            finally:
                flow.asking.discard(name)
        elif not (name in PURE or _uniform_method(node, flow)):
            return True
        return any(varies(a.value, flow) for a in node.args)
    if isinstance(node, (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
        return True  # (abstain)
    return any(varies(child, flow) for child in node.children if isinstance(child, cst.CSTNode))


def _uniform_method(call: Any, flow: "Flow") -> bool:
    func = call.func
    return isinstance(func, cst.Attribute) and func.attr.value in UNIFORM_METHODS and not varies(func.value, flow)


class _Returns(cst.CSTVisitor):
    def __init__(self) -> None:
        self.values: List[Any] = []

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None:
            self.values.append(node.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False


def _returns(fn: Any) -> List[Any]:
    """The values ``fn`` returns (not those of functions defined inside it)."""
    found = _Returns()
    for statement in fn.body.body:
        statement.visit(found)
    return found.values


def _targets(node: Any) -> Iterable[str]:
    if isinstance(node, cst.Name):
        yield node.value
    elif isinstance(node, (cst.Tuple, cst.List)):
        for element in node.elements:
            yield from _targets(element.value)
    elif isinstance(node, (cst.StarredElement, cst.Subscript)):  # (history[epoch] = val_loss: the list)
        yield from _targets(node.value)


class _Names(cst.CSTVisitor):
    """One pass: every name assigned from a value that varies (or a loop's data) joins ``names``, and so does every
    name assigned under a test that varies (``else: bad_epochs += 1``: a counter of the rank's own)."""

    def __init__(self, flow: Flow) -> None:
        self.flow = flow
        self.tests: List[bool] = []  # the tests around the node: whether each varies

    def _add(self, target: Any, value_varies: bool) -> None:
        if value_varies or any(self.tests):
            self.flow.names.update(t for t in _targets(target) if t not in self.flow.uniform)

    def visit_If(self, node: cst.If) -> None:
        self.tests.append(varies(node.test, self.flow))

    def visit_While(self, node: cst.While) -> None:
        self.tests.append(varies(node.test, self.flow))

    def leave_If(self, original_node: cst.If) -> None:
        self.tests.pop()

    def leave_While(self, original_node: cst.While) -> None:
        self.tests.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            self._add(t.target, varies(node.value, self.flow))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._add(node.target, varies(node.value, self.flow))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._add(node.target, varies(node.value, self.flow))

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._add(node.target, varies(node.value, self.flow))

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._add(node.asname.name, True)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._add(node.target, True)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        self.tests.append(True)  # only the ranks that raised get here
        if node.name is not None:
            self._add(node.name.name, True)

    def leave_ExceptHandler(self, original_node: cst.ExceptHandler) -> None:
        self.tests.pop()

    def visit_For(self, node: cst.For) -> None:
        it = node.iter
        if isinstance(it, cst.Call) and dotted(it.func) == "enumerate" and it.args and \
                isinstance(node.target, cst.Tuple) and len(node.target.elements) == 2:
            # the index counts batches: every rank has as many (each rank's share of one length)
            self._add(node.target.elements[1].value, True)
            self._add(node.target.elements[0].value, varies(it.args[0].value, self.flow) and
                      not _is_loaderish(it.args[0].value))
            return
        counting = isinstance(it, (cst.List, cst.Tuple)) or (isinstance(it, cst.Call) and dotted(it.func) == "range")
        self._add(node.target, not counting or varies(it, self.flow))

    def visit_Call(self, node: cst.Call) -> None:
        """A function's parameter is per rank where a call passes it a per-rank value; an object is where a
        mutator puts one in it."""
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in MUTATORS and \
                isinstance(func.value, (cst.Name, cst.Subscript, cst.Attribute)):  # (history["loss"].append(x))
            self._add(func.value, any(varies(a.value, self.flow) for a in node.args))
        params = self.flow.params.get(dotted(node.func).split(".")[-1])
        if params is None:
            return
        for i, arg in enumerate(node.args):
            name = arg.keyword.value if arg.keyword is not None else (params[i] if i < len(params) else None)
            if arg.star or (name is not None and varies(arg.value, self.flow)):
                self.flow.names.update(params if arg.star else [name])  # type: ignore[list-item]


def _is_loaderish(node: Any) -> bool:
    """A loader, or anything iterated batch by batch (same count on every rank)."""
    return isinstance(node, (cst.Name, cst.Attribute))


def _diverging(statements: Iterable[Any], names: "Flow") -> Optional[Any]:
    """In a loop's body: an ``if`` whose test differs by rank and that leaves the iteration (break, continue,
    return), not counting inner loops: the ranks then run different numbers of the loop's steps."""
    for statement in statements:
        if isinstance(statement, cst.If):
            if varies(statement.test, names) and _exits_if(statement, True) is not None:
                return statement
            found = _diverging(statement.body.body, names) or (
                _diverging([statement.orelse] if isinstance(statement.orelse, cst.If) else statement.orelse.body.body,
                           names) if statement.orelse is not None else None)
            if found is not None:
                return found
        elif isinstance(statement, (cst.With, cst.Try)):
            found = _diverging(statement.body.body, names)
            if found is not None:
                return found
            for handler in getattr(statement, "handlers", ()):  # only the rank that raised leaves the step
                if _exits(handler.body, True) is not None:
                    return handler
    return None


class _Calls(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: List[Any] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False


class _Control:
    """The walk: which statement's per-rank test controls each call."""

    def __init__(self, flow: Flow) -> None:
        self.flow = flow
        self.callers: Dict[str, Any] = {}  # function -> a per-rank statement that controls a call to it

    def calls(self, node: Any, ctrl: Optional[Any]) -> None:
        if ctrl is None:
            return
        found = _Calls()
        node.visit(found)
        for call in found.calls:
            self.flow.controlled.setdefault(id(call), ctrl)
            name = dotted(call.func).split(".")[-1]
            if name in self.flow.functions:
                self.callers.setdefault(name, ctrl)

    def block(self, statements: Iterable[Any], ctrl: Optional[Any]) -> None:
        for statement in statements:
            ctrl = self.statement(statement, ctrl)

    def statement(self, st: Any, ctrl: Optional[Any]) -> Optional[Any]:
        """Walks ``st``; returns what controls the statements after it (a per-rank return makes them per rank)."""
        names = self.flow
        if isinstance(st, cst.If):
            if ctrl is not None or id(st) not in self.flow.if_control:  # (a later walk under control wins)
                self.flow.if_control[id(st)] = ctrl
            self.calls(st.test, ctrl)
            inner = ctrl or (st if varies(st.test, names) else None)
            self.block(st.body.body, inner)
            if st.orelse is not None:
                self.block([st.orelse] if isinstance(st.orelse, cst.If) else st.orelse.body.body, inner)
            return inner if inner is not ctrl and _exits_if(st, False) is not None else ctrl
        if isinstance(st, (cst.For, cst.While)):
            head = st.iter if isinstance(st, cst.For) else st.test
            self.calls(head, ctrl)
            apart = st if isinstance(st, cst.While) and varies(st.test, names) else _diverging(st.body.body, names)
            if apart is not None and all(loop is not st for loop, _ in self.flow.diverging):
                self.flow.diverging.append((st, apart))
            self.block(st.body.body, ctrl or apart)
            if st.orelse is not None:
                self.block(st.orelse.body.body, ctrl or apart)
            return ctrl
        if isinstance(st, cst.Try):
            self.block(st.body.body, ctrl)
            for handler in st.handlers:
                self.block(handler.body.body, ctrl or handler)  # only the ranks that raised get here
            if st.orelse is not None:
                self.block(st.orelse.body.body, ctrl)
            if st.finalbody is not None:  # a rank whose own exception brings it here comes alone
                self.block(st.finalbody.body.body, ctrl or st.finalbody)
            return ctrl
        if isinstance(st, cst.With):
            for item in st.items:
                self.calls(item, ctrl)
            self.block(st.body.body, ctrl)
            return ctrl
        if isinstance(st, cst.FunctionDef):
            return ctrl  # walked on its own: from its callers' control
        if isinstance(st, cst.ClassDef):
            self.block(st.body.body, ctrl)
            return ctrl
        self.calls(st, ctrl)
        return ctrl


class _Defs(cst.CSTVisitor):
    def __init__(self, flow: Flow) -> None:
        self.flow = flow

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        # by name, methods too (``self.evaluate()`` is ``evaluate``): a name shared by two defs joins them
        self.flow.functions.setdefault(node.name.value, []).append(node)
        self.flow.params.setdefault(node.name.value, [p.name.value for p in node.params.params if
                                                      p.name.value != "self"])


#: passes of the names' fixed point before every name still undecided counts as per rank (each pass follows every
#: assignment once, so a chain of names written against the file's order needs one pass a link)
PASSES = 20


def analyse(module: Any, shared: Iterable[int] = (), uniform: Iterable[str] = ()) -> Flow:
    """The Flow of ``module`` (the very nodes the rewrite will visit); ``shared``, ``uniform``: as if those reads
    had been averaged first and those names were the same on every rank (Flow.shared, Flow.uniform)."""
    flow = Flow()
    flow.shared, flow.uniform = set(shared), set(uniform)
    module.visit(_Defs(flow))
    for _ in range(PASSES):  # to a fixed point: names feed names, calls feed parameters
        before = len(flow.names)
        module.visit(_Names(flow))
        if len(flow.names) == before:
            break
    else:  # not settled: a name still undecided may be per rank, and "the same on every rank" must never be a guess
        flow.names |= bound(module) - flow.uniform
    control = _Control(flow)
    control.block(module.body, None)
    for defs in flow.functions.values():
        for fn in defs:
            control.block(fn.body.body, None)
    while True:  # a function called under per-rank control is per rank inside, and so are the ones it calls
        todo = [(name, ctrl) for name, ctrl in control.callers.items() if name not in flow.apart]
        if not todo:
            return flow
        for name, ctrl in todo:
            flow.apart.add(name)
            for fn in flow.functions[name]:
                control.block(fn.body.body, ctrl)
