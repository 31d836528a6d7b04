"""The supervisor's verdict against ground truth (tests/healing_sim.py): for each kind of failure a job can meet, the
simulator writes what such an attempt leaves (srun's stderr, the ranks' and torchrun's logs, slurmstepd's lines,
the runtime's records, attempts.tsv, sinfo) and asks ``python -m clusterddp.healing next`` in-process; the expected
verdict comes from the principle alone (NODE / SUSPECT / UNCLEAR / PROGRAM; see healing_sim's docstring).

Properties over the truth space (hypothesis): (a) no healthy node is ever blamed (newly given no rank, excluded by a
requeue, or quarantined); (b) where the truth gives node evidence the faulty node is blamed (quarantined, left out of
the next attempt); (c) PROGRAM ends the job, UNCLEAR retries in place on the same nodes blaming nobody, SUSPECT never
quarantines. Then one named example per class, and precision/recall of node blame over a fixed seeded sample.

Each property test runs all its examples and reports every violation at the end (it does not stop at the first),
so that the numbers of scenarios run are as stated.
"""
from __future__ import annotations

import ast
import importlib.util
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import List, Tuple

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from . import healing_sim as sim
from .healing_sim import NODE, PROGRAM, SUSPECT, UNCLEAR, Truth, expected, make, simulate

PROPERTY = settings(max_examples=120, deadline=None, database=None,
                    phases=(Phase.explicit, Phase.generate),
                    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much))


def run(t: Truth, where: Path) -> sim.Observed:
    where.mkdir(parents=True, exist_ok=True)
    return simulate(t, where)


def explain(t: Truth, o: sim.Observed, problems: List[str]) -> str:
    e = expected(t)
    return (f"- {t.describe()}\n    expected {e.tier} {sorted(e.nodes)} ({e.why})\n    observed {o.line()}\n"
            f"    " + "; ".join(problems))


def verify(cases: List[Tuple[str, Truth]], tmp_path: Path, kinds: str = "abc") -> None:
    """Simulate each case and fail with every broken expectation (observed vs expected), one block per case."""
    failed = []
    for i, (label, t) in enumerate(cases):
        o = run(t, tmp_path / f"case{i}")
        problems = [p for p in sim.check(t, o) if p[1] in kinds or not p.startswith("(")]
        if problems:
            failed.append(f"[{label}]\n" + explain(t, o, problems))
    if failed:
        pytest.fail(f"{len(failed)} of {len(cases)} case(s) break the principle:\n" + "\n".join(failed), pytrace=False)


def _collect(strategy_draw, kinds: str, store: List[str], counter: Counter, fixed: int):
    @seed(fixed)
    @PROPERTY
    @given(st.randoms(use_true_random=False))
    def body(rng) -> None:
        t = strategy_draw(rng.choice)
        with tempfile.TemporaryDirectory() as tmp:
            o = simulate(t, Path(tmp))
        counter["scenarios"] += 1
        counter[t.cls] += 1
        problems = [p for p in sim.check(t, o) if p[1] in kinds or not p.startswith("(")]
        if problems:
            store.append(explain(t, o, problems))
    return body


def _report(name: str, store: List[str], counter: Counter) -> None:
    head = f"{name}: {len(store)} of {counter['scenarios']} scenario(s) break it"
    by_class = Counter(line.split(" under ")[0][2:] for line in store)
    if store:
        pytest.fail(head + f" (by class: {dict(by_class)}); the first 12:\n" + "\n".join(store[:12]), pytrace=False)


# =================================================================================================================
# properties over the truth space (>= 300 scenarios in all)
# =================================================================================================================
def test_a_no_healthy_node_is_ever_blamed():
    store: List[str] = []
    counter: Counter = Counter()
    _collect(sim.draw, "a", store, counter, 101)()
    assert counter["scenarios"] >= 100
    _report("(a) no healthy node blamed", store, counter)


def test_b_node_evidence_blames_the_faulty_node():
    store: List[str] = []
    counter: Counter = Counter()
    _collect(lambda choose: sim.draw(choose, node_only=True), "b", store, counter, 202)()
    assert counter["scenarios"] >= 100
    _report("(b) node evidence blames the node", store, counter)


