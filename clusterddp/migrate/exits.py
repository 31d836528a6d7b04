"""Where a block leaves: the first ``break``/``continue``/``return`` of a block or an ``if`` (not inside an inner
loop or def). Imports libcst (loaded by ``uniform``)."""
from __future__ import annotations

from typing import Any, Optional

import libcst as cst

EXITS = (cst.Break, cst.Continue, cst.Return)


def exits(body: Any, loop_level: bool) -> Optional[Any]:
    """The first break/continue (when ``loop_level``) or return in ``body``, not inside an inner loop/def."""
    for statement in getattr(body, "body", ()):
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Return) or (loop_level and isinstance(small, (cst.Break, cst.Continue))):
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
