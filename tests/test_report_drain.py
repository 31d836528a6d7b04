"""runtime.report's TensorBoard events, written by the control thread (not inline on rank 0 in the steps it reports):
everything reported arrives once, in order, even when the exit's drain meets the control thread's; a writer that
fails is said once and never raises into the control thread."""
from __future__ import annotations

import importlib
import threading
import types

import pytest

from clusterddp import contract
from clusterddp.runtime.state import STATE

report = importlib.import_module("clusterddp.runtime.report")  # (the package's `report` is the function)


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.setenv(contract.RUN_DIR, str(tmp_path))
    monkeypatch.setenv(contract.TENSORBOARD, "1")
    alive = threading.Event()
    waiter = threading.Thread(target=alive.wait, daemon=True)
    waiter.start()
    STATE["control"] = types.SimpleNamespace(thread=waiter)  # a control thread that runs
    yield tmp_path
    alive.set()
    STATE.pop("control", None)
    report.close_boards()
    report._FAILED.clear()


def test_reports_left_to_the_control_thread_arrive_once_in_order_whoever_drains(job):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for step in range(200):
        assert report.report(step=step, loss=1.0 / (step + 1))
    assert len(report._PENDING) == 200 and not (job / "tensorboard").exists()  # nothing written inline
    drains = [threading.Thread(target=report.drain) for _ in range(4)]  # the control thread and the exit's, at once
    for t in drains:
        t.start()
    for t in drains:
        t.join(60)
    report.close_boards()
    events = EventAccumulator(str(job / "tensorboard" / "metrics")).Reload().Scalars("loss")
    assert [e.step for e in events] == list(range(200))
    assert (job / contract.METRICS_FILE).read_text().count("\n") == 200


def test_a_writer_that_fails_is_said_once_and_never_raises(job, monkeypatch, capsys):
    def broken(step, scalars):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "_board_metrics", broken)
    for step in range(3):
        report.report(step=step, loss=0.5)
    report.drain()
    assert not report._PENDING
    err = capsys.readouterr().err
    assert err.count("TensorBoard's events not written (OSError: [Errno 28] No space left on device)") == 1, err
