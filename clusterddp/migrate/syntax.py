"""The syntax helpers of the rewrite: dotted names, arguments, which DataLoader trains (LibCST imported on use)."""
from __future__ import annotations

import re
from typing import Any, List, Optional

from ..errors import ClusterDDPError

IMPORT = "from clusterddp import runtime"
METRIC = re.compile(r"loss|acc", re.IGNORECASE)


def libcst_module() -> Any:
    try:
        import libcst
    except ImportError:
        raise ClusterDDPError("clusterddp migrate rewrites scripts with LibCST, which is not installed here: "
                              "pip install 'clusterddp[migrate]'") from None
    return libcst


def dotted(node: Any) -> str:
    """'torch.nn.DataParallel' for the Name/Attribute chain ``node`` ('' for anything else)."""
    cst = libcst_module()
    if isinstance(node, cst.Name):
        return str(node.value)
    if isinstance(node, cst.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr.value}" if head else ""
    return ""


def code_of(node: Any) -> str:
    return str(libcst_module().Module([]).code_for_node(node))


def keyword(call: Any, name: str) -> Optional[Any]:
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def positional(call: Any) -> List[Any]:
    return [a for a in call.args if a.keyword is None and not a.star]


def is_loader(call: Any) -> bool:
    return dotted(call.func).split(".")[-1] == "DataLoader"


def training_loader(call: Any, names: Any = ()) -> bool:
    """shuffle=True; or, bound to a name with "train" in it, its arguments from a ``**dict`` that may say so
    (pytorch/examples' ``DataLoader(dataset1, **train_kwargs)``, which shuffles only where CUDA is)."""
    shuffle = keyword(call, "shuffle")
    given = positional(call)
    if shuffle is None and len(given) >= 3:
        shuffle = given[2]
    if shuffle is None:
        return any(a.star == "**" for a in call.args) and any("train" in n.lower() for n in names)
    return code_of(shuffle.value).strip() == "True"
