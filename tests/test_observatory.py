"""Issue 42 without processes: the straggler rule, the files read as data, the goodput ledger's arithmetic, `top`
through Click, and the runtime's step clock. The real jobs (4 ranks, a slow rank, a killed node) are in
test_observatory_jobs.py and test_self_healing.py."""
from __future__ import annotations

import json
import os
import random
import statistics
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterddp import contract
from clusterddp.cli import cli
from clusterddp.healing import attempts
from clusterddp.observe import goodput, telemetry, top
from clusterddp.runtime.telemetry import Steps

from .conftest import cli_runner

T0 = 1_796_000_000.0


def rank_file(rank_: int, rows: list, node: str = "", restart: int = 0, base: int = 0, **over) -> dict:
    rank = rank_
    sums = {k: sum(r[i + 2] for r in rows) for i, k in enumerate(contract.TELEMETRY_ROW[2:])}
    data = {"version": 1, "rank": rank, "world_size": 4, "local_world_size": 2, "restart": restart,
            "node": node or f"node{rank // 2 + 1}", "pid": 1, "init": T0, "first": rows[0][1] - rows[0][2] if rows
            else None, "steps": len(rows), "base": base, "based": True, "written": T0 + 100, "sums": sums,
            "fields": list(contract.TELEMETRY_ROW), "recent": rows}
    data.update(over)
    return data


def steps_of(n: int, compute: float, data: float = 0.001, wait: float = 0.0, start: int = 1, seed: int = 0,
             t0: float = T0) -> list:
    """n steps of one rank: [step, end, total, data, compute, comm, opt, ckpt] with a little noise."""
    rng = random.Random(seed)
    rows, t = [], t0
    for i in range(n):
        c = compute * (1 + rng.uniform(-0.05, 0.05))
        total = data + c + wait + 0.001
        t += total
        rows.append([start + i, round(t, 3), total, data, c, wait, 0.001, 0.0])
    return rows


def write_run(run_dir: Path, files: list, restart: int = 0, positions: dict = None) -> None:
    directory = telemetry.attempt_dir(run_dir, restart)
    directory.mkdir(parents=True, exist_ok=True)
    for f in files:
        (directory / f"rank-{f['rank']}.json").write_text(json.dumps(f))
    for rank, (pos, when) in (positions or {}).items():
        (directory / f"rank-{rank}.pos").write_text(f"{pos:012d} {when:017.3f}\n")


def even_job(n: int = 40, slow: int = -1, phase: str = "compute") -> list:
    """4 ranks: the others wait in the all-reduce for the slow one (when there is one)."""
    out = []
    for rank in range(4):
        extra = 0.030 if rank == slow else 0.0
        wait = 0.0 if rank == slow or slow < 0 else 0.028
        if phase == "compute":
            rows = steps_of(n, 0.020 + extra, wait=wait, seed=rank)
        else:
            rows = steps_of(n, 0.020, data=0.001 + extra, wait=wait, seed=rank)
        out.append(rank_file(rank, rows))
    return out


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=2, max_size=30), st.data())
def test_median_without_one_is_the_median_of_the_others(values, data):
    i = data.draw(st.integers(0, len(values) - 1))
    others = values[:i] + values[i + 1:]
    assert telemetry._median_without(sorted(values), values[i]) == pytest.approx(statistics.median(others))


@pytest.mark.parametrize("phase", ["compute", "data"])
def test_the_slow_rank_is_named_with_its_node_and_phase(tmp_path, phase):
    write_run(tmp_path, even_job(slow=2, phase=phase))
    ranks = telemetry.read(tmp_path)
    (found,) = telemetry.stragglers(ranks)
    assert (found.rank, found.node, found.phase, found.steps) == (2, "node2", phase, 40)
    line = telemetry.straggler_text(ranks, [found])
    assert line.startswith("stragglers: rank 2 (node2) costs the job ") and f"({phase})" in line, line
    assert "the other 3 ranks wait" in line and 40 < found.others_wait_pct < 60, line
    assert found.slow_steps == 40 and "in 40 of them (persistently), by 30 ms at the median" in line, line


