"""Loaders judged by use (issue 75), a pass of its own before the survey: a DataLoader reached through a dict
(``dataloaders[phase]`` in ``for phase in ["train", "val"]``), returned by a builder of the script
(``train_loader, val_loader = make_loaders()``), or made for several phases in one dict comprehension; which phase's
loop runs a backward (``if phase == "train": loss.backward()``); the counts and sums a loop over a loader adds up,
and what they are divided by. Imports libcst (loaded by ``transform``)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

import libcst as cst
from libcst.metadata import PositionProvider

from .syntax import code_of, dotted, is_loader


def literal_keys(node: Any) -> Optional[List[str]]:
    """["train", "val"] (a list, tuple or set of plain strings); None for anything else."""
    if not isinstance(node, (cst.List, cst.Tuple, cst.Set)) or not node.elements:
        return None
    keys = [e.value.evaluated_value for e in node.elements if isinstance(e.value, cst.SimpleString)]
    return [str(k) for k in keys] if len(keys) == len(node.elements) else None


def _truth(test: Any, env: Dict[str, str]) -> Optional[bool]:
    """The value of ``test`` where the names of ``env`` hold their strings: ``phase == "train"``, ``!=``, ``in``,
    ``not``, ``and``/``or``; None where it cannot be told."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = _truth(test.expression, env)
        return None if inner is None else not inner
    if isinstance(test, cst.BooleanOperation):
        both = (_truth(test.left, env), _truth(test.right, env))
        if isinstance(test.operator, cst.And):
            return False if False in both else None if None in both else True
        return True if True in both else None if None in both else False
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(test.left, cst.Name) and \
            test.left.value in env:
        op, given, value = test.comparisons[0].operator, test.comparisons[0].comparator, env[test.left.value]
        if isinstance(given, cst.SimpleString) and isinstance(op, (cst.Equal, cst.NotEqual)):
            return (given.evaluated_value == value) == isinstance(op, cst.Equal)
        keys = literal_keys(given)
        if keys is not None and isinstance(op, (cst.In, cst.NotIn)):
            return (value in keys) == isinstance(op, cst.In)
    return None


def backward_under(body: Any, env: Dict[str, str]) -> bool:
    """Whether a ``.backward(`` in ``body`` can run where the names of ``env`` hold their strings (an ``if`` whose test
    is then false is skipped; one that cannot be told counts both ways)."""
    if isinstance(body, cst.If):
        truth = _truth(body.test, env)
        return (truth is not False and backward_under(body.body, env)) or \
            (truth is not True and body.orelse is not None and backward_under(
                body.orelse if isinstance(body.orelse, cst.If) else body.orelse.body, env))
    if isinstance(body, cst.BaseSuite):
        return any(backward_under(st, env) for st in getattr(body, "body", ()))
    if isinstance(body, cst.SimpleStatementLine):
        return ".backward(" in code_of(body)
    if isinstance(body, (cst.FunctionDef, cst.ClassDef)):
        return False
    return any(backward_under(child, env) for child in body.children
               if isinstance(child, (cst.BaseSuite, cst.BaseCompoundStatement, cst.Else, cst.Finally,
                                     cst.ExceptHandler)))


def _base(node: Any) -> str:
    """The name a value is read from: ``correct``, ``correct.double()``, ``float(correct)``, ``correct.item()``."""
    while True:
        if isinstance(node, cst.Name):
            return node.value
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and not node.args:
            node = node.func.value
        elif isinstance(node, cst.Call) and dotted(node.func) in ("float", "int") and len(node.args) == 1:
            node = node.args[0].value
        else:
            return ""


