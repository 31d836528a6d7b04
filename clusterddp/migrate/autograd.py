"""What DDP's gradient averaging cannot follow (issue 75), listed with their lines: a loss computed through
``model.module.method()`` (it bypasses DDP's forward, so nothing prepares its backward and no gradient is averaged),
more than one backward per forward (``retain_graph=True``, or several backward calls in one step of a loop with one
model), and wraps counted as calls, not lines (a wrap inside a function called twice makes two DDP models). Imports
libcst (loaded by ``transform``)."""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

import libcst as cst
from libcst.metadata import PositionProvider

from .syntax import code_of, dotted, keyword

Lines = List[Tuple[int, str]]
#: the inner module's methods that compute nothing a backward goes through
PLAIN = {"state_dict", "load_state_dict", "parameters", "named_parameters", "buffers", "named_buffers", "modules",
         "named_modules", "children", "named_children", "train", "eval", "to", "cpu", "cuda", "zero_grad", "apply",
         "half", "float", "double", "requires_grad_", "register_buffer", "save_pretrained", "get_parameter"}


class Autograd(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, wrapped: Set[str], is_dp) -> None:  # type: ignore[no-untyped-def]
        self.wrapped, self.is_dp = wrapped, is_dp
        self.findings: Lines = []
        self.within: List[str] = []
        self.wraps_in: Dict[str, List[int]] = {}  # function -> the lines of the wraps in it
        self.called: Dict[str, int] = {}  # function -> how many calls of it the script makes

    def _line(self, node: cst.CSTNode) -> int:
        return int(self.get_metadata(PositionProvider, node).start.line)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.within.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.within.pop()

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Name):
            self.called[func.value] = self.called.get(func.value, 0) + 1
        if self.is_dp(node) and self.within:
            self.wraps_in.setdefault(self.within[-1], []).append(self._line(node))
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Attribute) and \
                func.value.attr.value == "module" and func.attr.value not in PLAIN:  # (DataParallel's attribute)
            self.findings.append((self._line(node), f"{code_of(func)}(...) goes past DDP's forward: what it computes "
                                  "reaches the backward without DDP preparing it, so its gradients are not averaged "
                                  "over the ranks (each rank's copy drifts apart); compute the loss through the "
                                  "wrapped model's own forward (model(x)), moving the method into forward()"))
        if dotted(func) in ("copy.deepcopy", "deepcopy") and node.args and dotted(node.args[0].value) in self.wrapped:
            self.findings.append((self._line(node), f"a copy of the wrapped model ({code_of(node)}): under DDP it "
                                  "copies the DDP wrapper too, a second DDP model with its own collectives; copy "
                                  f"runtime.unwrap({dotted(node.args[0].value)}) (an EMA or a teacher needs no wrap)"))
        if isinstance(func, cst.Attribute) and func.attr.value == "backward" and keyword(node, "retain_graph"):
            self.findings.append((self._line(node), "backward(retain_graph=True): a second backward through the same "
                                  "forward; under DDP each forward expects one backward ('Expected to mark a variable "
                                  "ready only once'): add the losses and call backward once"))

    def _loop(self, node: cst.CSTNode, body: cst.BaseSuite) -> None:
        found = [n for n in _backward_calls(body)]
        if len(found) > 1 and len(self.wrapped) <= 1 and not any(keyword(n, "retain_graph") for n in found):
            self.findings.append((self._line(found[1]), f"{len(found)} backward() calls in one step of this loop, "
                                  "with one model: under DDP each forward expects one backward (a second all-reduces "
                                  "gradients again, or fails: 'Expected to mark a variable ready only once'); add "
                                  "the losses and call backward once"))

    def visit_For(self, node: cst.For) -> None:
        self._loop(node, node.body)

    def visit_While(self, node: cst.While) -> None:
        self._loop(node, node.body)

    def wraps(self) -> Lines:
        """A wrap inside a function the script calls more than once: as many DDP models as calls."""
        return [(line, f"a DataParallel wrap inside {fn}(), which the script calls {self.called[fn]} times: under DDP "
                       f"that makes {self.called[fn]} DDP models; one whose parameters are all frozen (a teacher, "
                       "an EMA copy) needs no wrap (runtime.wrap leaves it unwrapped and says so); two that train "
                       "in one step need find_unused_parameters=True where --check says so")
                for fn, lines in self.wraps_in.items() if self.called.get(fn, 0) > 1 for line in lines]


def _backward_calls(body: cst.CSTNode) -> List[cst.Call]:
    """The ``.backward(`` calls in a loop's step (not in inner loops, defs, or the other branch of an if/else)."""
    found: List[cst.Call] = []

    class _Walk(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward":
                found.append(node)

        def visit_If(self, node: cst.If) -> bool:
            if node.orelse is None:
                return True
            mine, theirs = _backward_calls(node.body), _backward_calls(node.orelse)
            found.extend(mine if len(mine) >= len(theirs) else theirs)  # (one branch or the other runs)
            return False

        def visit_For(self, node: cst.For) -> bool:
            return False

        def visit_While(self, node: cst.While) -> bool:
            return False

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

    body.visit(_Walk())
    return found
