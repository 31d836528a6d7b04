"""Early stopping made every rank's (issue 54). Once each rank has its own share, a validation loss computed on it
differs by rank, and so does the epoch at which early stopping ``break``s on a rank: the others go on into the next
epoch's backward and wait there forever. Where every rank reaches the test and the value it tests is one number
computed from the rank's data, it is averaged over the ranks once, where it is computed (after the statement of the
test's block that sets it last; else just before the test, as the best-model rule does), so that the best value, the
counter, the flag and the break are the same on every rank.

Not by pattern alone: the analysis runs again as if the average were there (``uniform.analyse`` with the reads it
precedes shared), and the rewrite is made only where the loop is then left by every rank together and the average
itself is reached by every rank. Anything else keeps its listing. Imports libcst (loaded by ``transform``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .exits import ends, exits_if
from .helper import doubt
from .patterns import best_decision
from .syntax import code_of, dotted
from .uniform import MUTATORS, Flow, analyse
from .walk import blocks, sources, walk

Lines = List[Tuple[int, str]]
ORDER = (cst.LessThan, cst.GreaterThan, cst.LessThanEqual, cst.GreaterThanEqual)


@dataclass
class Candidate:
    anchor: Any       # the statement that tests the score (or feeds it to a helper)
    block: Any        # the statements it is one of
    score: str        # the name averaged
    helper: str = ""  # an object it is fed to and tested on after (``early_stopping(val_loss, model)``)
    unit: str = "epoch"  # what the loop counts
    at: Any = None    # the statement the average goes before: where the score is computed, in the anchor's block


@dataclass
class Plan:
    averages: Dict[int, List[Tuple[str, str]]] = field(default_factory=dict)  # id(statement) -> (score, change)
    decided: Dict[int, Any] = field(default_factory=dict)  # id(a per-rank test) -> the test now on the average
    fixed: Set[int] = field(default_factory=set)  # id(loop): the ranks leave it together now
    findings: Lines = field(default_factory=list)


def _fed(call: Any, flow: Flow, odd: Set[str]) -> List[Tuple[str, str]]:
    """(score, helper) for ``check(val_loss)`` (the script's function), ``history.append(val_loss)``, or
    ``stopper(val_loss)`` / ``stopper.step(val_loss)`` (an object of the rank's own, tested after)."""
    func = call.func
    head = func.value if isinstance(func, cst.Attribute) else func
    if dotted(func) in flow.functions or (isinstance(func, cst.Attribute) and func.attr.value in MUTATORS):
        helper = ""  # (its body, or what is put in the list, is followed by the analysis itself)
    elif isinstance(head, cst.Name) and head.value in flow.names:
        helper = head.value
    else:
        return []
    return [(a.value.value, helper) for a in call.args if isinstance(a.value, cst.Name) and
            a.value.value in flow.names and a.value.value not in odd]


def _tested(st: Any, flow: Flow, odd: Set[str]) -> List[Tuple[str, str]]:
    """(score, helper) for each number of the rank's own that ``st`` tests or feeds to a helper."""
    if isinstance(st, cst.If):
        seen = walk(st.test)
        found = [(n.value, "") for c in seen.comparisons if any(isinstance(t.operator, ORDER) for t in c.comparisons)
                 for n in [c.left] + [t.comparator for t in c.comparisons]
                 if isinstance(n, cst.Name) and n.value in flow.names and n.value not in odd]
        return found + [pair for call in seen.calls for pair in _fed(call, flow, odd)]
    value = getattr(st.body[0], "value", None) if isinstance(st, cst.SimpleStatementLine) and len(st.body) == 1 \
        else None  # (early_stopping(val_loss, model); stop = stopper.step(val_loss))
    return _fed(value, flow, odd) if isinstance(value, cst.Call) else []


def _candidates(loop: Any, flow: Flow, odd: Set[str], sources: Set[str]) -> List[Candidate]:
    """Each number computed from the rank's own data (never a counter, a flag or a copy: walk.sources) that a
    statement in ``loop`` tests, or gives to a helper that a test there reads after."""
    found: List[Candidate] = []
    inside = list(blocks(loop.body, loop))
    tests = [st.test for block, _ in inside for st in block if isinstance(st, (cst.If, cst.While))]
    tested = {n.value for n in walk(*tests, *([loop.test] if isinstance(loop, cst.While) else [])).reads}
    for block, inner in inside:
        for st in block:
            for score, helper in _tested(st, flow, odd):
                if score in sources and (not helper or helper in tested) and \
                        not any(c.anchor is st and c.score == score for c in found):
                    found.append(Candidate(st, block, score, helper, _unit(inner), _hoist(block, st, score)))
    return found


def _hoist(block: Any, anchor: Any, score: str) -> Any:
    """Where the average goes: right after the statement of ``anchor``'s block that last sets the score before it
    (so that all that uses it after, a scheduler's step too, sees the average), else at the block's start. Every
    rank runs those statements as often as the anchor: an exit of the rank's own between would leave the loop apart
    (and the candidate fails)."""
    at = next(i for i, st in enumerate(block) if st is anchor)
    while at > 0 and score not in walk(block[at - 1]).assigned:
        at -= 1
    return block[at]


def _region(c: Candidate) -> Set[int]:
    """The reads of the score that the average before ``c.at`` reaches: the rest of its block, up to a statement
    that sets the score again."""
    at = next(i for i, st in enumerate(c.block) if st is c.at)
    reads: Set[int] = set()
    for st in c.block[at:]:
        seen = walk(st)
        if c.score in seen.assigned:
            break
        reads |= {id(n) for n in seen.reads if n.value == c.score}
    return reads


def _reached(c: Candidate, flow: Flow) -> bool:
    """Every rank gets to ``c.anchor`` as often as the others (so the average there waits for nobody forever)."""
    if isinstance(c.anchor, cst.If):
        return flow.if_control.get(id(c.anchor), flow) is None
    return all(flow.per_rank(call) is None for call in walk(c.anchor).calls)


def _what_if(module: Any, chosen: List[Candidate]) -> Flow:
    shared: Set[int] = set()
    for c in chosen:
        shared |= _region(c)
    return analyse(module, shared, {c.helper for c in chosen if c.helper})


def _choose(module: Any, loop: Any, chosen: List[Candidate], cands: List[Candidate]) -> Optional[List[Candidate]]:
    """The fewest candidates whose averages (with those ``chosen`` already) let every rank leave ``loop`` together
    (None where none do): what is fed to a helper is dropped first, then later tests, so that the average kept is
    the first, where the number is computed."""
    def works(sel: List[Candidate]) -> bool:
        flow = _what_if(module, chosen + sel)
        return all(other is not loop for other, _ in flow.diverging) and all(_reached(c, flow) for c in chosen + sel)

    if chosen and works([]):
        return []
    if not cands or not works(cands):
        return None
    sel = list(cands)
    for c in sorted(reversed(cands), key=lambda c: not c.helper):
        rest = [d for d in sel if d is not c]
        if rest and works(rest):
            sel = rest
    return sel


def _unit(loop: Any) -> str:
    """'step' for a loop over batches (``for x, y in loader``), else 'epoch'."""
    it = getattr(loop, "iter", None)
    if isinstance(it, cst.Call) and dotted(it.func) == "enumerate" and it.args:
        it = it.args[0].value
    return "step" if isinstance(it, (cst.Name, cst.Attribute)) else "epoch"


def _head(anchor: Any) -> str:
    return f"`if {code_of(anchor.test)}:`" if isinstance(anchor, cst.If) else f"`{code_of(anchor.body[0])}`"


def _said(c: Candidate, kind: str, doubt: str, line: int) -> Tuple[str, str]:
    """The change at the average, and (where the helper is not seen to decide from its values alone) the finding."""
    said = f"{c.score} = runtime.all_reduce_mean({c.score}) " + (
        f"before {_head(c.anchor)}: " if c.at is c.anchor else f"once it is computed (for {_head(c.anchor)}, line "
        f"{line}): ")
    if doubt:
        return said + f"{c.helper} is given the ranks' average {c.score}", (
            f"early stopping through {c.helper}: {doubt}; it is given the ranks' average {c.score}, so every rank "
            f"stops at the same {c.unit} if {kind} decides from the values it is given alone (pytorchtools' "
            f"EarlyStopping does); if not, the ranks may stop at different {c.unit}s and the ones that go on wait "
            "forever in DDP's backward (a hang): make it decide on values every rank shares (runtime.all_reduce_mean)")
    return said + f"early stopping decided on the ranks' average {c.score}" + (
        f" ({kind}, in this script, decides from the values it is given)" if kind else "") + \
        f": every rank stops at the same {c.unit}", ""


def plan(wrapper: MetadataWrapper, flow: Flow) -> Plan:
    """The averages that make early stopping every rank's, then those of best-model decisions
    (patterns.best_decision) on the flow of the script as rewritten."""
    module, where, out = wrapper.module, wrapper.resolve(PositionProvider), Plan()
    every, computed, chosen = walk(module, deep=True), sources(module), []  # type: ignore[var-annotated]
    for loop, why in flow.diverging:
        sel = _choose(module, loop, chosen, _candidates(loop, flow, every.odd, computed))
        if sel is not None:
            chosen += [c for c in sel if all(c.at is not d.at or c.score != d.score for d in chosen)]
            inside = {id(st) for block, _ in blocks(loop.body, loop) for st in block}
            out.fixed.add(id(loop))
            out.decided[id(why)] = next((c.anchor for c in sel + chosen if id(c.anchor) in inside), chosen[0].anchor)
    final, trusted = _what_if(module, chosen), []
    for c in chosen:
        kind, why_not, cls = doubt(module, c.helper, final) if c.helper else ("", "", None)
        said, finding = _said(c, kind, why_not, where[c.anchor].start.line)
        out.averages.setdefault(id(c.at), []).append((c.score, said))
        if finding:
            out.findings.append((where[c.anchor].start.line, finding))
        else:
            trusted.append(c)
        for node in walk(cls, deep=True).ifs if cls is not None else []:
            out.decided.setdefault(id(node), c.anchor)  # (its saves: on the average too)
    safe = _what_if(module, trusted) if chosen else flow
    for node in every.ifs:
        score = best_decision(node, safe) if id(node) not in every.elifs else None
        if score is not None and all(score != other for other, _ in out.averages.get(id(node), [])):
            out.averages.setdefault(id(node), []).append((score, (
                f"{score} = runtime.all_reduce_mean({score}) before `if {code_of(node.test)}:` (each rank scores "
                "on its own data or in its own float order: the decision is now every rank's, on the average)")))
            out.decided.setdefault(id(node), node)
    return out


_SHARE = ("DDP's backward waits for every rank, so the job would hang; test a value every rank shares, e.g. "
          "runtime.all_reduce_mean(x), so that all take the same branch")


def _leaves(why: Any) -> bool:
    """A while loop's own test, or an if that breaks, returns or ends the process (not one that only skips a
    step)."""
    found = exits_if(why, True) if isinstance(why, cst.If) else None
    return isinstance(why, cst.While) or any(isinstance(small, cst.Break) or ends(small)
                                             for small in getattr(found, "body", ()))


def loop_findings(wrapper: MetadataWrapper, flow: Flow, fixed: Set[int]) -> Lines:
    """The loops whose steps ranks may leave or skip apart, where a step all-reduces (a backward), but for those
    made every rank's (``fixed``); backward passes that only some ranks run."""
    where = wrapper.resolve(PositionProvider)
    out = []
    exits = {id(why) for _, why in flow.diverging}
    for node, at in where.items():
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value == "backward"):
            continue
        test = flow.per_rank(node)
        if test is not None and id(test) not in exits:
            out.append((at.start.line, f"a backward that only some ranks run (the test at line "
                        f"{where[test].start.line} uses values of the rank's own): {_SHARE}"))
    for loop, why in flow.diverging:
        if id(loop) in fixed or ".backward(" not in code_of(loop.body):
            continue
        if isinstance(why, cst.ExceptHandler):
            out.append((where[why].start.line, "an except handler that leaves this loop's step (continue, break or "
                        "return) on the rank that raised: the others go on into DDP's backward and wait for it "
                        "there (a hang, or gradients paired with another step's); end the job there (raise), or "
                        "let every rank skip the step together on a shared flag (runtime.all_reduce_mean)"))
            continue
        if not isinstance(why, (cst.If, cst.While)):
            continue
        unit = _unit(loop)
        out.append((where[why].start.line, "the ranks may leave or skip this loop's steps apart (the test uses "
                    "values of the rank's own): " + (
                        "early stopping the rewrite could not make every rank's (what it tests is not one number it "
                        f"can follow to here): each rank may stop at a different {unit}, and the ones that go on wait "
                        "forever in DDP's backward (a hang); average that number first, where every rank computes it "
                        "(x = runtime.all_reduce_mean(x)), so that all stop together"
                        if _leaves(why) else _SHARE)))
    return out