def test_c_program_ends_unclear_retries_in_place_suspect_never_quarantines():
    store: List[str] = []
    counter: Counter = Counter()
    _collect(sim.draw, "c", store, counter, 303)()
    assert counter["scenarios"] >= 100
    _report("(c) the tiers' behaviour", store, counter)


# =================================================================================================================
# one named example per class
# =================================================================================================================
def test_class_01_a_python_exception_on_one_rank_is_the_program_s(tmp_path):
    cases = [(f"{launcher}, {order}, {per_node}/node", make("exception", launcher, per_node, spare, order=order))
             for launcher in ("srun", "torchrun", "spawn") for order in ("cause_first", "collateral_first")
             for per_node, spare in ((1, False), (2, True), (4, False))]
    verify(cases, tmp_path)
    o = run(cases[0][1], tmp_path / "word")
    assert o.fault == "program", o.line()


def test_class_02_abort_is_the_program_s(tmp_path):
    words = {0: "std::runtime_error", 1: "C assert", 2: "nothing said"}
    verify([(f"{launcher}: {words[v]}", make("abort", launcher, 2, True, variant=v))
            for launcher in ("srun", "torchrun", "spawn") for v in (0, 1, 2)], tmp_path)


def test_class_03_a_segfault_is_retried_in_place_then_the_program(tmp_path):
    first = [(f"{launcher} first", make("segfault", launcher, per_node, spare))
             for launcher in ("srun", "torchrun") for per_node, spare in ((1, False), (2, True))]
    again = [(f"{launcher} again in place", make("segfault", launcher, 2, False, repeat=True))
             for launcher in ("srun", "torchrun")]
    assert expected(first[0][1]).tier == UNCLEAR and expected(again[0][1]).tier == PROGRAM
    verify(first + again, tmp_path)


def test_class_04_one_rank_sigkilled_is_unclear_whatever_the_ranks_per_node(tmp_path):
    cases = [(f"{launcher}, {per_node}/node, spare {spare}", make("kill_one", launcher, per_node, spare))
             for launcher in ("srun", "torchrun") for per_node in (1, 2, 4) for spare in (False, True)]
    assert all(expected(t).tier == UNCLEAR for _, t in cases)
    verify(cases, tmp_path)


def test_class_05_slurm_s_over_memory_kill_is_the_program_s_with_a_skewed_clock(tmp_path):
    cases = [(f"{launcher}, {stamp}, clock {skew} s behind, {elapsed} s in",
              make("over_memory", launcher, 2, True, skew_s=skew, stamp=stamp, elapsed_s=elapsed))
             for launcher in ("srun",) for stamp in ("iso", "rfc5424") for skew in (0, 30, 120)
             for elapsed in (20, 300)]
    cases += [(f"{launcher}, iso, clock 60 s behind", make("over_memory", launcher, 2, True, skew_s=60))
              for launcher in ("torchrun", "spawn")]
    verify(cases, tmp_path)


def test_class_06_cgroup_oom_lines_from_srun_or_slurmstepd_are_the_program_s(tmp_path):
    forms = {0: "srun's Out Of Memory", 1: "+ slurmstepd's line in srun's stderr", 2: "+ slurmstepd's in the log"}
    verify([(f"{launcher}: {forms[v]}", make("cgroup_oom", launcher, 2, True, variant=v))
            for launcher in ("srun", "torchrun", "spawn") for v in (0, 1, 2)], tmp_path)


def test_class_07_a_node_dying_whole_is_excluded_and_quarantined(tmp_path):
    cases = [(f"{launcher}, spare, {order}", make("node_dies", launcher, 2, True, order=order))
             for launcher in ("srun", "torchrun", "spawn") for order in ("cause_first", "collateral_first")]
    cases += [(f"{launcher}, no spare, room", make("node_dies", launcher, 2, False, room="ample"))
              for launcher in ("srun", "torchrun", "spawn")]
    cases += [("srun, no spare, no room", make("node_dies", "srun", 2, False, room="tight"))]
    verify(cases, tmp_path)
    spare = run(cases[0][1], tmp_path / "spare")
    assert spare.action in ("gate", "run") and "node2" not in spare.next_run and "node2" in spare.quarantined, \
        spare.line()
    room = run(make("node_dies", "srun", 2, False, room="ample"), tmp_path / "room")
    assert room.action == "requeue" and "node2" in room.nodes and "node2" in room.quarantined, room.line()


