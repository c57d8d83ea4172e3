"""Each step's log as soon as the step has run, not when its segment drains.

The engine says a step is done once every task of it has run on the host; its last GPU work
may still be in flight. A thread of its own (no lane ever waits for a step to land) takes each
done step in turn, waits for its GPU work, makes its StepLog and hands it on: a log file or a
batch scheduler's output then gets a record per step instead of a burst per segment.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Protocol

from layerslide.executor import waits


class LandedSteps(Protocol):
    """What the watch needs of the engine (PlanEngine)."""

    def wait_step_landed(self, step: int) -> bool: ...


class StepWatch:
    """Makes `make_log(step)` for each step of a segment as it is done, in step order, and
    calls `on_step(log)` with it; `logs` holds them once the segment has run (finish())."""

    def __init__(self, make_log: Callable[[int], object],
                 on_step: Callable[[object], None] | None = None):
        self.make_log, self.on_step = make_log, on_step
        self.logs: list = []
        self._done: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._ended = threading.Event()  # set last by the thread (see executor.waits)
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def step_done(self, step: int) -> None:
        """The engine's on_step_done: queue the step (a lane's thread calls this)."""
        self._done.put(step)

    def start(self, engine: LandedSteps) -> None:
        self._thread = threading.Thread(target=self._watch, args=(engine,),
                                        name="layerslide-step-logs", daemon=True)
        self._thread.start()

    def finish(self) -> list:
        """After the engine ran every step it will: wait for their logs; a failure of
        make_log or on_step is raised here."""
        self._done.put(None)
        waits.until(self._ended)
        if self._error is not None:
            raise self._error
        return self.logs

    def abandon(self) -> None:
        """After the engine failed: the thread ends at its next step (it is not waited for:
        with several ranks its next log may wait for a rank that failed)."""
        self._done.put(None)

    def _watch(self, engine: LandedSteps) -> None:
        try:
            while (step := self._done.get()) is not None:
                if not engine.wait_step_landed(step):
                    return  # the run failed: its error is raised by the engine
                log = self.make_log(step)
                self.logs.append(log)
                if self.on_step is not None:
                    self.on_step(log)
        except BaseException as exc:  # noqa: BLE001 (handed to finish(), in the main thread)
            self._error = exc
        finally:
            self._ended.set()