class Uses(cst.CSTVisitor):
    """What the survey needs beyond plain names: loaders bound to ``D[key]``, the loops over them (and whether each
    key's loop runs a backward), the tuples the script's builders return, what each loop over a loader adds up, and
    the divisions of those sums."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.bound: Dict[int, Tuple[Any, int, Set[str]]] = {}  # a loader call -> (it, its line, its keys "D[k]")
        self.shared: Dict[int, Optional[List[str]]] = {}  # a loader call of a dict comprehension -> its keys
        self.dict_keys: Dict[str, List[str]] = {}  # a name bound to a dict of plain string keys -> the keys
        self.unclear: Set[str] = set()  # dicts looped over by a key that cannot be told (``loaders[name]``)
        self.iterated: Dict[str, bool] = {}      # "D[k]" looped over -> whether that key's loop runs a backward
        self.returns: Dict[str, List[str]] = {}  # a function of the script -> the names of the tuple it returns
        self.unpacked: List[Tuple[List[str], str]] = []  # (targets, function): ``tr, va = make_loaders()``
        self.phases: List[Tuple[str, List[str]]] = []  # the loops over literal keys around the node
        self.within: List[str] = []
        self.sums: List[Tuple[Set[str], Set[str]]] = []  # (what a loop goes over, the names it adds to)
        self.divisions: List[Tuple[int, str, Any]] = []  # (line, the name divided, the divisor)

    def _line(self, node: Any) -> int:
        return int(self.get_metadata(PositionProvider, node).start.line)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.within.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.within.pop()

    def visit_Return(self, node: cst.Return) -> None:
        value = node.value
        if self.within and isinstance(value, cst.Tuple) and all(isinstance(e.value, cst.Name) for e in value.elements):
            self.returns[self.within[-1]] = [e.value.value for e in value.elements]  # type: ignore[attr-defined]

    def keys(self, node: Any) -> Optional[List[str]]:
        """The keys ``node`` goes over: a literal list, a dict of this script's by name, its ``.keys()``."""
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "keys" \
                and not node.args:
            node = node.func.value
        if isinstance(node, cst.Name):
            return self.dict_keys.get(node.value)
        return literal_keys(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        value, targets = node.value, [t.target for t in node.targets]
        dicts = [t.value for t in targets if isinstance(t, cst.Name)]
        if isinstance(value, cst.Dict):
            strings = [e.key.evaluated_value for e in value.elements
                       if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)]
            if strings and len(strings) == len(value.elements):
                self.dict_keys.update({d: [str(k) for k in strings] for d in dicts})
            for element in value.elements:
                if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString) and \
                        isinstance(element.value, cst.Call) and is_loader(element.value):
                    key = str(element.key.evaluated_value)
                    self.bound[id(element.value)] = (element.value, self._line(element.value),
                                                     {f"{d}[{key}]" for d in dicts})
        elif isinstance(value, cst.DictComp):
            keys = self.keys(value.for_in.iter)
            if keys is not None:
                self.dict_keys.update({d: keys for d in dicts})
            if isinstance(value.value, cst.Call) and is_loader(value.value):
                self.bound[id(value.value)] = (value.value, self._line(value.value),
                                               {f"{d}[{k}]" for d in dicts for k in keys or ["?"]})
                self.shared[id(value.value)] = keys
        elif isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and len(targets) == 1 and \
                isinstance(targets[0], cst.Tuple) and all(isinstance(e.value, cst.Name) for e in targets[0].elements):
            self.unpacked.append(([e.value.value for e in targets[0].elements],  # type: ignore[attr-defined]
                                  value.func.value))

    def visit_For(self, node: cst.For) -> None:
        keys = self.keys(node.iter)
        if keys is not None and isinstance(node.target, cst.Name):
            self.phases.append((node.target.value, keys))
        over = node.iter
        for _ in range(2):  # enumerate(tqdm(...)): what the loop goes over
            if isinstance(over, cst.Call) and dotted(over.func).split(".")[-1] in ("enumerate", "tqdm", "iter") \
                    and over.args:
                over = over.args[0].value
        looped: Set[str] = set()
        if isinstance(over, cst.Name):
            looped.add(over.value)
        elif isinstance(over, cst.Subscript) and isinstance(over.value, cst.Name) and len(over.slice) == 1 and \
                isinstance(over.slice[0].slice, cst.Index):
            index = over.slice[0].slice.value
            envs = [{}] if isinstance(index, cst.SimpleString) else \
                [{name: k} for name, keys in self.phases if isinstance(index, cst.Name) and index.value == name
                 for k in keys]
            if not envs:  # a key that cannot be told: which of its loaders trains cannot either
                self.unclear.add(over.value.value)
            for env in envs:
                key = str(index.evaluated_value) if isinstance(index, cst.SimpleString) else next(iter(env.values()))
                name = f"{over.value.value}[{key}]"
                looped.add(name)
                self.iterated[name] = self.iterated.get(name, False) or backward_under(node.body, env)
        if looped:
            added = {n.target.value for n in _augmented(node.body)}
            self.sums.append((looped, added))

    def leave_For(self, original_node: cst.For) -> None:
        if self.keys(original_node.iter) is not None and isinstance(original_node.target, cst.Name):
            self.phases.pop()

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if isinstance(node.operator, cst.Divide) and _base(node.left):
            self.divisions.append((self._line(node), _base(node.left), node.right))

    def aliases(self) -> List[Tuple[str, str]]:
        """(the caller's name, the builder's name) for each ``a, b = build()`` whose build returns ``x, y``."""
        return [(t, r) for targets, fn in self.unpacked for t, r in zip(targets, self.returns.get(fn, []))
                if len(targets) == len(self.returns.get(fn, []))]


