"""The DataParallel -> DDP rewrite (LibCST): the patterns with one right answer are rewritten, the rest is listed.

Rewritten: ``nn.DataParallel(model, ...)`` -> ``runtime.wrap(model)``; ``torch.device("cuda" ...)`` ->
``runtime.device()``; ``x.cuda()`` -> ``x.to(runtime.device())``; a training ``DataLoader(..., shuffle=True)`` ->
``runtime.loader(...)`` (each rank its share, a new shuffle every epoch); ``torch.save`` -> ``runtime.save_on_main``;
``model.module`` -> ``runtime.unwrap(model)``; ``print`` -> ``runtime.print0`` with ``loss.item()`` /
``acc.item()`` averaged over the ranks; ``runtime.step()`` after each optimizer step (the observatory's steps); the
entry point between ``runtime.init()`` and ``runtime.shutdown()``. Listed with FILE:LINE: what is not safe to touch.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ..errors import ClusterDDPError, SpecError
from .syntax import libcst_module


@dataclass
class Migration:
    """The result: the new text (None when the script was left alone), what changed, what to look at, and why a
    script was left alone."""

    source: str
    text: Optional[str] = None
    changes: List[Tuple[int, str]] = field(default_factory=list)
    findings: List[Tuple[int, str]] = field(default_factory=list)
    left_alone: str = ""


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
    cst = libcst_module()
    out = Migration(source)
    too_deep = ClusterDDPError(f"{filename}: nested too deeply for the rewrite to follow (Python's recursion limit); "
                               "nothing was written: split the deepest expression into names")
    try:
        ast.parse(source, filename)  # Python's own parser first: its line and message are the ones to trust
        module = cst.parse_module(source)
    except SyntaxError as exc:
        raise SpecError(f"{filename}:{exc.lineno}:{exc.offset}: does not parse as Python ({exc.msg}); nothing "
                        "was written") from None
    except cst.ParserSyntaxError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "syntax error"
        raise SpecError(f"{filename}:{exc.raw_line}:{exc.raw_column + 1}: does not parse as Python ({first}); "
                        "nothing was written") from None
    except (RecursionError, MemoryError):
        raise too_deep from None
    why = _already(source)
    if why:
        out.left_alone = f"{filename}: left alone: {why} (DDP already)"
        return out
    if not re.search(r"\bDataParallel\b|\bdata_parallel\(", source):
        out.left_alone = (f"{filename}: left alone: no nn.DataParallel in it (wrap your model with runtime.wrap; "
                          "clusterddp new train.py writes a whole example)")
        return out
    from .transform import rewrite

    try:
        text, changes, findings = rewrite(module, keep_global_batch)
    except RecursionError:
        raise too_deep from None
    out.text, out.changes, out.findings = text, changes, findings
    return out


def measuring_source(source: str) -> str:
    """The original as it runs under DataParallel, for --compare-dp to time as it times the migrated one: only its
    training loader cut (runtime.loader in a world of one), its optimizer steps counted, its entry point between
    runtime.init(allow_single=True) and runtime.shutdown(). ``source`` parsed already (migrate_source)."""
    from .transform import rewrite

    return rewrite(libcst_module().parse_module(source), False, measure=True)[0]


def report(m: Migration, filename: str, keep_global_batch: bool) -> List[str]:
    """The lines for people: what changed, what to look at, the batch size said plainly."""
    lines = [f"{filename}:{line}: {what}" for line, what in sorted(m.changes)]
    if any("runtime.loader" in what for _, what in m.changes):
        lines.append(
            "batch size: " + ("--keep-global-batch: each rank takes batch_size // world size, so the global batch "
                              "stays what it was" if keep_global_batch else
                              "batch_size is now per rank; DataParallel split it over the GPUs, so the global batch "
                              "is now batch_size x the world size (4 ranks: 4x); scale the learning rate with it "
                              "(the linear rule, with warm-up), or migrate with --keep-global-batch"))
    lines += [f"{filename}:{line}: to check: {what}" for line, what in sorted(m.findings)]
    return lines

