"""The DataParallel -> DDP rewrite (LibCST): the patterns with one right answer are rewritten, the rest is listed.

Rewritten: ``nn.DataParallel(model, ...)`` -> ``runtime.wrap(model)``; ``torch.device("cuda" ...)`` ->
``runtime.device()``; ``x.cuda()`` -> ``x.to(runtime.device())``; a training ``DataLoader(..., shuffle=True)`` ->
``runtime.loader(...)`` (each rank its share, a new shuffle every epoch); ``torch.save`` -> ``runtime.save_on_main``;
``model.module`` -> ``runtime.unwrap(model)``; ``print`` -> ``runtime.print0`` with ``loss.item()`` /
``acc.item()`` averaged over the ranks; ``runtime.step()`` after each optimizer step (the observatory's steps); the
entry point between ``runtime.init()`` and ``runtime.shutdown()``. Listed with FILE:LINE: what is not safe to touch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Set, Tuple, Union

from ..errors import ClusterDDPError, SpecError

IMPORT = "from clusterddp import runtime"
_METRIC = re.compile(r"loss|acc", re.IGNORECASE)


def _cst() -> Any:
    try:
        import libcst
    except ImportError:
        raise ClusterDDPError("clusterddp migrate rewrites scripts with LibCST, which is not installed here: "
                              "pip install 'clusterddp[migrate]'") from None
    return libcst


@dataclass
class Migration:
    """The result: the new text (None when the script was left alone), what changed, what to look at, and why a
    script was left alone."""

    source: str
    text: Optional[str] = None
    changes: List[Tuple[int, str]] = field(default_factory=list)
    findings: List[Tuple[int, str]] = field(default_factory=list)
    left_alone: str = ""


def dotted(node: Any) -> str:
    """'torch.nn.DataParallel' for the Name/Attribute chain ``node`` ('' for anything else)."""
    cst = _cst()
    if isinstance(node, cst.Name):
        return str(node.value)
    if isinstance(node, cst.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr.value}" if head else ""
    return ""


def _code(node: Any) -> str:
    return str(_cst().Module([]).code_for_node(node))


def _kw(call: Any, name: str) -> Optional[Any]:
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def _positional(call: Any) -> List[Any]:
    return [a for a in call.args if a.keyword is None and not a.star]


def _is_loader(call: Any) -> bool:
    return dotted(call.func).split(".")[-1] == "DataLoader"


def _training_loader(call: Any) -> bool:
    shuffle = _kw(call, "shuffle")
    positional = _positional(call)
    if shuffle is None and len(positional) >= 3:
        shuffle = positional[2]
    return shuffle is not None and _code(shuffle.value).strip() == "True"


def _already(source: str) -> str:
    """Why a script is DDP already ('' when it is not)."""
    for pattern, why in ((r"\bDistributedDataParallel\b", "it uses DistributedDataParallel"),
                         (r"\binit_process_group\b", "it calls init_process_group"),
                         (r"[\"']LOCAL_RANK[\"']", "it reads torchrun's LOCAL_RANK"),
                         (r"^\s*from\s+clusterddp\s+import\s+[^\n]*\bruntime\b|\bclusterddp\.runtime\b",
                          "it uses clusterddp's runtime")):
        if re.search(pattern, source, re.MULTILINE):
            return why
    return ""


def migrate_source(source: str, filename: str = "<script>", keep_global_batch: bool = False) -> Migration:
    """Rewrite ``source``; raises SpecError with the position when it does not parse."""
    cst = _cst()
    out = Migration(source)
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "syntax error"
        raise SpecError(f"{filename}:{exc.raw_line}:{exc.raw_column + 1}: does not parse as Python ({first}); "
                        "nothing was written") from None
    why = _already(source)
    if why:
        out.left_alone = f"{filename}: left alone: {why} (DDP already)"
        return out
    if not re.search(r"\bDataParallel\b", source):
        out.left_alone = (f"{filename}: left alone: no nn.DataParallel in it (wrap your model with runtime.wrap; "
                          "clusterddp new train.py writes a whole example)")
        return out
    from .transform import rewrite

    text, changes, findings = rewrite(module, keep_global_batch)
    out.text, out.changes, out.findings = text, changes, findings
    return out


def report(m: Migration, filename: str, keep_global_batch: bool) -> List[str]:
    """The lines for people: what changed, what to look at, the batch size said plainly."""
    lines = [f"{filename}:{line}: {what}" for line, what in sorted(m.changes)]
    if any("runtime.loader" in what for _, what in m.changes):
        lines.append(
            "batch size: " + ("--keep-global-batch: each rank takes batch_size // world size, so the global batch "
                              "stays what it was" if keep_global_batch else
                              "batch_size is now per rank (per GPU, as DataParallel's was per step): the global "
                              "batch grows with the world size (4 ranks: 4x); scale the learning rate with it (the "
                              "linear rule, with warm-up), or migrate with --keep-global-batch"))
    lines += [f"{filename}:{line}: to check: {what}" for line, what in sorted(m.findings)]
    return lines


Found = Union[Sequence[Tuple[int, str]], Set[Tuple[int, str]]]
