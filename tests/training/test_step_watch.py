"""StepWatch: each step's log made as it lands, in step order, off the engine's threads."""

from __future__ import annotations

import threading

import pytest

from layerslide.training.step_watch import StepWatch


class Landing:
    """An engine whose steps land when the test says (or never, where the run failed)."""

    def __init__(self, failed_at: int | None = None):
        self.landed = {s: threading.Event() for s in range(8)}
        self.failed_at = failed_at

    def wait_step_landed(self, step: int) -> bool:
        if step == self.failed_at:
            return False
        return self.landed[step].wait(10)


def test_logs_come_in_step_order_each_once_its_step_has_landed():
    engine, seen = Landing(), []
    watch = StepWatch(lambda s: f"log {s}", seen.append)
    watch.start(engine)
    for s in range(3):
        watch.step_done(s)
    engine.landed[0].set()
    engine.landed[1].set()
    assert not engine.landed[2].wait(0.2) and seen[:2] == ["log 0", "log 1"]
    assert len(seen) == 2  # step 2 has not landed: its log waits
    engine.landed[2].set()
    assert watch.finish() == ["log 0", "log 1", "log 2"] == seen


def test_a_failing_log_callback_is_raised_in_the_caller_once_the_segment_has_run():
    def broken(log) -> None:
        raise OSError("disk gone")

    engine = Landing()
    watch = StepWatch(lambda s: s, broken)
    watch.start(engine)
    engine.landed[0].set()
    watch.step_done(0)
    with pytest.raises(OSError, match="disk gone"):
        watch.finish()


def test_a_failed_run_ends_the_watch_with_the_steps_logged_before_it():
    engine = Landing(failed_at=1)
    engine.landed[0].set()
    watch = StepWatch(lambda s: s)
    watch.start(engine)
    for s in range(3):
        watch.step_done(s)
    assert watch.finish() == [0]


def test_abandon_does_not_wait_for_a_log_still_waiting():
    engine = Landing()
    lands_later = threading.Timer(3, engine.landed[0].set)  # would free a waiting abandon()
    watch = StepWatch(lambda s: s)
    watch.start(engine)
    watch.step_done(0)
    lands_later.start()
    watch.abandon()
    assert not engine.landed[0].is_set()  # abandon() returned before step 0 could land
    lands_later.cancel()
