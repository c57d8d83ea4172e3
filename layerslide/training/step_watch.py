"""Each step's log as soon as the step has run, not when its segment drains.

The engine says a step is done once every task of it has run on the host; its last GPU work
may still be in flight. A thread of its own (no lane ever waits for a step to land) takes each
done step in turn, waits for its GPU work, makes its StepLog and hands it on: a log file or a
batch scheduler's output then gets a record per step instead of a burst per segment.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

from layerslide.executor import waits


class LandedSteps(Protocol):
    """What the watch needs of the engine (PlanEngine)."""

    def wait_step_landed(self, step: int) -> bool: ...


class StepWatch:
    """Makes `make_log(step)` for each step of a segment (0, 1, ...) once it is done and has
    landed, in step order whatever order they are done in, and calls `on_step(log)` with it.
    finish() returns the logs; `error` is a failure of make_log or on_step (later steps of
    the segment are then not logged)."""

    def __init__(self, make_log: Callable[[int], object],
                 on_step: Callable[[object], None] | None = None):
        self.make_log, self.on_step = make_log, on_step
        self.logs: list = []
        self.error: BaseException | None = None
        self._done: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._ended = threading.Event()  # set last by the thread (see executor.waits)
        self._handing_on = threading.Lock()  # held while a log is handed on
        self._abandoned = False

    def step_done(self, step: int) -> None:
        """The engine's on_step_done: queue the step (a lane's thread calls this)."""
        self._done.put(step)

    def start(self, engine: LandedSteps, bind_thread: Callable[[], None] = lambda: None) -> None:
        """Start the thread (bind_thread: put it on the run's device first)."""
        threading.Thread(target=self._watch, args=(engine, bind_thread),
                         name="layerslide-step-logs", daemon=True).start()

    def finish(self) -> list:
        """After the engine ran every step it will: wait for their logs."""
        self._done.put(None)
        waits.until(self._ended)
        return self.logs

    def abandon(self) -> None:
        """After the engine failed: no log is handed on from now (one being handed on is
        waited for); the thread is not (with several ranks its next log may wait for a rank
        that failed)."""
        while not self._handing_on.acquire(timeout=waits.HEED_S):
            pass  # a pending signal handler runs meanwhile
        self._abandoned = True
        self._handing_on.release()
        self._done.put(None)

    def _in_order(self) -> Iterator[int]:
        """The done steps in step order, each as soon as those before it are done too."""
        pending, next_step = set(), 0
        while (step := self._done.get()) is not None:
            pending.add(step)
            while next_step in pending:
                pending.remove(next_step)
                yield next_step
                next_step += 1

    def _watch(self, engine: LandedSteps, bind_thread: Callable[[], None]) -> None:
        try:
            bind_thread()
            for step in self._in_order():
                if self._abandoned or not engine.wait_step_landed(step):
                    return  # the run failed: its error is raised by the engine
                log = self.make_log(step)
                with self._handing_on:
                    if self._abandoned:
                        return
                    self.logs.append(log)
                    if self.on_step is not None:
                        self.on_step(log)
        except BaseException as exc:  # noqa: BLE001 (the caller raises it once the segment ran)
            self.error = exc
        finally:
            self._ended.set()
