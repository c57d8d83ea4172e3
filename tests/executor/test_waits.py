"""The main thread's waits run a signal's handler that landed on another thread."""

from __future__ import annotations

import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from layerslide.executor import waits


class Heard(Exception):
    pass


@pytest.fixture
def usr1_raises_heard():
    def handler(_signum, _frame):
        raise Heard
    previous = signal.signal(signal.SIGUSR1, handler)
    yield
    signal.signal(signal.SIGUSR1, previous)


def main_thread_waits_in_waits() -> bool:
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None and frame.f_code.co_filename != waits.__file__:
        frame = frame.f_back
    return frame is not None


FINISHED = threading.Event()


def signal_own_thread_then_wait(release: threading.Event) -> None:
    """A worker's work: once the main thread waits for it, SIGUSR1 to itself (not the main
    thread), then wait to be released (or 10 s: a wait deaf to the signal ends only then)."""
    while not main_thread_waits_in_waits():
        time.sleep(0.001)
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
    release.wait(10)
    FINISHED.set()


def test_until_runs_the_handler_while_the_awaited_thread_still_runs(usr1_raises_heard):
    FINISHED.clear()
    release = threading.Event()
    worker = threading.Thread(target=signal_own_thread_then_wait, args=(release,))
    worker.start()
    try:
        with pytest.raises(Heard):
            waits.until(FINISHED)
        assert not FINISHED.is_set()  # heard while the worker still runs
    finally:
        release.set()
        worker.join()
    waits.until(FINISHED)  # and returns once it is set


def test_wait_first_exception_runs_the_handler_while_the_work_still_runs(usr1_raises_heard):
    FINISHED.clear()
    release = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(signal_own_thread_then_wait, release)]
        try:
            with pytest.raises(Heard):
                waits.wait_first_exception(futures)
            assert not FINISHED.is_set()
        finally:
            release.set()


def test_wait_first_exception_returns_at_the_first_failure_or_when_all_are_done():
    release = threading.Event()

    def fail():
        raise ValueError("boom")
    with ThreadPoolExecutor(2) as pool:
        slow, failing = pool.submit(release.wait, 30), pool.submit(fail)
        done = waits.wait_first_exception([slow, failing])
        assert failing in done and slow not in done
        release.set()
        fine = [pool.submit(int, "1"), pool.submit(int, "2")]
        assert waits.wait_first_exception(fine) == set(fine)