def test_class_08_every_rank_of_a_node_sigkilled_is_suspect_alike_under_srun_and_torchrun(tmp_path):
    cases = [(f"{launcher}, {per_node}/node, spare {spare}", make("node_killed", launcher, per_node, spare))
             for launcher in ("srun", "torchrun") for per_node in (2, 4) for spare in (False, True)]
    assert all(expected(t).tier == SUSPECT for _, t in cases)
    verify(cases, tmp_path)
    seen = {}
    for i, (_, t) in enumerate(cases):
        o = run(t, tmp_path / f"alike{i}")
        seen.setdefault((t.per_node, t.spare), {})[t.launcher] = (o.action, o.next_run, o.bad, o.quarantined)
    differ = {k: v for k, v in seen.items() if v["srun"] != v["torchrun"]}
    assert not differ, f"srun and torchrun differ: {differ}"
    again = make("node_killed", "srun", 2, False, repeat=True)
    assert expected(again).tier == NODE
    verify([("srun, the same again on node2 after a retry in place", again)], tmp_path / "again")


def test_class_09_hang_in_the_scripts_own_code_is_retried_in_place_then_the_program(tmp_path):
    first = [(f"{launcher}, {per_node}/node", make("hang_script", launcher, per_node, spare))
             for launcher in ("srun", "torchrun", "spawn") for per_node, spare in ((1, False), (2, True), (4, False))]
    again = [(f"{launcher}, the same place again", make("hang_script", launcher, 2, False, repeat=True))
             for launcher in ("srun", "torchrun", "spawn")]
    verify(first + again, tmp_path)
    for label, t in first + again:
        o = run(t, tmp_path / f"q{len(label)}-{abs(hash(label))}")
        assert not o.quarantined, f"{label}: {o.line()}"


def test_class_10_ranks_silent_in_the_roll_call_blame_their_node(tmp_path):
    verify([(f"{launcher}, {per_node}/node, spare {spare}, {how}",
             make("hang_silent", launcher, per_node, spare, variant=v))
            for launcher in ("srun", "torchrun", "spawn") for per_node, spare in ((1, True), (2, False), (4, True))
            for v, how in ((0, "terminated"), (1, "killed"))], tmp_path)


def test_class_11_a_roll_call_tie_or_everyone_at_one_place_blames_nobody(tmp_path):
    verify([(f"{cls} {launcher}, {per_node}/node, spare {spare}", make(cls, launcher, per_node, spare))
            for cls in ("hang_tie", "hang_all") for launcher in ("srun", "torchrun", "spawn")
            for per_node, spare in ((2, False), (2, True), (1, False))], tmp_path)


def test_class_12_torch_s_watchdog_aborting_waiting_ranks_never_blames_their_nodes(tmp_path):
    cases = [(f"{launcher}, cause unknown, {per_node}/node, {['terminated', 'killed', 'cancel line'][v]}",
              make("watchdog", launcher, per_node, spare, variant=v))
             for launcher in ("srun", "torchrun") for per_node, spare in ((1, False), (2, True)) for v in (0, 1, 2)]
    cases += [(f"{launcher}, node2 died ({order}), {per_node}/node",
               make("watchdog", launcher, per_node, True, cause="node_failure", order=order))
              for launcher in ("srun", "torchrun") for per_node in (1, 2) for order in ("cause_first",
                                                                                       "collateral_first")]
    verify(cases, tmp_path)


def test_class_13_stale_evidence_of_an_earlier_restart_is_never_this_attempt_s(tmp_path):
    cases = [("hang-0 roll call (node2 silent, an odd rank on node1)", make("exception", "srun", 2, True,
                                                                               where_index=0, stale="hang")),
             ("hang-0 roll call, torchrun", make("exception", "torchrun", 2, False, stale="hang")),
             ("rendezvous-0.txt", make("exception", "srun", 2, True, stale="rendezvous")),
             ("rendezvous-0.txt, spawn", make("exception", "spawn", 1, False, stale="rendezvous")),
             ("restart 0's torchrun Root Cause atop node-1.out", make("exception", "torchrun", 2, True,
                                                                     stale="root_cause")),
             ("restart 0's Root Cause, FQDN hosts", make("exception", "torchrun", 4, False, stale="root_cause",
                                                         fqdn=True)),
             ("rendezvous-9 beside restart 10", make("exception", "srun", 2, True, stale="rendezvous-9")),
             ("rendezvous-9 beside restart 10, spawn", make("exception", "spawn", 2, False, stale="rendezvous-9"))]
    assert all(expected(t).tier == PROGRAM for _, t in cases)
    verify(cases, tmp_path)
    for i, (label, t) in enumerate(cases):
        o = run(t, tmp_path / f"word{i}")
        assert o.fault == "program", f"{label}: {o.line()}"


