"""The LibCST passes of ``clusterddp migrate``: a survey (names and findings), then the rewrite. Imports libcst at
module level: ``rules.migrate_source`` loads this module only once LibCST is known to be there."""
from __future__ import annotations

import re
from typing import Any, List, Set, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .autograd import Autograd
from .loaders import Uses
from .patterns import (
    TIGHT,
    Average,
    Retest,
    cuda_literal,
    device_rewrite,
    fed_schedulers,
    makedirs_call,
    makedirs_unless_exists,
    with_keyword,
    without_init,
)
from .perrank import PerRank
from .stopping import Plan, loop_findings, plan
from .survey import Survey, line_of
from .syntax import IMPORT, code_of, dotted, is_loader, keyword, positional, training_loader
from .uniform import Flow, analyse

Lines = List[Tuple[int, str]]


def _main_guard(node: Any) -> bool:
    return isinstance(node, cst.If) and code_of(node.test).replace(" ", "").replace("'", '"') == '__name__=="__main__"'


class ToDDP(cst.CSTTransformer):
    """The rewrite; ``changes`` says what it did, line by line."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, survey: Survey, flow: Flow, keep_global_batch: bool, measure: bool = False) -> None:
        # measure: the original as it is (DataParallel, its devices, its saves and prints) but for what --check
        # needs to time it the same way: the training loader cut (runtime.loader, a world of one), the steps counted
        self.s, self.flow, self.keep, self.measure = survey, flow, keep_global_batch, measure
        self.init = "runtime.init(allow_single=True)" if measure else "runtime.init()"
        self.changes: Lines = []
        self.guarded = False
        self.retested: Set[int] = set()  # lines of the ifs whose test is now the world size
        self.later: Lines = []  # findings the rewrite makes
        self.loops: List[str] = []  # around the node: each loop's counter (for i in range(...)), else ""
        # the averages that make a decision every rank's (early stopping, best model: stopping.plan), found before
        # the walk (a helper the block calls may come first in the file)
        self.plan = Plan()

    def _did(self, node: Any, what: str) -> None:
        self.changes.append((line_of(self, node), what))

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> Any:
        name = dotted(original.func)
        if self.measure and not is_loader(original):
            return updated
        if self.s.is_dp(original):
            return self._wrap(original, updated)
        made = device_rewrite(original, updated, name, self.s.dp_functions)
        if made is not None:
            self._did(original, made[1])
            return made[0]
        if is_loader(original) and (training_loader(original) or id(original) in self.s.trains) and \
                id(original) not in self.s.evaluation and \
                not keyword(original, "sampler") \
                and not keyword(original, "batch_sampler") and len(positional(original)) <= 3:
            return self._loader(original, updated)
        if id(original) in self.s.bars and keyword(original, "disable") is None:
            self._did(original, "tqdm(...) -> tqdm(..., disable=not runtime.is_main()) (one progress bar, rank 0's)")
            return with_keyword(updated, "disable", "not runtime.is_main()") if updated.args else updated
        apart = self.flow.per_rank(original)
        if name == "torch.save" and len(updated.args) == 2 and all(a.keyword is None for a in updated.args):
            return self._save(original, updated, apart)
        if name == "print":
            return self._print(original, updated, apart)
        return updated

    def _loader(self, original: cst.Call, updated: cst.Call) -> Any:
        # DataLoader's default is no shuffle, runtime.loader's a shuffle: an unshuffled one keeps its order
        keep_order = id(original) in self.s.unshuffled and not any(a.star for a in updated.args)
        self._did(original, "DataLoader -> runtime.loader (each rank its share; " + (
            "shuffle=False, its order kept: it trains, a loop with a backward goes over it)" if keep_order else
            "a new shuffle every epoch)"))
        args = [self._per_rank(a, i) for i, a in enumerate(updated.args)] + self._epoch_of(original)
        if keep_order and keyword(original, "shuffle") is None and len(positional(original)) < 3:  # (not said yet)
            args.append(cst.Arg(cst.Name("False"), keyword=cst.Name("shuffle"), equal=TIGHT))
        for before, after in zip(updated.args, args):
            if after is not before:
                self._did(original, f"batch_size {code_of(before.value)} -> {code_of(after.value)} "
                          "(--keep-global-batch: the global batch stays what it was where the world size "
                          "divides it)")
        if self.keep and args == list(updated.args):
            self.later.append((line_of(self, original), "--keep-global-batch: this loader's batch size is not "
                               "one of its arguments here (in **kwargs, or the default 1), so it is not divided; "
                               "divide it where it is set: max(1, B // runtime.world_size())"))
        return updated.with_changes(func=cst.parse_expression("runtime.loader"), args=args)

    def _save(self, original: cst.Call, updated: cst.Call, apart: Any) -> Any:
        if apart is not None:  # only some ranks get here: waiting for the others would wait forever
            # (under a decision made on the ranks' average every rank is here; not waiting stays safe)
            decided = self.plan.decided.get(id(apart))
            alone = isinstance(apart, cst.Finally)  # (a rank's own exception brings it here alone)
            self._did(original, "torch.save -> runtime.save_on_main(..., wait=False) (rank 0 writes, atomically, "
                      + (f"the decision at line {line_of(self, decided)} being every rank's, on the average)"
                         if decided is not None else f"in a finally: line {line_of(self, apart)})" if alone else
                         f"when its own values lead it here: line {line_of(self, apart)})"))
            if decided is None and alone:
                self.later.append((line_of(self, original), "a save in a finally (line "
                                   f"{line_of(self, apart)}): a rank whose own exception brings it here comes "
                                   "alone, so it does not wait for the others (a wait would hang the job); what "
                                   "rank 0 writes there may be from before the others' last step"))
            elif decided is None:
                self.later.append((line_of(self, original), "rank 0 saves when its own values lead it here (line "
                                   f"{line_of(self, apart)}); for a decision of all ranks, average the value it "
                                   "tests first (runtime.all_reduce_mean) so that every rank takes the same "
                                   "branch"))
            return updated.with_changes(func=cst.parse_expression("runtime.save_on_main"), args=[
                *updated.args[:-1], updated.args[-1].with_changes(comma=cst.Comma(
                    whitespace_after=cst.SimpleWhitespace(" "))),
                cst.Arg(cst.Name("False"), keyword=cst.Name("wait"), equal=TIGHT)])
        self._did(original, "torch.save -> runtime.save_on_main (rank 0 writes, atomically; the others wait)")
        return updated.with_changes(func=cst.parse_expression("runtime.save_on_main"))

    def _print(self, original: cst.Call, updated: cst.Call, apart: Any) -> Any:
        averaged: Any = updated.visit(Average()) if apart is None else updated
        what = " (loss / accuracy averaged over the ranks)" if code_of(averaged) != code_of(updated) else ""
        decided = self.plan.decided.get(id(apart))
        if apart is not None and code_of(updated.visit(Average())) != code_of(updated):
            what = (" (not averaged: a rank's own exception may bring it to this finally alone, line "
                    f"{line_of(self, apart)}; an average would wait for the others forever)") \
                if isinstance(apart, cst.Finally) and decided is None else \
                (" (not averaged: whether a rank gets here depends on its own values, line "
                    f"{line_of(self, apart)}; an average would wait for the others forever)") if decided is None \
                else f" (not averaged, rank 0's own: kept so, though line {line_of(self, decided)} now decides on " \
                "the ranks' average)"
        self._did(original, f"print -> runtime.print0 (rank 0 prints){what}")
        return averaged.with_changes(func=cst.parse_expression("runtime.print0"))

    def visit_For(self, node: cst.For) -> None:
        counts = isinstance(node.iter, cst.Call) and dotted(node.iter.func) == "range" and \
            isinstance(node.target, cst.Name)
        self.loops.append(node.target.value if counts and isinstance(node.target, cst.Name) else "")

    def leave_For(self, original: cst.For, updated: cst.For) -> Any:
        self.loops.pop()
        return updated

    def visit_While(self, node: cst.While) -> None:
        self.loops.append("")

    def leave_While(self, original: cst.While, updated: cst.While) -> Any:
        self.loops.pop()
        return updated

    def _epoch_of(self, loader: cst.Call) -> List[cst.Arg]:
        """A loader made inside a loop: a new one would start at the first epoch's shuffle every time (the
        DataLoader it replaces shuffled anew); given the counter of the loop around it, it starts at that epoch."""
        counter = next((name for name in reversed(self.loops) if name), "")
        if not self.loops or keyword(loader, "epoch") is not None:
            return []
        if not counter:
            self.later.append((line_of(self, loader), "a training loader made inside a loop that counts nothing: "
                               "each new one starts at the first epoch's shuffle; make it once before the loop, or "
                               "give it runtime.loader(..., epoch=N)"))
            return []
        self._did(loader, f"runtime.loader(..., epoch={counter}) (made anew each time round the loop: it starts at "
                          f"that epoch's shuffle, as the DataLoader shuffled anew)")
        return [cst.Arg(cst.Name(counter), keyword=cst.Name("epoch"), equal=TIGHT)]

    def _wrap(self, original: cst.Call, updated: cst.Call) -> Any:
        """DataParallel(model, ...) or DataParallel(module=model) -> runtime.wrap(model); anything else is listed:
        left as it is, each rank would run DataParallel over the GPUs it sees."""
        given = positional(original) or [a for a in original.args if a.keyword and a.keyword.value == "module"]
        now = positional(updated) or [a for a in updated.args if a.keyword and a.keyword.value == "module"]
        if not given:
            self.later.append((line_of(self, original), f"{code_of(original)} is not rewritten (its model is not a "
                               "plain argument): as it is, every rank would run DataParallel; write "
                               "runtime.wrap(model) there"))
            return updated
        self._did(original, f"{code_of(original)} -> runtime.wrap({code_of(given[0].value)})")
        return cst.parse_expression(f"runtime.wrap({code_of(now[0].value)})")

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> Any:
        if self.measure or original.keyword is None or original.keyword.value != "device" or \
                not cuda_literal(original.value):
            return updated
        self._did(original, f"device={code_of(original.value)} -> device=runtime.device() (the rank's own GPU)")
        return updated.with_changes(value=cst.parse_expression("runtime.device()"))

    def _per_rank(self, arg: cst.Arg, index: int) -> cst.Arg:
        is_batch = (arg.keyword is not None and arg.keyword.value == "batch_size") or (arg.keyword is None and
                                                                                      index == 1)
        if not self.keep or not is_batch or arg.star:
            return arg
        return arg.with_changes(value=cst.parse_expression(f"max(1, ({code_of(arg.value)}) // runtime.world_size())"))

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> Any:
        if not self.measure and original.attr.value == "module" and isinstance(original.value, cst.Name) and \
                original.value.value in self.s.wrapped:
            self._did(original, f"{original.value.value}.module -> runtime.unwrap({original.value.value})")
            return cst.parse_expression(f"runtime.unwrap({original.value.value})")
        return updated

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine) -> Any:
        steps = [i for i, one in enumerate(original.body) if isinstance(one, cst.Expr) and
                 isinstance(one.value, cst.Call) and isinstance(one.value.func, cst.Attribute) and
                 one.value.func.attr.value == "step" and isinstance(one.value.func.value, cst.Name) and
                 one.value.func.value.value in self.s.optimizers]
        if not steps:
            return updated
        self._did(original, "runtime.step() after the optimizer step (clusterddp top and report count steps)")
        if len(original.body) == 1:
            return cst.FlattenSentinel([updated, cst.parse_statement("runtime.step()\n")])
        # `opt.zero_grad(); loss.backward(); opt.step(); return loss`: in the line, right after the step
        body = list(updated.body)
        body.insert(steps[-1] + 1, cst.Expr(cst.parse_expression("runtime.step()")))
        body = [one.with_changes(semicolon=cst.Semicolon(whitespace_after=cst.SimpleWhitespace(" ")))
                for one in body[:-1]] + [body[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)]
        return updated.with_changes(body=body)

    def on_leave(self, original_node: Any, updated_node: Any) -> Any:
        """After any statement's own rewrite: ``score = runtime.all_reduce_mean(score)`` before it where a decision
        that each rank would take on its own share's score (``if score < best: best = score``, early stopping) is to
        be made on the average: every rank takes the same branch, as the one process did on the whole set."""
        done = super().on_leave(original_node, updated_node)
        averages = self.plan.averages.get(id(original_node), [])
        if not averages:
            return done
        made = [cst.parse_statement(f"{score} = runtime.all_reduce_mean({score})\n") for score, _ in averages]
        for _, what in averages:
            self._did(original_node, what)
        nodes: List[Any] = list(done.nodes) if isinstance(done, cst.FlattenSentinel) else [done]
        made[0] = made[0].with_changes(leading_lines=nodes[0].leading_lines)
        return cst.FlattenSentinel([*made, nodes[0].with_changes(leading_lines=[]), *nodes[1:]])

    def leave_If(self, original: cst.If, updated: cst.If) -> Any:
        made = makedirs_unless_exists(original)
        if made is not None and not self.measure:
            # every rank tests, then makes: all but the first die of FileExistsError. The call alone changes (the
            # test stays as the user wrote it: a diff of one line).
            self._did(makedirs_call(original), f"os.makedirs({made}) -> os.makedirs({made}, exist_ok=True) (every "
                                               "rank finds it missing, only one makes it: the others would fail)")
            call = makedirs_call(updated)
            return updated.deep_replace(call, call.with_changes(args=[
                call.args[0].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                cst.Arg(cst.Name("True"), keyword=cst.Name("exist_ok"), equal=TIGHT)]))
        if not self.measure and not _main_guard(original) and isinstance(original.body, cst.IndentedBlock) and \
                "runtime." not in code_of(original.test) and \
                any(re.search(rf"\b({'|'.join(self.s.dp_names)})\(", code_of(s)) for s in original.body.body):
            return self._wrap_condition(original, updated)
        if not _main_guard(original) or not isinstance(updated.body, cst.IndentedBlock):
            return updated
        self.guarded = True
        self._did(original, "the entry point runs after runtime.init(), in try: ... finally: runtime.shutdown() (its "
                            "lines indented one level: sys.exit(), an exception or a return still shut down)")
        guarded = cst.Try(body=updated.body.with_changes(header=cst.TrailingWhitespace()),
                          finalbody=cst.Finally(body=cst.IndentedBlock([cst.parse_statement("runtime.shutdown()\n")])))
        return updated.with_changes(body=updated.body.with_changes(body=[cst.parse_statement(f"{self.init}\n"),
                                                                         guarded]))

    def _wrap_condition(self, original: cst.If, updated: cst.If) -> Any:
        """The if around the DataParallel wrap. Only its GPU-count comparisons are the world size now ("if
        device_count() > 1": under DDP each rank has one GPU, so the wrap would never happen and every rank would
        train its own copy); any other test (a switch of the script's, is_available()) is kept and listed."""
        retest = Retest()
        test = updated.test.visit(retest)
        if not retest.done:
            self.later.append((line_of(self, original), f"the DDP wrap is under `if {code_of(original.test)}:`, kept "
                               "as written: where it is false, no model goes through runtime.wrap and each rank trains "
                               "its own copy (nothing is averaged); make sure it holds on every DDP run"))
            return updated
        self.retested.add(line_of(self, original))
        self._did(original, f"if {code_of(original.test)}: (the DataParallel wrap's condition) -> if "
                            f"{code_of(test)}: (each rank has one GPU: the job's ranks decide)")
        return updated.with_changes(test=test)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        body = list(updated.body)
        at = 0
        for i, statement in enumerate(body):
            text = code_of(statement).lstrip()
            if text.startswith(("import ", "from ")) or (i == 0 and text.startswith(('"', "'"))):
                at = i + 1
        added = [cst.parse_statement(IMPORT + "\n")]
        early = self.guarded and any("runtime." in code_of(b) for b in body[at:] if not _main_guard(b) and
                                     not isinstance(b, (cst.FunctionDef, cst.ClassDef)))
        if early:  # module-level code asks the runtime (a device chosen at import): init before it, not in the guard
            body = [without_init(b, self.init) if _main_guard(b) else b for b in body]
        if not self.guarded or early:  # without a main guard, the whole module is the entry point
            added.append(cst.parse_statement(f"{self.init}\n"))
        if not self.guarded:
            body.append(cst.parse_statement("runtime.shutdown()\n"))
        self.changes.append((1, f"{IMPORT}" + ("" if self.guarded and not early else "; runtime.init() after the "
                                               "imports (module-level code uses the runtime)" if early else
                                               "; runtime.init() after the imports, runtime.shutdown() at the end")))
        return updated.with_changes(body=body[:at] + added + body[at:])


def rewrite(module: cst.Module, keep_global_batch: bool, measure: bool = False) -> Tuple[str, Lines, Lines]:
    """The new text, the changes and the findings."""
    wrapper = MetadataWrapper(module)
    uses = Uses()
    wrapper.visit(uses)
    survey = Survey(uses)
    wrapper.visit(survey)
    per_rank, grads = PerRank(), Autograd(survey.wrapped, survey.is_dp)
    wrapper.visit(per_rank)
    wrapper.visit(grads)
    flow = analyse(wrapper.module)
    transformer = ToDDP(survey, flow, keep_global_batch, measure)
    transformer.plan = Plan() if measure else plan(wrapper, flow)
    fed: Lines = []
    if not measure:
        averages, fed = fed_schedulers(wrapper, flow, survey.schedulers)
        for key, made in averages.items():
            have = transformer.plan.averages.setdefault(key, [])
            have += [one for one in made if all(one[0] != score for score, _ in have)]
    new = wrapper.visit(transformer)
    findings = {(line, what) for line, what in survey.findings if line not in transformer.retested}
    if not measure:
        findings |= set(per_rank.findings) | set(grads.findings) | set(grads.wraps())
        if not any("-> runtime.wrap(" in what for _, what in transformer.changes):
            findings.add((1, "no model goes through runtime.wrap in this script: each rank would train its own copy "
                             "(nothing averaged); wrap the model that trains (model = runtime.wrap(model))"))
    findings |= set(transformer.later) | set(transformer.plan.findings) | set(fed) | \
        set(loop_findings(wrapper, flow, transformer.plan.fixed))
    return new.code, transformer.changes, sorted(findings)