def test_an_even_run_names_no_one_and_a_short_one_says_it_cannot_tell_yet(tmp_path):
    write_run(tmp_path, even_job())
    ranks = telemetry.read(tmp_path)
    assert telemetry.stragglers(ranks) == []
    assert telemetry.straggler_text(ranks, []) == "stragglers: none over the last 40 steps"
    write_run(tmp_path / "short", even_job(n=6, slow=1))
    short = telemetry.read(tmp_path / "short")
    assert telemetry.stragglers(short) == []
    assert "not known yet (6 steps recorded by every rank; 10 needed)" in telemetry.straggler_text(short, [])


def test_a_slower_rank_nobody_waits_for_is_no_straggler(tmp_path):
    files = [rank_file(r, steps_of(40, 0.050 if r == 3 else 0.020, seed=r)) for r in range(4)]  # no one waits
    write_run(tmp_path, files)
    assert telemetry.stragglers(telemetry.read(tmp_path)) == []


def test_only_the_steps_every_rank_recorded_are_compared(tmp_path):
    files = even_job(slow=1)
    files[0]["recent"] = files[0]["recent"][:25]  # rank 0's file is older: steps 1..25 only
    write_run(tmp_path, files)
    (found,) = telemetry.stragglers(telemetry.read(tmp_path))
    assert (found.rank, found.steps) == (1, 25)


def intermittent_job(slow: int, extra: float, every: int = 4, phase: str = "compute", wait: bool = True,
                     n: int = 40, only: tuple = ()) -> list:
    """4 ranks of ~22 ms steps; rank ``slow`` takes ``extra`` s longer in its ``phase`` in every ``every``-th step
    (or in the steps ``only``), and the others wait for it there in the all-reduce (when ``wait``)."""
    out = []
    for rank in range(4):
        rows = steps_of(n, 0.020, seed=rank)
        for row in rows:
            if (row[0] in only) if only else row[0] % every == 0:
                if rank == slow:
                    row[4 if phase == "compute" else 3] += extra
                elif wait:
                    row[5] += extra
                row[2] += extra if rank == slow or wait else 0.0
        out.append(rank_file(rank, rows))
    return out


def job_time(files: list) -> float:
    """The window's time as the rule counts it: the sum over steps of the mean over ranks of the step's total."""
    return sum(statistics.fmean(f["recent"][j][2] for f in files) for j in range(len(files[0]["recent"])))


@pytest.mark.parametrize("phase", ["compute", "data"])
def test_a_rank_slow_in_one_step_of_four_is_named_by_the_time_it_costs(tmp_path, phase):
    """Issue 56: rank 3 slow by 0.3 s in 10 of 40 steps more than halves the job's speed; the old rule (slower in
    75% of the steps) said "none"."""
    files = intermittent_job(slow=3, extra=0.3, phase=phase)
    write_run(tmp_path, files)
    ranks = telemetry.read(tmp_path)
    (found,) = telemetry.stragglers(ranks)
    lost = 100 * 10 * 0.3 / job_time(files)
    assert (found.rank, found.node, found.phase, found.slow_steps, found.steps) == (3, "node2", phase, 10, 40)
    assert found.lost_pct == pytest.approx(lost, abs=0.5) and 70 < lost < 85
    assert found.excess_s == pytest.approx(0.3, abs=0.002)
    line = telemetry.straggler_text(ranks, [found])
    what = {"compute": "its compute", "data": "its wait for data"}[phase]
    assert line.startswith(f"stragglers: rank 3 (node2) costs the job {lost:.0f}% of its time over the last 40 "
                           f"steps ({phase}): {what} ran over the others' median in 10 of them (intermittently), "
                           f"by {round(found.excess_s * 1000)} ms at the median ("), line
    assert "; the other 3 ranks wait " in line, line