def test_class_13b_stale_logs_read_by_the_ended_verdict_alone_are_not_this_attempt_s(tmp_path):
    """As class 13, with the stale text still atop node-N.out / rank-N.out when ``next ended`` reads them (the
    restart's ``next start``, which now sets the last restart's logs aside, left out): the verdict itself must not
    take restart 0's words for this attempt's."""
    cases = [("restart 0's torchrun Root Cause atop node-1.out", make("exception", "torchrun", 2, True,
                                                                     stale="root_cause", skip_start=True)),
             ("the same, FQDN hosts, 4/node", make("exception", "torchrun", 4, False, stale="root_cause", fqdn=True,
                                                   skip_start=True)),
             ("hang-0 and its words atop rank-0.out", make("exception", "srun", 2, True, where_index=0, stale="hang",
                                                           skip_start=True)),
             ("rendezvous-9 beside restart 10", make("exception", "srun", 2, True, stale="rendezvous-9",
                                                     skip_start=True))]
    verify(cases, tmp_path)


def test_class_14_text_the_program_printed_is_never_node_evidence(tmp_path):
    cases = [("spawn: a Root Cause block in node-0.out", make("exception", "spawn", 2, True, forged="root_cause")),
             ("spawn: the block over a segfault-free kill", make("hang_script", "spawn", 2, False,
                                                                forged="root_cause")),
             ("srun: a Root Cause block in rank-0.out", make("exception", "srun", 2, True, forged="root_cause")),
             ("srun: 'srun: error: node1: tasks 0-1: Killed' in rank-0.out",
              make("exception", "srun", 2, True, forged="srun_killed")),
             ("srun: 'srun: error: Node failure on node1' in rank-0.out",
              make("kill_one", "srun", 2, False, forged="node_failure")),
             ("torchrun: the srun line behind [default0]:", make("exception", "torchrun", 2, True,
                                                               forged="srun_killed")),
             ("torchrun: [default0]: then a literal \\r and the block (an untranslating tee)",
              make("exception", "torchrun", 2, True, forged="root_cause", forged_sep="\r", forged_raw=True))]
    cases += [(f"torchrun: [default0]: then {sep!r} and the block", make("exception", "torchrun", 2, True,
                                                                        forged="root_cause", forged_sep=sep))
              for sep in sim.SEPARATORS]
    verify(cases, tmp_path)


def test_class_15_a_health_gate_whose_srun_cannot_start_blames_no_node(tmp_path):
    verify([(f"{launcher}, {'after a node failure' if after else 'before the first attempt'}",
             make("gate_no_start", launcher, 2, spare, after_failure=after))
            for launcher in ("srun", "torchrun") for spare, after in ((False, False), (True, False), (True, True))],
           tmp_path)


def test_classic_a_rendezvous_that_missed_a_node_s_ranks_blames_it(tmp_path):
    verify([(f"{launcher}, {per_node}/node, spare {spare}", make("rendezvous", launcher, per_node, spare))
            for launcher in ("srun", "spawn") for per_node, spare in ((1, True), (2, False), (4, True))], tmp_path)


