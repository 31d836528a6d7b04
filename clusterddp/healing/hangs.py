"""A hang the watchdog ended: whose fault, from its roll call. Ranks that did not answer while the others did are
their node's; a rank stuck in the script's own code, or in a call the others are not in, blames nobody (the program's
when it comes back at the same place); a tie tells nothing; a roll call that cannot be read tells nothing either."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..datafiles import read_json
from ..rollcall import is_rank, printable, read_hellos
from .fault import AMBIGUOUS, INFRASTRUCTURE, Fault, FaultKind, clean_nodes


def hang_fault(run_dir: Path, hang: dict, restart: Optional[int] = None) -> Fault:
    """The hang watchdog ended the job: whose fault, from its roll call. Ranks that did not answer while the others
    did are their node's (a rank that cannot be reached at all); a rank stuck in the script's own code, or in a
    collective the others are not in, is the commonest DDP hang, the program's (one retry in place, nobody blamed;
    the same place again is the program's); a tie, or every rank at one place, tells nothing."""
    call = read_json(Path(hang["dir"]) / "rollcall.json")
    evidence = printable(f"stacks/{Path(hang['dir']).name}/rollcall.json (the ranks' roll call)")
    groups = [g for g in (call.get("groups") if isinstance(call, dict) else None) or [] if isinstance(g, dict)]
    missing = [m.get("rank") for m in (call.get("missing") if isinstance(call, dict) else None) or []
               if isinstance(m, dict) and is_rank(m.get("rank"))]
    said = f"the hang watchdog ended the job ({hang['summary']})"
    if not isinstance(call, dict) or not isinstance(call.get("groups"), list):  # not a roll call the runtime wrote
        return Fault(FaultKind.UNKNOWN, (), f"{said}, but its roll call (rollcall.json) cannot be read: who is at "
                     "fault is not known", evidence=evidence)
    if missing and groups:
        hellos = read_hellos(Path(run_dir), restart)
        answered = {str(n) for g in groups for n in g.get("nodes") or []}
        where = {hellos[r]["node"] for r in missing if r in hellos}
        silent = clean_nodes(where - answered)
        if silent and all(r in hellos for r in missing) and where <= set(silent):
            return Fault(INFRASTRUCTURE, silent, f"{said}: rank(s) {','.join(map(str, missing[:16]))} on "
                         f"{','.join(silent)} did not answer the roll call that every other rank answered",
                         evidence=evidence)
    sizes = [len(g.get("ranks") or []) for g in groups]
    if len(groups) > 1 and sizes[0] > max(sizes[1:]):
        odd = groups[1:]
        own = all(not g.get("waiting_in") for g in odd)
        place = hang_place(call)
        what = ("stuck in the script's own code" if own else "waiting in a call the others are not in")
        return Fault(AMBIGUOUS, (), f"{said}: the odd rank(s) {what} at {place or '?'} while the others wait: most "
                     "likely the program (a rank-conditional branch or collective), retried once in place",
                     evidence=evidence)
    return Fault(AMBIGUOUS, (), f"{said}: no rank stands out (a tie, or every rank at one place): who is at fault is "
                 "not known, retried once in place", evidence=evidence)


def hang_place(call: object) -> str:
    """Where a hang's odd ones out wait (else everyone): the innermost frame as FILE:LINE, or ''."""
    groups = call.get("groups") if isinstance(call, dict) else None
    if not isinstance(groups, list) or not groups:
        return ""
    group = groups[1] if len(groups) > 1 else groups[0]
    frames = group.get("frames") if isinstance(group, dict) else None
    return printable(str(frames[0]))[:200] if isinstance(frames, list) and frames else ""