def test_a_rank_is_named_once_it_costs_the_job_a_tenth_of_its_time(tmp_path):
    """Slow in 10 of 40 steps by 8 ms: 8% of the job's time, not named; by 12 ms: 12%, named."""
    for extra, named in ((0.008, False), (0.012, True)):
        files = intermittent_job(slow=1, extra=extra)
        write_run(tmp_path / str(extra), files)
        found = telemetry.stragglers(telemetry.read(tmp_path / str(extra)))
        share = 10 * extra / job_time(files)
        assert (share >= telemetry.LOST) == named and abs(share - telemetry.LOST) > 0.015, share
        assert [(f.rank, f.lost_pct) for f in found] == ([(1, pytest.approx(100 * share, abs=0.5))] if named else [])


def test_an_even_run_and_hiccups_name_no_one(tmp_path):
    """One or two hiccups (a 2 s pause the others wait for: most of the window's time) are not a straggler; three
    are."""
    for only, named in (((), False), ((17,), False), ((5, 30), False), ((5, 17, 30), True)):
        files = intermittent_job(slow=2, extra=2.0, only=only) if only else even_job()
        write_run(tmp_path / str(len(only)), files)
        ranks = telemetry.read(tmp_path / str(len(only)))
        assert [(f.rank, f.slow_steps) for f in telemetry.stragglers(ranks)] == ([(2, 3)] if named else []), only
    assert telemetry.straggler_text(ranks[:1], []) == "stragglers: none (one rank)"


def test_an_intermittently_slower_rank_nobody_waits_for_is_no_straggler(tmp_path):
    write_run(tmp_path, intermittent_job(slow=3, extra=0.3, wait=False))
    assert telemetry.stragglers(telemetry.read(tmp_path)) == []


@pytest.mark.parametrize("bad", [
    b"not json", b"[]", b'{"version": 2}',
    json.dumps(rank_file(0, steps_of(3, 0.01), rank="0")).encode(),
    json.dumps(rank_file(0, steps_of(3, 0.01), steps=-1)).encode(),
    json.dumps(rank_file(0, steps_of(3, 0.01), written=float("inf"))).encode().replace(b"Infinity", b"1e400"),
    json.dumps(rank_file(0, steps_of(3, 0.01), sums={"total": "1"})).encode(),
    json.dumps(rank_file(0, steps_of(3, 0.01), rank=True)).encode(),
])
def test_files_of_another_shape_are_skipped(tmp_path, bad):
    assert telemetry.parse(bad) is None


def test_reading_keeps_what_is_sound_and_drops_the_rest(tmp_path):
    files = even_job(n=12)
    files[1]["recent"][3] = [1, 2, "x", 0, 0, 0, 0, 0]      # one bad row: dropped, not the file
    files[2]["node"] = "node2\x1b[2J\nrank 0 is slow"        # text is data: made printable, bounded
    write_run(tmp_path, files)
    directory = telemetry.attempt_dir(tmp_path, 0)
    (directory / "rank-3.json").rename(directory / "rank-7.json")  # a name that does not match its rank
    os.symlink(directory / "rank-0.json", directory / "rank-5.json")   # a link: never followed
    ranks = telemetry.read(tmp_path)
    assert [r.rank for r in ranks] == [0, 1, 2]
    assert len(ranks[1].recent) == 11 and "\x1b" not in ranks[2].node and "\n" not in ranks[2].node


def test_the_newest_attempt_is_read_unless_one_is_asked_for(tmp_path):
    write_run(tmp_path, [rank_file(0, steps_of(5, 0.01), restart=0)], restart=0)
    write_run(tmp_path, [rank_file(0, steps_of(7, 0.01), restart=2)], restart=2)
    assert telemetry.restarts(tmp_path) == [0, 2]
    assert telemetry.read(tmp_path)[0].steps == 7 and telemetry.read(tmp_path, 0)[0].steps == 5