# =================================================================================================================
# the numbers, and the simulator's own formats
# =================================================================================================================
def test_precision_and_recall_of_node_blame_over_a_fixed_sample(tmp_path, capsys):
    """Over a fixed seeded sample of the truth space: quarantine (the lasting blame) against the NODE truths' nodes,
    and exclusion (given no rank or requeued without) against NODE and SUSPECT truths' nodes; per (scenario, node)
    of the allocation. Printed to be quoted, and asserted (issue 79: it printed and asserted only its sample's
    make-up): per tier, no healthy node quarantined or excluded (precision 1.0 in each), every verdict right, and
    every NODE truth's node quarantined wherever a spare or the partition's room lets the job go on."""
    truths = sim.sample(20261204, 200)
    tiers: Counter = Counter()
    right: Counter = Counter()
    q = Counter()
    x = Counter()
    q_room = Counter()  # quarantine of NODE truths where a spare or the partition's room lets the job go on
    wrong: Counter = Counter()  # per tier: healthy nodes quarantined or excluded (false positives)
    for i, t in enumerate(truths):
        e = expected(t)
        o = run(t, tmp_path / f"s{i}")
        tiers[e.tier] += 1
        right[e.tier] += not sim.check(t, o)
        before = sim.blamed_before(t)
        for node in t.hosts:
            if node in before:
                continue
            truth_q = e.tier == NODE and node in e.nodes
            truth_x = node in e.nodes and (e.tier == NODE or e.tier == SUSPECT and t.spare)
            said_q = node in o.quarantined
            said_x = node in (o.newly_bad | o.requeued_without) or (node in t.ran_on and o.next_run
                                                                     and node not in o.next_run)
            q["tp" if truth_q and said_q else "fp" if said_q else "fn" if truth_q else "tn"] += 1
            if t.spare or t.room == "ample":
                q_room["tp" if truth_q and said_q else "fp" if said_q else "fn" if truth_q else "tn"] += 1
            x["tp" if truth_x and said_x else "fp" if said_x else "fn" if truth_x else "tn"] += 1
            wrong[e.tier] += bool(said_q and not truth_q) + bool(said_x and not truth_x)

    def pr(c: Counter) -> Tuple[float, float]:
        return (c["tp"] / (c["tp"] + c["fp"]) if c["tp"] + c["fp"] else 1.0,
                c["tp"] / (c["tp"] + c["fn"]) if c["tp"] + c["fn"] else 1.0)

    qp, qr = pr(q)
    xp, xr = pr(x)
    rp, rr = pr(q_room)
    with capsys.disabled():
        print(f"\nnode blame over {len(truths)} seeded scenarios (seed 20261204):"
              f"\n  quarantine: precision {qp:.3f} recall {qr:.3f} ({dict(q)})"
              f"\n  quarantine where a spare or room lets the job go on: precision {rp:.3f} recall {rr:.3f} "
              f"({dict(q_room)})"
              f"\n  exclusion:  precision {xp:.3f} recall {xr:.3f} ({dict(x)})"
              f"\n  verdicts fully right by tier: " + ", ".join(f"{k} {right[k]}/{tiers[k]}" for k in sorted(tiers)))
    assert q["tp"] + q["fn"] > 10 and sum(tiers.values()) == len(truths) and len(tiers) == 5, tiers
    assert sum(wrong.values()) == 0 and (qp, xp) == (1.0, 1.0), wrong  # precision 1.0 in every tier
    assert right == tiers, (right, tiers)
    assert rr == 1.0 and q_room["tp"] > 10, q_room


