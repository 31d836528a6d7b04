"""Where a block leaves: the first ``break``/``continue``/``return`` of a block or an ``if`` (not inside an inner
loop or def), and the statements that end the process whatever loop they are in: ``sys.exit()``, ``exit()``,
``quit()``, ``os._exit()``, ``raise SystemExit``. (Another exception is not counted: a rank that raises one exits
non-zero, and the launcher ends the others; a rank that exits as if done leaves them waiting in their next
collective.) Imports libcst (loaded by ``uniform``)."""
from __future__ import annotations

from typing import Any, Optional

import libcst as cst

from .syntax import dotted

EXITS = (cst.Break, cst.Continue, cst.Return)
#: calls that end the process (or raise SystemExit): a rank that makes one leaves every loop it is in
ENDS = {"sys.exit", "exit", "quit", "os._exit", "os.abort"}


def ends(small: Any) -> bool:
    """``small`` (a small statement) leaves the function and every loop: a return, or an end of the process."""
    if isinstance(small, cst.Return):
        return True
    if isinstance(small, cst.Raise) and small.exc is not None:
        raised = small.exc.func if isinstance(small.exc, cst.Call) else small.exc
        return dotted(raised).split(".")[-1] == "SystemExit"
    return isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and dotted(small.value.func) in ENDS


def exits(body: Any, loop_level: bool) -> Optional[Any]:
    """The first break/continue (when ``loop_level``), return or process end in ``body``, not inside an inner
    loop/def (a return or an end inside an inner loop leaves this one too)."""
    if isinstance(body, cst.SimpleStatementSuite):  # (``if x: break``, ``except E: continue`` on one line)
        hit = any(ends(small) or (loop_level and isinstance(small, (cst.Break, cst.Continue))) for small in body.body)
        return body if hit else None
    for statement in getattr(body, "body", ()):
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if ends(small) or (loop_level and isinstance(small, (cst.Break, cst.Continue))):
                    return statement
        elif isinstance(statement, (cst.For, cst.While)):
            found = exits(statement.body, False)
            if found is not None:
                return found
        elif isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        else:
            for child in statement.children:
                if isinstance(child, (cst.BaseSuite, cst.If, cst.Else, cst.ExceptHandler, cst.Finally)):
                    found = exits(child if isinstance(child, cst.BaseSuite) else child.body, loop_level) \
                        if not isinstance(child, cst.If) else exits_if(child, loop_level)
                    if found is not None:
                        return found
    return None


def exits_if(node: Any, loop_level: bool) -> Optional[Any]:
    found = exits(node.body, loop_level)
    if found is None and node.orelse is not None:
        found = exits_if(node.orelse, loop_level) if isinstance(node.orelse, cst.If) \
            else exits(node.orelse.body, loop_level)
    return found
