"""Waits in the main thread that still let Python's signal handlers run.

A process-directed signal (Ctrl-C, `kill`) may land on any thread. Python runs its handler only
in the main thread, when that thread next runs bytecode; a main thread blocked in an untimed
lock wait (Thread.join, Future.result, concurrent.futures.wait) is not woken by a signal that
landed elsewhere, so "stop after this step" or "exit at once" would wait for the whole write or
segment. These waits wake every HEED_S to let a pending handler run.

Wait for a thread's end through an Event it sets last, not Thread.join: where a handler raises
(KeyboardInterrupt) inside join, Python 3.11 marks the thread stopped while it still runs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, wait

HEED_S = 0.05  # a pending handler runs within this long


def until(event: threading.Event) -> None:
    """event.wait(), waking to run signal handlers."""
    while not event.wait(HEED_S):
        pass


def wait_first_exception(futures: Sequence[Future]) -> set[Future]:
    """concurrent.futures.wait(futures, return_when=FIRST_EXCEPTION), waking to run signal
    handlers: the done futures once all are done or one has failed."""
    while True:
        done, pending = wait(futures, timeout=HEED_S, return_when=FIRST_EXCEPTION)
        if not pending or any(not f.cancelled() and f.exception() is not None for f in done):
            return done