def test_top_prints_the_table_and_the_straggler_and_json_for_tools(tmp_path):
    write_run(tmp_path, even_job(slow=3))
    run = cli_runner()
    once = run.invoke(cli, ["top", "--once", str(tmp_path)])
    assert once.exit_code == 0, once.output
    lines = once.stdout.splitlines()
    assert lines[1].split()[:3] == ["NODE", "RANK", "STEPS"] and len(lines) == 2 + 4 + 1
    assert lines[-1].startswith("stragglers: rank 3 (node2) costs the job 6"), lines[-1]
    assert "(compute): its compute ran over the others' median in 40 of them (persistently)" in lines[-1]
    as_json = json.loads(run.invoke(cli, ["top", "--json", str(tmp_path)]).stdout)
    assert [r["rank"] for r in as_json["ranks"]] == [0, 1, 2, 3]
    assert as_json["stragglers"][0]["rank"] == 3 and as_json["ranks"][3]["comm_pct"] < 10
    assert as_json["stragglers"][0]["slow_steps"] == 40 and 55 < as_json["stragglers"][0]["lost_pct"] < 65
    assert 40 < as_json["ranks"][0]["comm_pct"] < 60  # the others wait for rank 3


def test_top_without_telemetry_says_why_in_one_line(tmp_path):
    result = cli_runner().invoke(cli, ["top", "--once", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stdout.strip().startswith(f"no step telemetry in {tmp_path}: ") and "\n" not in result.stdout.strip()
    bad = cli_runner().invoke(cli, ["top", str(tmp_path / "nowhere")])
    assert bad.exit_code == 2 and "is neither a job id (1234, or a local run's L7) nor an existing run directory" \
        in bad.stderr, bad.stderr


def test_top_over_64_ranks(tmp_path):
    """64 ranks' files of 256 steps each: read, analysed and laid out (the timing is bench/top.py's)."""
    files = [rank_file(r, steps_of(256, 0.02 + (0.03 if r == 37 else 0), wait=0 if r == 37 else 0.028, seed=r),
                       node=f"node{r // 8}") for r in range(64)]
    write_run(tmp_path, files)
    snap = top.snapshot(tmp_path)
    assert len(snap["ranks"]) == 64 and [s["rank"] for s in snap["stragglers"]] == [37]
    assert len(top.text(snap).splitlines()) == 2 + 64 + 1



def attempts_tsv(run_dir: Path, rows: list) -> None:
    (run_dir / contract.ATTEMPTS_FILE).write_text("".join("\t".join(map(str, r)) + "\n" for r in rows))


def test_the_ledger_splits_every_attempt_and_adds_up(tmp_path):
    """Attempt 1 (2 nodes, 100 s): 10 s start-up, steps 1-40 over 80 s (checkpoint at 30), killed 10 s later; a
    5 s gate; attempt 2 resumes at step 30 and runs 31-60 over 60 s, then 5 s of tail."""
    s0 = int(T0)
    attempts_tsv(tmp_path, [(0, 0, s0, s0 + 100, "node1,node2", 137, "infrastructure", "node2", "killed", "retry"),
                            (0, 1, s0 + 105, s0 + 180, "node1,node3", 0, "", "", "", "end")])
    first = rank_file(0, steps_of(40, 1.999, data=0.0, t0=T0 + 10), first=T0 + 10)
    first["sums"]["ckpt"], first["sums"]["total"] = 0.8, 80.0   # 1% of the steps' time saving
    write_run(tmp_path / "attempts" / "0.0", [first], positions={0: (40, T0 + 90)})
    second = rank_file(0, steps_of(30, 2.0, start=31, t0=T0 + 115), base=30, first=T0 + 115)
    write_run(tmp_path, [second], positions={0: (60, T0 + 175)})
    ledger = goodput.ledger(tmp_path)
    parts = ledger.parts
    assert ledger.total == pytest.approx(2 * 100 + 2 * 5 + 2 * 75)
    assert parts["start-up"] == pytest.approx(2 * 10 + 2 * 10)
    assert parts["failed"] == pytest.approx(2 * 10) and parts["gate"] == pytest.approx(2 * 5)
    assert parts["tail"] == pytest.approx(2 * 5) and parts["checkpoint"] == pytest.approx(2 * 0.8)
    assert (ledger.steps, ledger.redone_steps) == (70, 10)
    assert parts["redone"] == pytest.approx(2 * (60 - 0) * 10 / 30)   # steps 31-40 again, a third of attempt 2
    assert sum(parts.values()) == pytest.approx(ledger.total)
    line = ledger.line()
    assert line.startswith(f"goodput {100 * ledger.goodput:.0f}%: ") and "node-minutes trained" in line, line
    assert "(10 of 70 steps redone)" in line and "start-up 11%" in line, line


def test_with_its_allocation_recorded_the_ledger_is_the_allocation(tmp_path):
    """The same job in an allocation of 3 nodes from T0-4.5 to T0+183.25: the 4.5 s before attempt 1 are start-up,
    the unused third node is idle, the gate and the tail hold all 3 nodes; the parts add up to 3 x 187.75 exactly.
    Lines that are not the file's (another restart's end first, a time that is not one, a bad host) are skipped."""
    test_the_ledger_splits_every_attempt_and_adds_up(tmp_path)
    (tmp_path / contract.ALLOCATIONS_FILE).write_text(
        f"end\t0\t{T0 - 99}\nbegin\t0\t1e9\tnode1\nbegin\t0\t{int(T0) - 4.5:.3f}\tnode1,node2,node3,-x\n"
        f"begin\t0\t{T0 + 50}\tnode9\nend\t0\t{int(T0) + 183.25:.9f}\nend\t7\t{T0}\n")
    (alloc,) = attempts.allocations(tmp_path)
    assert alloc.nodes == ("node1", "node2", "node3") and alloc.end - alloc.start == pytest.approx(187.75)
    ledger = goodput.ledger(tmp_path)
    parts = ledger.parts
    assert ledger.total == pytest.approx(3 * 187.75)
    assert parts["start-up"] == pytest.approx(3 * 4.5 + 2 * 10 + 2 * 10) and parts["gate"] == pytest.approx(3 * 5)
    assert parts["idle"] == pytest.approx(100 + 75) and parts["tail"] == pytest.approx(2 * 5 + 3 * 3.25)
    assert (ledger.steps, ledger.redone_steps) == (70, 10) and "idle 31%" in ledger.line(), ledger.line()


def test_a_hang_and_an_attempt_without_steps_are_their_own_parts(tmp_path):
    s0 = int(T0)
    attempts_tsv(tmp_path, [(0, 0, s0, s0 + 50, "node1", contract.HANG_EXIT, "program", "", "hang", "end"),
                            (1, 0, s0 + 200, s0 + 230, "node1", 1, "program", "", "error", "end")])
    write_run(tmp_path, [rank_file(0, steps_of(10, 1.0, t0=T0 + 5), first=T0 + 5)], positions={0: (10, T0 + 20)})
    ledger = goodput.ledger(tmp_path)
    assert ledger.parts["hang"] == pytest.approx(30) and ledger.parts["failed"] == pytest.approx(30)
    assert ledger.total == pytest.approx(80)
    assert goodput.ledger(tmp_path / "none") is None and goodput.lines(tmp_path / "none") == []


def test_the_step_clock_counts_begun_steps_and_resumes(tmp_path):
    steps = Steps(rank=1, world_size=2, local_world_size=1, restart=3, run_dir=tmp_path)
    steps.end()                      # should_stop() before any work: no step
    assert steps.count == 0 and steps.position() == 0
    steps.resumed(30)
    steps.begin()
    assert steps.position() == 31    # a step in progress counts (a checkpoint saved now holds it)
    steps.add("data", 0.01)
    time.sleep(0.02)
    steps.end()
    (row,) = steps.recent
    assert row[0] == 31 and row[2] >= 0.02 and row[3] == 0.01 and row[4] == pytest.approx(row[2] - 0.01, abs=1e-5)
    steps.flush()
    directory = telemetry.attempt_dir(tmp_path, 3)
    assert telemetry.positions(directory)[1][0] == 31
    (read,) = telemetry.read(tmp_path, 3)
    assert (read.rank, read.steps, read.base, read.restart) == (1, 1, 30, 3)


def test_the_untimed_time_before_a_steps_first_forward_pass_is_data(monkeypatch):
    """Issue 56: a plain DataLoader's fetch (between the step boundary and the forward pre-hook) was called compute.
    Now it is data; what was timed in that gap (runtime.loader's fetch, a checkpoint save) is not counted twice, and
    later forwards of the step (gradient accumulation, evaluation) add nothing. A fake clock: exact numbers."""
    from clusterddp.runtime import telemetry as job_side
    from clusterddp.runtime.state import STATE

    now = [100.0]
    monkeypatch.setattr(job_side, "_clock", lambda: now[0])
    steps = Steps(rank=0, world_size=1, local_world_size=1, restart=0)
    monkeypatch.setitem(STATE, "telemetry", steps)

    def step(*parts: tuple) -> list:
        for kind, seconds in parts:  # ("fetch", s): untimed; ("timed", s): runtime.loader's; ("forward", s)
            if kind == "timed":
                began = job_side.clock()
                now[0] += seconds
                job_side.took("data", began)
            else:
                if kind == "forward":
                    job_side.began()  # what runtime.wrap's forward pre-hook calls
                now[0] += seconds
        steps.end()
        return steps.recent[-1][2:5]  # total, data, compute

    steps.end()  # should_stop() first: the clock starts here
    assert step(("fetch", 0.5), ("forward", 0.2), ("forward", 0.2), ("fetch", 0.1)) == \
        pytest.approx([1.0, 0.5, 0.5])  # an accumulation's second fetch and forward: compute
    assert step(("fetch", 0.05), ("timed", 0.3), ("fetch", 0.05), ("forward", 0.2)) == \
        pytest.approx([0.6, 0.4, 0.2])  # the loader's 0.3 s once, the 0.1 s around it too
    with job_side.phase("ckpt"):
        now[0] += 0.7  # a checkpoint saved after the boundary: checkpoint, not data
    assert step(("forward", 0.2)) == pytest.approx([0.9, 0.0, 0.2])
    assert step(("fetch", 0.3)) == pytest.approx([0.3, 0.0, 0.3])  # no forward pass: nothing to tell it by


def test_micro_batches_fold_into_the_optimizer_step_they_belong_to(monkeypatch):
    """Issue 56: gradient accumulation that calls should_stop() per micro-batch counted micro-batches as steps. Where
    the runtime sees the optimizer, a boundary with no optimizer step since the last is a micro-batch's: it folds
    into its step, from the attempt's first step on (the boundaries before the first optimizer step merged back), each
    micro-batch's untimed fetch data. A loop without an optimizer, or one stepping at every boundary, is unchanged."""
    from clusterddp.runtime import telemetry as job_side
    from clusterddp.runtime.state import STATE

    now = [100.0]
    monkeypatch.setattr(job_side, "_clock", lambda: now[0])

    def run(micro: int, optimizer_steps: int, optimizer: bool = True) -> Steps:
        steps = Steps(rank=0, world_size=1, local_world_size=1, restart=0)
        monkeypatch.setitem(STATE, "telemetry", steps)
        steps.end()  # should_stop() first: the clock starts here
        for _ in range(optimizer_steps):
            for m in range(micro):
                now[0] += 0.1          # the fetch (a plain iterable: untimed)
                job_side.began()       # the forward pre-hook
                now[0] += 0.3          # forward + backward
                if optimizer and m == micro - 1:
                    steps.begin()
                    now[0] += 0.05
                    steps.add("opt", 0.05)
                    steps.optimized()  # torch's optimizer post-hook
                steps.end()            # should_stop() per micro-batch
        return steps

    folded = run(micro=4, optimizer_steps=3)
    assert folded.count == 3 and [row[0] for row in folded.recent] == [1, 2, 3]
    for row in folded.recent:  # total, data, compute, comm, opt: four micro-batches and one optimizer step
        assert row[2:7] == pytest.approx([1.65, 0.4, 1.2, 0.0, 0.05])
    assert folded.sums["total"] == pytest.approx(3 * 1.65) and folded.sums["data"] == pytest.approx(1.2)
    assert folded.position() == 3
    plain = run(micro=1, optimizer_steps=5)
    assert plain.count == 5 and all(row[2:5] == pytest.approx([0.45, 0.1, 0.3]) for row in plain.recent)
    none = run(micro=4, optimizer_steps=2, optimizer=False)  # no optimizer seen: every boundary a step
    assert none.count == 8 and all(row[2:5] == pytest.approx([0.4, 0.1, 0.3]) for row in none.recent)


def test_gpu_numbers_show_where_cuda_was_used_and_are_numbers_only(tmp_path):
    files = even_job(n=12)
    files[0]["gpu"] = {"util": 87, "mem_mb": 30 * 1024, "total_mb": 141 * 1024}
    files[1]["gpu"] = {"util": None, "mem_mb": 29 * 1024, "total_mb": 141 * 1024}
    files[2]["gpu"] = {"util": "87; rm -rf", "mem_mb": True}           # not numbers: dropped
    write_run(tmp_path, files)
    snap = top.snapshot(tmp_path)
    assert [r["gpu_util_pct"] for r in snap["ranks"]] == [87, None, None, None]
    lines = top.text(snap).splitlines()
    assert lines[1].split()[-3:] == ["GPU%", "GPU", "MEM"]
    assert lines[2].endswith("87  30.0/141 GiB") and lines[3].endswith("-  29.0/141 GiB"), lines
    assert lines[4].split()[-2:] == ["-", "-"], lines  # rank 2: what it wrote was not numbers
    write_run(tmp_path / "cpu", even_job(n=12))
    assert "GPU%" not in top.text(top.snapshot(tmp_path / "cpu"))


def test_an_allocation_without_an_attempt_is_in_the_ledger(tmp_path):
    """Issue 56: an allocation whose script ended before any attempt was recorded (a setup line failed, the gate,
    a node lost at start) dropped out of the ledger (2,000 of 10,000 node-seconds shown). It is lost whole, and the
    parts still add up to every allocation."""
    test_with_its_allocation_recorded_the_ledger_is_the_allocation(tmp_path)
    with open(tmp_path / contract.ALLOCATIONS_FILE, "a") as fh:  # restart 1: 4 nodes for 100 s, no attempt
        fh.write(f"begin\t1\t{T0 + 300:.3f}\tnode1,node2,node3,node4\nend\t1\t{T0 + 400:.3f}\n")
    ledger = goodput.ledger(tmp_path)
    assert ledger.total == pytest.approx(3 * 187.75 + 4 * 100)
    assert ledger.parts["failed"] == pytest.approx(2 * 10 + 4 * 100)
    alone = tmp_path / "alone"  # and a job with only such an allocation has a ledger, all of it lost
    alone.mkdir()
    (alone / contract.ALLOCATIONS_FILE).write_text(f"begin\t0\t{T0:.3f}\tnode1,node2\nend\t0\t{T0 + 50:.3f}\n")
    only = goodput.ledger(alone)
    assert only is not None and only.total == pytest.approx(100) and only.parts["failed"] == pytest.approx(100)


def test_the_goodput_bar_shows_only_the_parts_there_are_with_their_numbers(tmp_path):
    """Issue 56: the bar had no numbers and a legend of all 9 parts, 6 of them absent."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from clusterddp.observe import report

    test_the_ledger_splits_every_attempt_and_adds_up(tmp_path)
    story = report.gather(tmp_path)
    fig = report._goodput(plt, story, 0.0)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    present = [name for name, value in story.ledger.parts.items() if value > 0]
    assert len(labels) == len(present) < len(goodput.PARTS), labels
    for name, label in zip(present, labels):
        share = 100 * story.ledger.parts[name] / story.ledger.total
        assert label == f"{name} {share:.0f}%", labels
    plt.close(fig)
