"""The discrete-event kernel the simulator runs on: SimPy's semantics for the few constructs the
engine uses (events, timeouts, processes of generators, all-of conditions), without the rest.

Events are processed in SimPy's order: by time, then priority (a process's start is urgent),
then the order they were scheduled in; an event's callbacks run in the order they were added; a
process resumes inside the callback of the event it waited for, and runs on at once past events
already processed; a condition is scheduled as its last event is processed. So a plan runs
event for event as it did on simpy.Environment (plan_equivalence: every trace identical).
What the engine never reads is left out: event values, failures, interrupts, a process's own
end event (nothing waits on one)."""

from __future__ import annotations

from heapq import heappop, heappush
from itertools import count

URGENT, NORMAL = 0, 1  # SimPy's priorities: a process starts before events of its instant


class Event:
    """An event: `triggered` once scheduled, `callbacks` None once processed."""

    __slots__ = ("callbacks", "env", "triggered")

    def __init__(self, env: Kernel):
        self.env = env
        self.callbacks: list | None = []
        self.triggered = False

    def succeed(self) -> Event:
        if self.triggered:
            raise RuntimeError("the event has already been triggered")
        self.triggered = True
        env = self.env
        heappush(env.queue, (env.now, NORMAL, next(env.eid), self))
        return self

    def __and__(self, other: Event) -> AllOf:
        return AllOf(self.env, (self, other))


class AllOf(Event):
    """Scheduled once each of its events has been processed (at once if none is left)."""

    __slots__ = ("left",)

    def __init__(self, env: Kernel, events):
        Event.__init__(self, env)
        self.left = len(events)
        if not self.left:
            self.succeed()
            return
        for event in events:
            if event.callbacks is None:
                self._check(event)
            else:
                event.callbacks.append(self._check)

    def _check(self, _event: Event) -> None:
        self.left -= 1
        if self.left == 0:
            self.succeed()


class Process:
    """A generator yielding events, resumed as each is processed; started urgently, now."""

    __slots__ = ("generator",)

    def __init__(self, env: Kernel, generator):
        self.generator = generator
        start = Event(env)
        start.triggered = True
        start.callbacks.append(self._resume)
        heappush(env.queue, (env.now, URGENT, next(env.eid), start))

    def _resume(self, _event: Event) -> None:
        send = self.generator.send
        while True:
            try:
                event = send(None)
            except StopIteration:
                return
            if event.callbacks is not None:  # not yet processed: wait for it
                event.callbacks.append(self._resume)
                return


class Kernel:
    """The clock and the queue of scheduled events: (time, priority, order, event)."""

    __slots__ = ("eid", "now", "queue")

    def __init__(self):
        self.now = 0  # an int until the first timeout, as SimPy's (a trace's first times read 0)
        self.queue: list[tuple[float, int, int, Event]] = []
        self.eid = count()

    def event(self) -> Event:
        return Event(self)

    def timeout(self, delay: float) -> Event:
        """An event processed `delay` seconds from now."""
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        event = Event(self)
        event.triggered = True
        heappush(self.queue, (self.now + delay, NORMAL, next(self.eid), event))
        return event

    def all_of(self, events) -> AllOf:
        return AllOf(self, events)

    def process(self, generator) -> Process:
        return Process(self, generator)

    def run(self) -> None:
        """Process events until none is left."""
        queue = self.queue
        while queue:
            self.now, _, _, event = heappop(queue)
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
