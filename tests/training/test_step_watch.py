"""StepWatch: each step's log made as it lands, in step order, off the engine's threads."""

from __future__ import annotations

import threading

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


def test_steps_done_out_of_order_are_logged_in_order():
    engine, seen = Landing(), []
    for s in range(3):
        engine.landed[s].set()
    watch = StepWatch(lambda s: s, seen.append)
    watch.start(engine)
    for s in (1, 2, 0):
        watch.step_done(s)
    assert watch.finish() == [0, 1, 2] == seen


def test_a_failing_log_callback_is_kept_for_the_caller_and_ends_the_logs():
    def broken(log) -> None:
        if log == 1:
            raise OSError("disk gone")

    engine = Landing()
    watch = StepWatch(lambda s: s, broken)
    watch.start(engine)
    for s in range(3):
        engine.landed[s].set()
        watch.step_done(s)
    assert watch.finish() == [0, 1]
    assert isinstance(watch.error, OSError) and "disk gone" in str(watch.error)


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


def test_after_abandon_no_log_is_handed_on_even_for_steps_that_land_later():
    engine, seen = Landing(), []
    watch = StepWatch(lambda s: s, seen.append)
    watch.start(engine)
    engine.landed[0].set()
    watch.step_done(0)
    watch.step_done(1)
    while not seen:  # step 0's log is handed on; step 1 waits to land
        threading.Event().wait(0.01)
    watch.abandon()
    engine.landed[1].set()  # lands after the failure the caller is raising
    threading.Event().wait(0.3)
    assert seen == [0] and watch.logs == [0]