def test_the_simulated_torchrun_report_has_torch_s_own_templates():
    """The report the simulator writes uses torch's templates (read from torch's source, not imported: importing
    torch takes seconds), and lists every failure with the earliest as the root cause."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return  # (no torch here: the templates above were copied from torch 2.13)
    source = Path(list(spec.submodule_search_locations)[0]) / "distributed/elastic/multiprocessing/errors/__init__.py"
    found = {}
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in ("_FAILURE_FORMAT_TEMPLATE", "_MSG_FORMAT_TEMPLATE"):
            found[node.targets[0].id] = ast.literal_eval(node.value)
    assert found == {"_FAILURE_FORMAT_TEMPLATE": sim.FAILURE_TEMPLATE, "_MSG_FORMAT_TEMPLATE": sim.MSG_TEMPLATE}
    failures = [sim.Failure(2, 0, 11, -9, 100), sim.Failure(3, 1, 12, -9, 100), sim.Failure(1, 1, 13, -15, 101)]
    text = sim.elastic_report("/home/u/train.py", "node2", failures)
    assert "Root Cause (first observed failure):\n[0]:\n" in text and "exitcode  : -9 (pid: 11)  (SIGKILL)" in text
    assert text.count("exitcode  :") == 3 and text.startswith("\n====")


def test_the_simulator_writes_each_class_s_own_evidence(tmp_path):
    """The simulator itself: the records each class must leave (and none it must not)."""
    t = make("hang_silent", "srun", 2, False)
    run(t, tmp_path / "h")
    moved = list((tmp_path / "h").rglob("rollcall.json"))
    assert moved, "the roll call"
    import json
    call = json.loads(moved[0].read_text())
    assert [m["rank"] for m in call["missing"]] == [2, 3] and all("node2" in m["why"] for m in call["missing"])
    t = make("node_dies", "torchrun", 2, False)
    run(t, tmp_path / "n")
    err = next((tmp_path / "n").rglob("srun-0.0.err")).read_text()
    assert "srun: error: Node failure on node2\n" in err
    node2_log = next((tmp_path / "n").rglob("node-1.out")).read_text()
    assert "Root Cause" not in node2_log  # its agent died with it
    t = make("over_memory", "srun", 2, False, skew_s=120, elapsed_s=20, stamp="rfc5424")
    run(t, tmp_path / "m")
    log = next((tmp_path / "m").rglob("rank-2.out")).read_text()
    assert f"error: StepId={t.step} exceeded memory limit" in log and "+" in log.split("]")[0]
    t = replace(make("exception", "spawn", 2, False), job_id="77")
    run(t, tmp_path / "s")
    assert not list((tmp_path / "s").rglob("exception-*.json"))  # spawn's _wrap catches it: no excepthook


def test_class_16_a_node_dying_whole_is_blamed_whether_or_not_srun_wrote_slurm_s_word_before_the_sigterm(tmp_path):
    """CI, Slurm 26.05: Slurm's SIGTERM for a failed node reached the batch script, and srun was ended before it
    wrote "Node failure on node2": the attempt was recorded as a plain SIGTERM, node2 never named nor quarantined.
    Slurm's own state of the attempt's nodes (sinfo, written once srun is gone) names it: NODE, recorded as Slurm's
    requeue without it."""
    cases = [(f"{launcher}, {term}, spare {spare}", make("node_dies", launcher, 2, spare, term=term))
             for launcher in ("srun", "torchrun", "spawn") for term in ("word", "silent") for spare in (False, True)]
    verify(cases, tmp_path)
    silent = run(make("node_dies", "srun", 2, False, term="silent"), tmp_path / "silent")
    assert (silent.action, silent.fault, silent.fault_nodes, silent.next) == \
        ("end", "infrastructure", ("node2",), "requeue"), silent.line()
    assert silent.evidence == 'health/sinfo.txt: "node2 down*"', silent.evidence
    word = run(make("node_dies", "srun", 2, False, term="word"), tmp_path / "word")
    assert word.evidence == 'srun-0.0.err: "srun: error: Node failure on node2"', word.evidence


def test_class_16b_slurm_s_word_before_its_sigterm_and_sinfo_unanswered_is_slurm_s_own_requeue(tmp_path):
    """CI, Slurm 26.05: srun wrote "Node failure on node2" and ended before Slurm's SIGTERM reached the batch script,
    and sinfo gave nothing (the controller busy with the failure): the supervisor could not tell whether a requeue
    would fit, so it ended the attempt, recorded as the job's end while Slurm requeued the job itself. Now recorded as
    Slurm's requeue without node2, as when the SIGTERM comes first."""
    seen = run(make("node_dies", "srun", 2, False, term="", room="none"), tmp_path)
    assert (seen.action, seen.fault, seen.fault_nodes, seen.next) == \
        ("end", "infrastructure", ("node2",), "requeue"), seen.line()


def test_class_17_a_cancel_or_preemption_blames_no_node_whatever_slurm_says_of_others(tmp_path):
    """Slurm's SIGTERM with every node of the attempt up: nobody blamed, the job ends. A node of the partition outside
    the allocation that is down, the attempt's own node not responding for a moment or draining (neither ends a
    job), and a program that printed Slurm's words about a node change nothing."""
    cases = [(f"{launcher}, variant {variant}, spare {spare}, forged {forged or '-'}",
              make("cancelled", launcher, 2, spare, variant=variant, forged=forged))
             for launcher in ("srun", "torchrun", "spawn") for variant in (0, 1, 2) for spare in (False, True)
             for forged in ("", "node_failure")]
    verify(cases, tmp_path)
    assert all(expected(t).tier == sim.STOPPED for _, t in cases)
