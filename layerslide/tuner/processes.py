"""Many tunes at once (what-if rows, purchase variants): one per process, the longest first, and
tunes alike (one host's RAM: the same placements, so the same plans) one after the other in
one process, where tuner.plans keeps the plans they share."""

from __future__ import annotations

import math
import multiprocessing
import os
import queue
import signal
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ProcessPoolExecutor

from layerslide.hwprofiles import HardwareProfile
from layerslide.planner import ModelSpec

# alike items go in batches of at most len(items) / (workers x this): the fewer and longer the
# batches, the more plans their tunes share, and the worse the last batches balance
BATCHES_PER_WORKER = 4


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during in_processes: `results` has the rows done, None for the others."""

    def __init__(self, results: list):
        super().__init__()
        self.results = results


def in_processes(job: Callable, items: Sequence[tuple], *, workers: int | None,
                 progress: Callable[[int, int], None] | None,
                 size: Callable[[tuple], tuple[float, float]],
                 alike: Callable[[tuple], Hashable] | None = None) -> list:
    """job(*item) for each item, results in the items' order; on `workers` processes (default:
    one per core) where there are several items, since each tune runs on one. The largest
    first, so that no core is left with a large one at the end: by `size` (tune_size of its
    model and profile). Items of one `alike` value run one after the other in a process, in batches of at
    most a BATCHES_PER_WORKER-th of a worker's even share (every worker still gets several).
    Ctrl-C (KeyboardInterrupt) returns what is done, None for the rest:
    Interrupted.results."""
    workers = min(workers or os.cpu_count() or 1, len(items))
    results: list = [None] * len(items)
    most = math.ceil(len(items) / (max(workers, 1) * BATCHES_PER_WORKER))
    batches = _batches(items, size, alike, most)
    try:
        if workers <= 1:
            for done, i in enumerate((i for batch in batches for i in batch), 1):
                results[i] = job(*items[i])
                if progress:
                    progress(done, len(items))
        else:
            _in_pool(job, items, batches, workers, results, progress)
    except KeyboardInterrupt:
        raise Interrupted(results) from None
    return results


def _in_pool(job: Callable, items: Sequence[tuple], batches: list[list[int]], workers: int,
             results: list, progress: Callable[[int, int], None] | None) -> None:
    """Each batch on a process of a pool; each item's result comes back as it lands (a queue
    the workers share), so that progress and Ctrl-C see every item done."""
    landed = multiprocessing.Queue()
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_start_worker,
                               initargs=(landed,))
    try:
        futures = [pool.submit(_run_batch, job, [(i, items[i]) for i in batch])
                   for batch in batches]
        for done in range(1, len(items) + 1):
            i, results[i] = _next_landed(landed, futures)
            if progress:
                progress(done, len(items))
    except BaseException:  # Ctrl-C or a failed tune: the other workers' tunes are not waited for
        processes = list((getattr(pool, "_processes", None) or {}).values())  # shutdown drops it
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        raise
    pool.shutdown()


def _next_landed(landed, futures: list) -> tuple[int, object]:
    """The next (index, result) a worker sends; a batch's error as soon as it is raised."""
    while True:
        try:
            return landed.get(timeout=LANDED_POLL_S)
        except queue.Empty:
            for future in futures:
                if future.done() and future.exception() is not None:
                    raise future.exception()


LANDED_POLL_S = 0.5  # how often the parent looks for a failed batch while none lands
_LANDED = None  # a worker's queue to the parent (set as it starts)


def _start_worker(landed) -> None:
    global _LANDED
    _LANDED = landed
    _ignore_interrupts()


def _run_batch(job: Callable, items: list[tuple[int, tuple]]) -> None:
    for i, item in items:
        _LANDED.put((i, job(*item)))


def _ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def tune_size(model: ModelSpec, profile: HardwareProfile) -> tuple[float, float]:
    """How long a tune of the model on the profile takes, to order them by: its parameters,
    then its host's RAM and GPU memory (the more a host holds, the more candidates fit and are
    simulated)."""
    return model.total_params, profile.host.ram_bytes + profile.gpu.memory_bytes


def same_host(model: ModelSpec, profile: HardwareProfile) -> tuple[str, int]:
    """Tunes alike: one model on hosts of one RAM size (the same placements, so the same
    plans)."""
    return model.name, profile.host.ram_bytes


def _batches(items: Sequence[tuple], size: Callable[[tuple], tuple[float, float]],
             alike: Callable[[tuple], Hashable] | None, most: int) -> list[list[int]]:
    """The items' indices in batches of alike ones (each at most `most` long), the largest
    batches first: by their largest model, then by what their items hold together."""
    order = sorted(range(len(items)), key=lambda i: size(items[i]), reverse=True)
    groups: dict[Hashable, list[int]] = {}
    for i in order:
        groups.setdefault(alike(items[i]) if alike else i, []).append(i)
    batches = [group[k:k + most] for group in groups.values()
               for k in range(0, len(group), most)]

    def weight(batch: list[int]) -> tuple[float, float]:
        sizes = [size(items[i]) for i in batch]
        return max(s[0] for s in sizes), sum(s[1] for s in sizes)
    return sorted(batches, key=weight, reverse=True)
