"""Early stopping through a helper object (``early_stopping(val_loss, model); if early_stopping.early_stop:
break``): whether it decides from the values it is given alone, so that given the ranks' average it decides the
same on every rank. Only a class of the script itself can be seen to; one imported is taken on trust and listed.
Imports libcst (loaded by ``transform``)."""
from __future__ import annotations

from typing import Any, Dict, List, Set, Tuple

import libcst as cst

from .syntax import code_of, dotted
from .uniform import PURE, Flow, varies
from .walk import names, walk

#: what a helper's methods may call and still decide from the values they are given alone
QUIET = {"print", "torch.save", "copy.deepcopy", "deepcopy", "np.isnan", "np.isinf", "math.isnan", "math.isinf",
         "numpy.isnan", "numpy.isinf", "logging.info", "logger.info", "log.info", "warnings.warn"}
QUIET_METHODS = {"state_dict", "item", "format", "append"}


class _Uses(cst.CSTVisitor):
    """How ``helper`` is made and called, the script's classes, the names bound to the DataParallel model."""

    def __init__(self, helper: str) -> None:
        self.helper = helper
        self.made: List[Any] = []
        self.calls: List[Any] = []
        self.classes: Dict[str, Any] = {}
        self.models: Set[str] = set()

    def visit_Assign(self, node: cst.Assign) -> None:
        bound = {n.value for t in node.targets for n in names(t.target)}
        if self.helper in bound:
            self.made.append(node.value)
        if "DataParallel(" in code_of(node.value):
            self.models |= bound

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes[node.name.value] = node

    def visit_Call(self, node: cst.Call) -> None:
        head = node.func.value if isinstance(node.func, cst.Attribute) else node.func
        if isinstance(head, cst.Name) and head.value == self.helper:
            self.calls.append(node)


def _impure(cls: Any, flow: Flow) -> str:
    """What in ``cls``'s methods could make it decide other than from the values it is given ('' for nothing)."""
    methods = [st for st in cls.body.body if isinstance(st, cst.FunctionDef)]
    seen = walk(*[st for fn in methods for st in fn.body.body])
    for call in seen.calls:
        func = call.func
        own = isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"
        if not (own or dotted(func) in PURE | QUIET or
                (isinstance(func, cst.Attribute) and func.attr.value in QUIET_METHODS)):
            return f"calls {code_of(func)}"
    given = {p.name.value for fn in methods for p in [*fn.params.posonly_params, *fn.params.params,
                                                       *fn.params.kwonly_params]}
    other = next((n.value for n in seen.reads if n.value in flow.names and n.value not in given | seen.assigned), "")
    return f"reads {other}" if other else ""


def doubt(module: Any, helper: str, flow: Flow) -> Tuple[str, str, Any]:
    """(its class, '', the ClassDef) where ``helper`` decides from the values it is given alone: made by a class of
    this script whose methods call nothing but their own, print, torch.save and math and read no other value of the
    rank's own, and given values every rank shares (or the model, the same on every rank under DDP); else (its
    class, why not, None)."""
    uses = _Uses(helper)
    module.visit(uses)
    kinds = {dotted(v.func) if isinstance(v, cst.Call) else "" for v in uses.made}
    kind = kinds.pop() if len(kinds) == 1 else ""
    cls = uses.classes.get(kind.split(".")[-1]) if kind else None
    if not kind:
        return helper, f"{helper} is not made by one call of a class", None
    if cls is None:
        return kind, f"{kind} is not in this script", None
    bad = _impure(cls, flow)
    if bad:
        return kind, f"{kind} {bad}", None
    for call in uses.made + uses.calls:
        for a in call.args:
            if varies(a.value, flow) and not (isinstance(a.value, cst.Name) and a.value.value in uses.models):
                return kind, f"{helper} is given {code_of(a.value)}, a value of the rank's own", None
    return kind, "", cls
