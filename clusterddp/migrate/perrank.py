"""What every rank would do alike where one process did it once (issue 75): writers made on every rank (a
TensorBoard SummaryWriter, a log file of ``logging.basicConfig``), and devices the script chooses itself
(``CUDA_VISIBLE_DEVICES`` set in the script, ``torch.cuda.set_device``, a ``f"cuda:{i}"`` string): under DDP the
launcher gives each rank its GPU, and ``runtime.device()`` names it. Listed with their lines. Imports libcst (loaded by
``transform``)."""
from __future__ import annotations

from typing import List, Tuple

import libcst as cst
from libcst.metadata import PositionProvider

from .syntax import code_of, dotted, keyword

Lines = List[Tuple[int, str]]


class PerRank(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.findings: Lines = []
        self.devices = 0  # inside torch.device("cuda...") calls, which the rewrite makes runtime.device()

    def _at(self, node: cst.CSTNode, what: str) -> None:
        self.findings.append((int(self.get_metadata(PositionProvider, node).start.line), what))

    def visit_Call(self, node: cst.Call) -> None:
        name = dotted(node.func)
        last = name.split(".")[-1]
        if name == "torch.device" and "cuda" in code_of(node):
            self.devices += 1
        if last == "SummaryWriter":
            self._at(node, "every rank makes a SummaryWriter: the ranks write event files of one run at once (the "
                           "curves interleave, or each rank's run shows apart); make it on rank 0 only (writer = "
                           "SummaryWriter(...) if runtime.is_main() else None, its calls under the same test), or "
                           "give each rank a log_dir of its own (runtime.rank())")
        elif name in ("logging.basicConfig", "basicConfig") and keyword(node, "filename") is not None:
            self._at(node, "every rank opens this log file (logging.basicConfig(filename=...)): the ranks write one "
                           "path at once, and filemode='w' empties it under the others; log to a file on rank 0 "
                           "only (if runtime.is_main():), or name it per rank (runtime.rank())")
        elif last == "partial" and node.args and dotted(node.args[0].value).split(".")[-1] == "DataLoader":
            self._at(node, "a DataLoader made through functools.partial is not rewritten: as it is, every rank goes "
                           "through the whole set in its own order; make the training loader with runtime.loader("
                           "...) (each rank its share)")
        elif name in ("torch.cuda.set_device", "cuda.set_device"):
            self._at(node, "torch.cuda.set_device: every rank would pick the same GPU; runtime.init() has already "
                           "given this rank its own (runtime.device()): remove it")

    def leave_Call(self, original_node: cst.Call) -> None:
        if dotted(original_node.func) == "torch.device" and "cuda" in code_of(original_node):
            self.devices -= 1

    def visit_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            target = code_of(t.target).replace("'", '"').replace(" ", "")
            if target in ('os.environ["CUDA_VISIBLE_DEVICES"]', 'environ["CUDA_VISIBLE_DEVICES"]'):
                self._at(node, "CUDA_VISIBLE_DEVICES set by the script: under DDP the launcher gives each rank its "
                               "GPU (runtime.device()); set here, every rank sees the same GPUs (or none it was "
                               "given): remove it and choose the GPUs with the job (clusterddp submit --gpus)")

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        head = node.parts[0] if node.parts else None
        if isinstance(head, cst.FormattedStringText) and head.value.startswith("cuda:") and len(node.parts) > 1 \
                and not self.devices:
            self._at(node, f"{code_of(node)}: a GPU the script chooses; under DDP each rank has its own, "
                           "runtime.device(): use that")
