"""Many tunes at once: results in the items' order, alike items on one process one after the
other, progress per item, a failing item's error raised, the largest batches first."""

import os
import time

import pytest

from layerslide.tuner import processes
from layerslide.tuner.processes import _batches, in_processes


def _pid_after(delay_s: float, key: str) -> tuple[str, int]:
    time.sleep(delay_s)
    return key, os.getpid()


def _equal_size(item: tuple) -> tuple[float, float]:
    return 0.0, 0.0


def _fails_for_b(key: str) -> str:
    if key == "b":
        raise ValueError(f"no tune for {key}")
    return key


def test_alike_items_run_on_one_process_one_after_the_other(monkeypatch):
    monkeypatch.setattr(processes, "BATCHES_PER_WORKER", 1)  # two batches of two
    items = [(0.05, "a"), (0.05, "b"), (0.05, "a"), (0.05, "b")]
    seen = []
    out = in_processes(_pid_after, items, workers=2, size=_equal_size, alike=lambda item: item[1],
                       progress=lambda done, total: seen.append((done, total)))
    assert [key for key, _ in out] == ["a", "b", "a", "b"]
    pids = {key: {pid for k, pid in out if k == key} for key in "ab"}
    assert len(pids["a"]) == len(pids["b"]) == 1 and pids["a"] != pids["b"]
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]  # each item as it lands


def test_without_likeness_every_item_is_free_to_go_to_any_process():
    assert _batches([(0.0, "a")] * 4, lambda item: (1.0, 0.0), None, 2) == [[0], [1], [2], [3]]


def test_batches_hold_an_even_share_at_most_and_the_largest_go_first():
    items = [("small", 1.0), ("big", 9.0), ("small", 1.0), ("small", 1.0), ("big", 9.0)]
    batches = _batches(items, lambda item: (0.0, item[1]), lambda item: item[0], 2)
    assert batches == [[1, 4], [0, 2], [3]]


def test_a_failing_item_raises_its_error_in_the_parent():
    with pytest.raises(ValueError, match="no tune for b"):
        in_processes(_fails_for_b, [("a",), ("b",), ("c",)], workers=2, progress=None,
                     size=_equal_size,
                     alike=lambda item: 0)


def test_ctrl_c_keeps_every_item_done_and_stops_the_workers():
    def interrupted_after_one(done: int, total: int) -> None:
        raise KeyboardInterrupt  # Ctrl-C as the first item lands
    items = [(0.0, "quick")] + [(5.0, f"slow{i}") for i in range(3)]
    started = time.monotonic()
    with pytest.raises(processes.Interrupted) as stop:
        in_processes(_pid_after, items, workers=2, progress=interrupted_after_one,
                     size=_equal_size)
    assert [r and r[0] for r in stop.value.results] == ["quick", None, None, None]
    assert time.monotonic() - started < 4  # the slow ones were not waited for
