"""The simulator's memory ledger: tiers, GPU pools per allocating lane, the allocator's reserve."""

from layerslide.planner.plan import Buffer, runtime_buffer_id
from layerslide.simulator.allocator import LARGE_PAGE_BYTES, MIB
from layerslide.simulator.memory import MemoryLedger


class _Plan:
    """The two things the ledger reads of a plan: its buffers and each task's lane (as the
    lanes' orders)."""

    def __init__(self, buffers, lanes):
        self.buffers = buffers
        self.lane_order: dict[str, list[str]] = {}
        for tid, lane in lanes.items():
            self.lane_order.setdefault(lane, []).append(tid)


def test_the_runtime_counts_in_the_static_pool_but_is_no_allocation():
    plan = _Plan([Buffer(id=runtime_buffer_id("gpu"), tier="gpu", bytes=700 * MIB),
                  Buffer(id="weights", tier="gpu", bytes=30 * MIB)], {})
    ledger = MemoryLedger(plan)
    assert ledger.pool_peaks == {"static": 730 * MIB}
    assert ledger.gpu_pool_reserves() == {"static": 2 * LARGE_PAGE_BYTES}


def test_a_buffer_leaves_the_allocator_at_its_last_release():
    plan = _Plan([Buffer(id="acts", tier="gpu", bytes=30 * MIB, alloc_task="fwd",
                         release_tasks=("next_fwd", "offload"))],
                 {"fwd": "gpu", "next_fwd": "gpu", "offload": "d2h"})
    ledger = MemoryLedger(plan)
    ledger.dispatched(0.0, "fwd")
    ledger.allocate(0.0, "fwd")
    ledger.enqueued(0.5, "next_fwd")
    ledger.release(1.0, "next_fwd")
    assert ledger.pool_in_use == {"gpu": 30 * MIB}
    # the d2h stream used it: the allocator takes it back once that use has ended
    ledger.release(2.0, "offload")
    assert ledger.pool_in_use == {"gpu": 0}
    ledger.dispatched(3.0, "fwd")  # freed: its block is handed out again, no new pages
    ledger.allocate(3.0, "fwd")
    assert ledger.gpu_pool_reserves() == {"gpu": 2 * LARGE_PAGE_BYTES}
    assert [(s.time_s, s.bytes_in_use) for s in ledger.samples if s.tier == "gpu"] == [
        (0.0, 0), (0.0, 30 * MIB), (2.0, 0), (3.0, 30 * MIB)]


def test_host_buffers_stay_out_of_the_gpu_pools():
    plan = _Plan([Buffer(id="staging", tier="host", bytes=64 * MIB, alloc_task="cast",
                         release_tasks=("load",))], {"cast": "cpu", "load": "h2d"})
    ledger = MemoryLedger(plan)
    ledger.allocate(0.0, "cast")
    assert ledger.in_use["host"] == 64 * MIB
    assert ledger.pool_peaks == {} and ledger.gpu_pool_reserves() == {}


def test_a_block_only_its_own_stream_used_is_free_once_its_user_is_enqueued():
    """The caching allocator hands a block freed on a stream to the next request there at once
    (stream order): the next task's scratch takes the same pages before the GPU has run."""
    plan = _Plan([Buffer(id="a.scratch", tier="gpu", bytes=30 * MIB, alloc_task="a",
                         release_tasks=("a",)),
                  Buffer(id="b.scratch", tier="gpu", bytes=30 * MIB, alloc_task="b",
                         release_tasks=("b",))], {"a": "gpu", "b": "gpu"})
    ledger = MemoryLedger(plan)
    ledger.dispatched(0.0, "a")
    ledger.enqueued(0.1, "a")
    ledger.dispatched(0.1, "b")  # a has not even started on the GPU
    assert ledger.gpu_pool_reserves() == {"gpu": 2 * LARGE_PAGE_BYTES}  # 30 MiB: 2 pages


def test_a_block_another_stream_used_waits_for_that_use_to_end_and_its_own_users():
    plan = _Plan([Buffer(id="ckpt", tier="gpu", bytes=30 * MIB, alloc_task="fwd",
                         release_tasks=("next_fwd", "offload")),
                  Buffer(id="later", tier="gpu", bytes=30 * MIB, alloc_task="fwd2")],
                 {"fwd": "gpu", "next_fwd": "gpu", "offload": "d2h", "fwd2": "gpu"})
    ledger = MemoryLedger(plan)
    ledger.dispatched(0.0, "fwd")
    ledger.release(1.0, "offload")  # the d2h copy is done, the next forward still holds it
    ledger.dispatched(1.0, "fwd2")
    # no reuse: 60 MiB side by side, 3 pages
    assert ledger.gpu_pool_reserves() == {"gpu": 3 * LARGE_PAGE_BYTES}
    ledger = MemoryLedger(plan)
    ledger.dispatched(0.0, "fwd")
    ledger.enqueued(0.5, "next_fwd")  # its own stream is done with it, the copy is not
    ledger.dispatched(0.6, "fwd2")
    assert ledger.gpu_pool_reserves() == {"gpu": 3 * LARGE_PAGE_BYTES}
    ledger = MemoryLedger(plan)
    ledger.dispatched(0.0, "fwd")
    ledger.enqueued(0.5, "next_fwd")
    ledger.release(1.0, "offload")  # both done: the block is the allocator's again
    ledger.dispatched(1.0, "fwd2")
    assert ledger.gpu_pool_reserves() == {"gpu": 2 * LARGE_PAGE_BYTES}


