"""Where the plan's lanes run: CUDA streams and events on a GPU, plain calls on the CPU.

On a GPU the lanes gpu, h2d and d2h are CUDA streams: work is enqueued and ordered by events.
In CPU device mode (CI, no GPU) the same calls run synchronously, so an event is complete as
soon as it exists; the executor's logic is otherwise identical.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Self

import torch

from layerslide.kinds import STREAM_LANES

# Host buffers at least this large are malloc'ed with mmap (glibc's threshold tops out at
# 32 MiB), so each owns whole pages and can be page-locked in place.
REGISTER_MIN_BYTES = 64 * 2**20


class LaneDevice:
    """Owns one CUDA stream per stream lane (none on the CPU) and the timing base."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        if self.is_cuda and not torch.cuda.is_initialized():
            # cache units, activations and per-layer grads of many sizes fragment the caching
            # allocator: reserved ran 1.25x the allocated peak without expandable segments
            # (micro-batch 1, default policy) and 1.10x with them (tuned micro-batch 8) on the
            # H200 (benchmarks/results/executor_*_2026-11-29); a memory cap counts reserved
            os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        if self.is_cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type not in ("cuda", "cpu"):
            raise ValueError(f"device {self.device} is not supported: use cuda or cpu")
        self._streams = {}
        self._registered: list[torch.Tensor] = []  # host buffers we page-locked
        if self.is_cuda:
            torch.cuda.set_device(self.device)
            # compute on its own stream too: the default stream would serialise with the others
            self._streams = {lane: torch.cuda.Stream(self.device) for lane in STREAM_LANES}
        self._base_event = None
        self._base_host_s = 0.0
        self.reset_clock()

    # --- streams and events ----------------------------------------------------------------
    @contextlib.contextmanager
    def on(self, lane: str) -> Iterator[None]:
        """Run the body's GPU work on the lane's stream (a no-op on the CPU and host lanes)."""
        stream = self._streams.get(lane)
        if stream is None:
            yield
            return
        with torch.cuda.stream(stream):
            yield

    def record(self, lane: str, *, timing: bool = False,
               blocking: bool = False) -> torch.cuda.Event | None:
        """An event marking everything enqueued on the lane so far (None on the CPU); a
        blocking one puts a thread that synchronizes on it to sleep instead of spinning."""
        stream = self._streams.get(lane)
        if stream is None:
            return None
        event = torch.cuda.Event(enable_timing=timing, blocking=blocking)
        event.record(stream)
        return event

    def wait(self, lane: str, event: torch.cuda.Event | None) -> None:
        """Make the lane's later work wait for the event, without blocking the host."""
        stream = self._streams.get(lane)
        if stream is not None and event is not None:
            stream.wait_event(event)

    def prime_blas_workspaces(self, lane: str) -> None:
        """Make cuBLAS's workspaces for this thread and for autograd's now, on the lane's
        stream, while its pool holds nothing else. Each thread's cuBLAS handle takes a 32 MiB
        workspace per stream from the caching allocator at its first GEMM there and keeps it:
        left to autograd's first backward GEMM, it landed above everything step 0 had live and
        split the pool's address range, and the head's logits chunk no longer fit below it
        (allocator histories, H200: 160-460 MiB more reserved at micro-batch 8-16;
        dev/HISTORY.md, session 10). A no-op on the CPU."""
        if not self.is_cuda:
            return
        with self.on(lane):
            x = torch.ones(16, 16, device=self.device, dtype=torch.bfloat16, requires_grad=True)
            (x @ x).sum().backward()  # forward: this thread's handle; backward: autograd's

    def bind_thread(self) -> None:
        """Make this thread's CUDA calls go to our device (threads start on the default one)."""
        if self.is_cuda:
            torch.cuda.set_device(self.device)

    @staticmethod
    def is_done(event: torch.cuda.Event | None) -> bool:
        return event is None or event.query()

    @staticmethod
    def block_on(event: torch.cuda.Event | None) -> None:
        if event is not None:
            event.synchronize()

    def lane_of_stream(self) -> dict[int, str]:
        """Each lane's CUDA stream handle (as torch.cuda.memory_snapshot names a segment's
        stream) -> the lane; empty on the CPU."""
        return {stream.cuda_stream: lane for lane, stream in self._streams.items()}

    def keep_for(self, tensor: torch.Tensor, lane: str) -> None:
        """Tell the allocator a tensor made on one stream is used on the lane's stream."""
        stream = self._streams.get(lane)
        if stream is not None and tensor.is_cuda:
            tensor.record_stream(stream)

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    # --- host memory ---------------------------------------------------------------------------
    def host_empty(self, numel: int, dtype: torch.dtype, *, pinned: bool = True) -> torch.Tensor:
        """A host buffer; page-locked where a GPU copies from or into it.

        Large buffers are pinned through cudaHostRegister rather than torch's pinned allocator,
        which rounds each allocation up to a power of two (up to 2x the RAM for a block's
        buffers). Small ones come from that allocator: registering them could touch a page
        another registration already holds."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if pinned and self.is_cuda and nbytes < REGISTER_MIN_BYTES:
            return torch.empty(numel, dtype=dtype, pin_memory=True)
        tensor = torch.empty(numel, dtype=dtype)
        if pinned:
            self.pin(tensor)
        return tensor

    def pin(self, tensor: torch.Tensor) -> None:
        """Page-lock a large host tensor in place (cudaHostRegister) where there is a GPU; it is
        unpinned when the device closes."""
        if not self.is_cuda:
            return
        nbytes = tensor.numel() * tensor.element_size()
        err = torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed ({err}): the "
                               "host may be out of lockable memory (ulimit -l)")
        self._registered.append(tensor)

    # --- timing ----------------------------------------------------------------------------------
    def reset_clock(self) -> None:
        """Set time zero for task timestamps (host clock and, on a GPU, a base event)."""
        self.synchronize()
        self._base_host_s = time.perf_counter()
        if self.is_cuda:
            self._base_event = torch.cuda.Event(enable_timing=True)
            self._base_event.record(self._streams["gpu"])
            self._base_event.synchronize()

    def host_now_s(self) -> float:
        return time.perf_counter() - self._base_host_s

    def event_time_s(self, event: torch.cuda.Event) -> float:
        """Seconds from time zero to a completed timing event."""
        return self._base_event.elapsed_time(event) / 1e3

    def close(self) -> None:
        """Wait for queued work, unpin the host buffers pinned here, drop the streams."""
        self.synchronize()
        for tensor in self._registered:
            torch.cuda.cudart().cudaHostUnregister(tensor.data_ptr())
        self._registered.clear()
        self._streams.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