def _augmented(body: Any) -> List[Any]:
    """The ``x += ...`` statements in ``body`` (not in defs)."""
    found: List[Any] = []

    class _Aug(cst.CSTVisitor):
        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            if isinstance(node.target, cst.Name) and isinstance(node.operator, cst.AddAssign):
                found.append(node)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

    body.visit(_Aug())
    return found


def divided_wrongly(uses: Uses, sharded: Set[str]) -> List[Tuple[int, str]]:
    """The divisions of a sum a loop over a sharded loader adds up, by anything but that loop's own batch count
    (``len(loader)``) or a count the same loop adds up: a rank's share over the whole set's size."""
    out = []
    for line, name, divisor in uses.divisions:
        loops = [(looped, added) for looped, added in uses.sums if name in added and looped & sharded]
        if not loops:
            continue
        own = {n for _, added in loops for n in added} | {f"len({n})" for looped, _ in loops for n in looped}
        containers = tuple(f"len({n.split('[')[0]}[" for looped, _ in loops for n in looped if "[" in n)
        said = code_of(divisor).strip()
        if said in own or _base(divisor) in own or (containers and said.startswith(containers)) or \
                said.endswith(".dataset)"):  # (len(X.dataset): listed already, as the whole set)
            continue
        out.append((line, f"{name} adds up this rank's share only (its loader is split over the ranks): divided by "
                          f"{said}, the whole set's size, it is about 1 / world size of the true value; divide by a "
                          f"count the same loop adds up, and average over the ranks (runtime.all_reduce_mean)"))
    return out


def phases_in_one_call(survey: Any) -> None:
    """Loaders of the survey (survey.py) that cannot be split for one phase: one DataLoader call that makes the
    loaders of several phases (``{x: DataLoader(...) for x in ["train", "val"]}``) where one phase's loop trains and
    another's does not; loaders of a dict looped over by a key that cannot be told (or made for keys that cannot).
    Left as they are, and listed."""
    unclear = survey.uses.unclear | {name for param, name in survey.dict_args if param in survey.uses.unclear}
    for key, (_, at, names) in survey.bound.items():
        if key in survey.evaluation or not any(n.split("[")[0] in unclear or n.endswith("[?]") for n in names):
            continue
        survey.trains.discard(key)
        survey.evaluation.add(key)
        survey.findings.append((at, "a DataLoader in a dict looped over by a key that cannot be told here: whether "
                                  "it trains (a loop with a backward goes over it) cannot be either, so it is "
                                  "left as it is (every rank goes through the whole set); make the training "
                                  "loader a runtime.loader(...) call, and share an evaluation one with "
                                  "runtime.loader(..., shuffle=False) and runtime.all_reduce_mean of the metric"))
    for key, phases in survey.uses.shared.items():
        call, at, names = survey.bound[key]
        looped = {n: survey.iterated[n] for n in names if n in survey.iterated}
        if phases is not None and True in looped.values() and False in looped.values():
            survey.trains.discard(key)
            survey.evaluation.add(key)
            survey.findings.append((at, "one DataLoader call makes the loaders of " + ", ".join(phases) + " (a "
                                      "comprehension) and only " + ", ".join(n for n, b in looped.items() if b) +
                                      " trains: it is left as it is (every rank goes through every set, in its "
                                      "own order); make the training loader a runtime.loader(...) call of its "
                                      "own, so that each rank trains on its share"))
