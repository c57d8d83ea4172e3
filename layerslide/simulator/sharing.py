"""Fluid sharing of bandwidth: tasks that draw on the same resource slow each other down.

A running task progresses at a rate in (0, 1] of its solo speed. When the tasks on a resource
ask for more than its capacity, each gets a share weighted by its `share` (water-filling, no
task above its own demand); a task on several resources runs at its tightest share. A resource
may have another capacity while tasks of different tags run on it at once (a disk reading and
writing together moves less than either way alone).
"""

from __future__ import annotations

from collections.abc import Iterable

from layerslide.simulator.kernel import Event, Kernel

_DONE_EPS_S = 1e-9  # a nanosecond of solo work left counts as done (float round-off)


def _added(values) -> float:
    """The values added left to right: sum() of floats compensates its round-off from Python
    3.12 on, and the C engine (simulator/csrc/engine.c) adds as this does on every version."""
    total = 0.0
    for value in values:
        total += value
    return total


class _Flow:
    __slots__ = ("done", "limits", "rate", "remaining_s", "share", "tag", "uses")

    def __init__(self, solo_s: float, uses, share: float, done: Event, tag: str):
        self.remaining_s = solo_s  # seconds of solo-speed work left
        self.uses = uses
        self.share = share
        self.rate = 1.0  # its tightest share: the least of its limits, 1 with none
        # resource -> the fraction of its demand it gets there, where the resource is short
        self.limits: dict[str, float] = {}
        self.done = done
        self.tag = tag


def water_fill(demands: list[float], weights: list[float], capacity: float) -> list[float]:
    """Fraction of its demand each consumer gets: min(1, lam * weight), sum(used) == capacity."""
    total = _added(demands)
    if total <= capacity:
        return [1.0] * len(demands)
    # Raise lam until capacity is spent; consumers saturate (fraction 1) in order of weight.
    # One that asks for nothing (a copy whose host-memory cost was fitted at 0) takes nothing:
    # it runs at its full rate.
    order = sorted((i for i in range(len(demands)) if demands[i] > 0),
                   key=lambda i: 1.0 / weights[i])
    fractions = [0.0 if d > 0 else 1.0 for d in demands]
    left, weighted = capacity, _added(d * w for d, w in zip(demands, weights))
    for idx in order:
        lam = left / weighted if weighted > 0 else 0.0
        if lam * weights[idx] >= 1.0:
            fractions[idx] = 1.0
            left -= demands[idx]
            weighted -= demands[idx] * weights[idx]
        else:
            for j in order[order.index(idx):]:
                fractions[j] = lam * weights[j]
            break
    return fractions


class SharedResources:
    """Runs tasks against shared capacities inside an event kernel (simulator.kernel, or a
    simpy.Environment: the same calls)."""

    def __init__(self, env: Kernel, capacities: dict[str, float],
                 mixed_capacities: dict[str, float] | None = None):
        self.env = env
        self.capacities = capacities
        # resource -> its capacity while flows of two or more different tags use it
        self.mixed_capacities = mixed_capacities or {}
        self.flows: list[_Flow] = []
        # resource -> (flow, demand) of each use of it, in the flows' order: a resource's
        # shares depend on these alone, so a change reshares only the resources it touches
        self.members: dict[str, list[tuple[_Flow, float]]] = {}
        self._last_s = 0.0
        self._short: set[str] = set()  # resources whose flows asked for more than they have
        # Each change of the running set schedules a timer for the next completion; timers
        # from before the latest change are stale and ignored (cheaper than cancelling).
        self._timer = None
        self._fire = self._on_timer  # the timers' callback, bound once

    def run(self, solo_s: float, uses: Iterable[tuple[str, float]], share: float,
            tag: str = "") -> Event:
        """Start a task; the returned event fires when its work is done."""
        done = self.env.event()
        self._advance()
        flow = _Flow(solo_s, tuple(uses), share, done, tag)
        self.flows.append(flow)
        for resource, demand in flow.uses:
            self.members.setdefault(resource, []).append((flow, demand))
        self._reallocate({resource for resource, _ in flow.uses})
        self._schedule()
        return done

    def _advance(self) -> None:
        elapsed = self.env.now - self._last_s
        if elapsed > 0:
            for f in self.flows:
                f.remaining_s -= elapsed * f.rate
        self._last_s = self.env.now

    def _reallocate(self, touched: set[str]) -> None:
        """Reshare the resources whose flows changed; then the rate of each flow on them. A
        resource short neither before nor now limits none of its flows: they keep their rates
        (most changes: a launch on the host's cores, a copy alone on its link)."""
        changed: dict[_Flow, None] = {}
        for resource in touched:
            members = self.members[resource]
            shares = self._shares(resource, members)
            if not shares and resource not in self._short:
                continue
            for f, _ in members:
                f.limits.pop(resource, None)
                changed[f] = None
            for f, fraction in shares:
                f.limits[resource] = min(f.limits.get(resource, fraction), fraction)
            if shares:
                self._short.add(resource)
            else:
                self._short.discard(resource)
        for f in changed:
            rate = 1.0
            for fraction in f.limits.values():
                rate = min(rate, fraction)
            f.rate = rate

    def _shares(self, resource: str, members: list[tuple[_Flow, float]],
                ) -> list[tuple[_Flow, float]]:
        """(flow, fraction of its demand) for each use of a short resource; none for one
        that has enough (its uses' demands within its capacity)."""
        if not members:
            return []
        capacity = self.capacities[resource]
        if resource in self.mixed_capacities and len({f.tag for f, _ in members}) > 1:
            capacity = self.mixed_capacities[resource]
        demands = [d for _, d in members]
        if _added(demands) <= capacity:
            return []
        fractions = water_fill(demands, [f.share for f, _ in members], capacity)
        return list(zip((f for f, _ in members), fractions))

    def _schedule(self) -> None:
        if not self.flows:
            self._timer = None
            return
        next_s = max(min(f.remaining_s / f.rate for f in self.flows), 0.0)
        self._timer = self.env.timeout(next_s)
        self._timer.callbacks.append(self._fire)

    def _on_timer(self, timer) -> None:
        if timer is not self._timer:
            return  # the running set changed since this timer was set
        self._advance()
        finished = [f for f in self.flows if f.remaining_s <= _DONE_EPS_S]
        self.flows = [f for f in self.flows if f.remaining_s > _DONE_EPS_S]
        touched = {resource for f in finished for resource, _ in f.uses}
        for resource in touched:
            self.members[resource] = [m for m in self.members[resource]
                                      if m[0].remaining_s > _DONE_EPS_S]
        for f in finished:
            f.done.succeed()
        self._reallocate(touched)
        self._schedule()