def test_a_tasks_outputs_come_as_it_ends_in_the_scratch_it_has_freed():
    """A backward's grads (at_end) are requested after its workspace is freed, so they take
    its block; in bytes in use they come as the task ends, its workspace gone."""
    plan = _Plan([Buffer(id="bwd.workspace", tier="gpu", bytes=30 * MIB, alloc_task="bwd",
                         release_tasks=("bwd",)),
                  Buffer(id="bwd.grads", tier="gpu", bytes=30 * MIB, alloc_task="bwd",
                         release_tasks=("offload",), at_end=True)],
                 {"bwd": "gpu", "offload": "d2h"})
    ledger = MemoryLedger(plan)
    ledger.dispatched(0.0, "bwd")
    ledger.allocate(0.0, "bwd")
    assert ledger.in_use["gpu"] == 30 * MIB  # the workspace alone
    ledger.enqueued(0.1, "bwd")
    ledger.release(1.0, "bwd")
    assert ledger.in_use["gpu"] == 30 * MIB  # the grads alone
    assert ledger.pool_peaks == {"gpu": 30 * MIB}
    assert ledger.gpu_pool_reserves() == {"gpu": 2 * LARGE_PAGE_BYTES}


def test_a_tasks_outputs_come_before_the_inputs_it_releases_go():
    """The sweep's last backward rounds the fp32 sum an earlier task made into bf16 grads: its
    workspace is gone by then, the sum not yet, in bytes in use, torch's count and the
    allocator's eyes alike (the rounded grads cannot take the sum's block)."""
    plan = _Plan([Buffer(id="first.sum", tier="gpu", bytes=40 * MIB, alloc_task="first",
                         release_tasks=("last",)),
                  Buffer(id="last.workspace", tier="gpu", bytes=30 * MIB, alloc_task="last",
                         release_tasks=("last",)),
                  Buffer(id="last.rounded", tier="gpu", bytes=20 * MIB, alloc_task="last",
                         release_tasks=("offload",), at_end=True)],
                 {"first": "gpu", "last": "gpu", "offload": "d2h"})
    ledger = MemoryLedger(plan)
    for task in ("first", "last"):
        ledger.dispatched(0.0, task)
        ledger.allocate(0.0, task)
    assert ledger.in_use["gpu"] == 70 * MIB and ledger.held_bytes == 70 * MIB
    ledger.enqueued(0.1, "last")
    assert ledger.held_bytes == 20 * MIB and ledger.held_peak_bytes == 70 * MIB
    ledger.release(1.0, "last")
    assert ledger.in_use["gpu"] == 20 * MIB
    assert ledger.pool_peaks == {"gpu": 70 * MIB}
    gpu = [s.bytes_in_use for s in ledger.samples if s.tier == "gpu"]
    assert gpu[-3:] == [40 * MIB, 60 * MIB, 20 * MIB]  # workspace gone, rounded made, sum gone
    # the rounded grads take the freed workspace's pages: the sum's 2 and its 2, no more
    assert ledger.gpu_pool_reserves() == {"gpu": 4 * LARGE_PAGE_BYTES}


def test_scratch_that_outlives_the_outputs_goes_after_them():
    """The head's first micro-batch makes its LM-weight grad, then copies it into a new fp32
    sum (its output) and only then drops it: the sum cannot take the grad's block, only the
    hole the loss's logits chunk, gone before, leaves."""
    plan = _Plan([Buffer(id="head.grads", tier="gpu", bytes=40 * MIB, alloc_task="head",
                         release_tasks=("head",), outlives_outputs=True),
                  Buffer(id="head.chunk", tier="gpu", bytes=60 * MIB, alloc_task="head",
                         release_tasks=("head",)),
                  Buffer(id="head.sum", tier="gpu", bytes=80 * MIB, alloc_task="head",
                         release_tasks=("last_head",), at_end=True)],
                 {"head": "gpu", "last_head": "gpu"})
    ledger = MemoryLedger(plan)
    ledger.dispatched(0.0, "head")
    ledger.allocate(0.0, "head")
    ledger.enqueued(0.1, "head")
    assert ledger.held_bytes == 80 * MIB and ledger.held_peak_bytes == 120 * MIB
    ledger.release(1.0, "head")
    gpu = [s.bytes_in_use for s in ledger.samples if s.tier == "gpu"]
    assert gpu[-3:] == [40 * MIB, 120 * MIB, 80 * MIB]  # chunk gone, sum made, grads gone
    # the sum takes the chunk's hole at the end and 20 MiB more: 6 pages, where the grads' and
    # the chunk's merged 100 MiB would have held it in 5
    assert ledger.gpu_pool_reserves() == {"gpu": 6 * LARGE_PAGE_BYTES}


def test_host_buffers_never_reach_the_allocator_through_the_threads_either():
    plan = _Plan([Buffer(id="staging", tier="host", bytes=64 * MIB, alloc_task="cast",
                         release_tasks=("load",))], {"cast": "cpu", "load": "h2d"})
    ledger = MemoryLedger(plan)
    ledger.dispatched(0.0, "cast")
    ledger.allocate(0.0, "cast")
    ledger.enqueued(0.1, "cast")
    ledger.enqueued(0.2, "load")
    ledger.release(0.3, "load")
    assert ledger.gpu_pool_reserves() == {}
