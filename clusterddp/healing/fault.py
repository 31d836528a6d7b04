"""A fault as data: whose fault a failed attempt was (FaultKind), on which nodes, why, and the evidence that
decided it. The leaf the healing wing's readers (faults, memory, hangs) and its supervisor share."""
from __future__ import annotations

from enum import Enum
from typing import Iterable, NamedTuple, Tuple

from ..hostlist import is_node_name
from ..rollcall import printable


class FaultKind(str, Enum):
    """Whose fault a failed attempt was, as the batch script and attempts.tsv write it."""

    INFRASTRUCTURE = "infrastructure"  # a node or the network, on Slurm's or clusterddp's own word: without it
    SUSPECT = "suspect"                # every rank of a node ended by a signal, nothing from Slurm: without it where
    #                                    a spare is free, else in place; no quarantine unless it happens again there
    AMBIGUOUS = "ambiguous"            # one rank killed, a segfault, a hang in the script's code: once in place
    PROGRAM = "program"                # the program itself: never retried
    AFTER_WORK = "after-work"          # a rank failed after its work ended: the results are intact, not retried
    UNKNOWN = "unknown"                # nothing the job left tells one from the other
    GATE = "gate"                      # the health gate itself could not run: no node is blamed; tried once more

    __str__ = str.__str__              # written as the word, not FaultKind.X
    __format__ = str.__format__        # type: ignore[assignment]
    __hash__ = str.__hash__          # in a set or dict, the same key as the word


INFRASTRUCTURE = FaultKind.INFRASTRUCTURE
SUSPECT = FaultKind.SUSPECT
AMBIGUOUS = FaultKind.AMBIGUOUS
PROGRAM = FaultKind.PROGRAM
AFTER_WORK = FaultKind.AFTER_WORK

class Fault(NamedTuple):
    kind: FaultKind
    nodes: Tuple[str, ...]    # the node(s) at fault, where known (infrastructure; ambiguous: where it happened)
    why: str                  # one line for people
    signal: str = ""          # srun's word for the signal that ended the first rank ("Killed"), where one did
    ranks: Tuple[int, ...] = ()  # the rank(s) that failed first, where known
    evidence: str = ""        # what decided it: the file (in the run directory) and its line

    def line(self) -> str:
        at = f" on {','.join(self.nodes)}" if self.nodes else ""
        what = {INFRASTRUCTURE: "a node or the network, not the program", PROGRAM: "the program",
                SUSPECT: "probably the node: tried without it where a spare is free, not quarantined",
                AMBIGUOUS: "a node or the program: nothing else said"}.get(self.kind, "")
        return f"fault: {self.kind}{at}: {self.why}" + (f" ({what})" if what else "") + \
            (f"; evidence: {self.evidence}" if self.evidence else "")


def cite(name: str, line: str) -> str:
    """Evidence as one printable phrase: 'srun-0.0.err: "srun: error: node2: tasks 2-3: Killed"'."""
    return printable(f'{name}: "{line.strip()[:200]}"')


def clean_nodes(nodes: Iterable[str]) -> Tuple[str, ...]:
    """Node names as data: only hostname characters (they may reach an #SBATCH --exclude line)."""
    return tuple(sorted({n for n in nodes if n and is_node_name(n)}))
