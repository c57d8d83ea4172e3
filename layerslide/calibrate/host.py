"""Host measurements: memory bandwidth, the CPU AdamW and the fp32->bf16 cast, and the disk as
the NVMe tier uses it. Each returns a Measurement in the profile's SI units."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from layerslide.executor.moments import Moments
from layerslide.executor.native import NativeKernels, load_kernels
from layerslide.executor.nvme import aligned_buffer, supports_direct
from layerslide.executor.stripes import CHUNK_BYTES
from layerslide.planner.settings import ExecutorKnobs

GIB = 2**30


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """One profile field: its dotted key, the SI value and where it came from."""

    key: str  # e.g. "host.adamw_throughput"
    # SI number, name, or table: (tokens, efficiency) or (busy fraction, speedup) points
    value: float | str | tuple[tuple[float, float], ...]
    how: str  # what was run, for the profile's source string


def best_rate(fn: Callable[[], None], units: float, repeats: int) -> float:
    """units per second of fn's fastest run after a warm-up (the least disturbed one)."""
    fn()
    fastest = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        fastest = min(fastest, time.perf_counter() - start)
    return units / fastest


def memory_bandwidth(numel: int, repeats: int) -> Measurement:
    """Bytes/s of the better of a copy (r + w) and an in-place update (r 2, w 1)."""
    a, b = torch.ones(numel), torch.ones(numel)
    nbytes = 4 * numel
    rate = max(best_rate(lambda: a.copy_(b), 2 * nbytes, repeats),
               best_rate(lambda: a.add_(b, alpha=0.5), 3 * nbytes, repeats))
    return Measurement(key="host.memory_bandwidth", value=rate,
                       how=f"fp32 copy / in-place add over {nbytes / GIB:.2f} GiB arrays, "
                           f"{torch.get_num_threads()} threads, best of {repeats}")


def sustained_rate(fn: Callable[[int], None], count: int, units: float, passes: int) -> float:
    """units per second of `passes` rounds of fn(0..count-1) back to back after a warm-up round:
    the rate a stream of such calls keeps up, not the fastest single one."""
    for i in range(count):
        fn(i)
    start = time.perf_counter()
    for _ in range(passes):
        for i in range(count):
            fn(i)
    return passes * units / (time.perf_counter() - start)


PATTERN_NUMEL = 2**20  # the random values a test array repeats


def repeated_randn(numel: int, scale: float = 1.0,
                       dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """numel values that repeat one random pattern: an elementwise kernel's time does not
    depend on them, and torch.randn over every value took most of a calibration's AdamW tests
    (116 s against 43 for the whole calibration on a 2-core machine:
    benchmarks/results/archive/calibrate_fill_2026-12-03)."""
    pattern = (torch.randn(min(numel, PATTERN_NUMEL)) * scale).to(dtype)
    return pattern.repeat(-(-numel // pattern.numel()))[:numel]


def executor_adamw_block(native: NativeKernels, numel: int,
                         moment_precision: str = "fp32") -> Callable[[], None]:
    """One block's AdamW step as the executor runs it (28 B/param with fp32 moments): the grads
    landed in the bf16 upload copy and the new weights overwrite them there."""
    param, moments = repeated_randn(numel), Moments.zeros(moment_precision, numel)
    landed = repeated_randn(numel, 1e-3, torch.bfloat16)

    def step() -> None:
        native.adamw_step_moments(param=param, moments=moments, grad=landed, weights_out=landed,
                                  decay_end=numel, lr=1e-5, beta1=0.9, beta2=0.95, eps=1e-8,
                                  weight_decay=0.0, grad_scale=1.0, step=1)
    return step


def adamw_blocks(size: int, arrays: int, *,
                 nice: int = 0) -> tuple[list[Callable[[], None]], str]:
    """`arrays` AdamW steps over block-sized arrays of their own, as the executor runs AdamW,
    and a description of the kernel: layerslide's native kernel reading bf16 grads and writing
    the bf16 weights over them (its workers at `nice`), else (no compiler) torch's fused CPU
    AdamW with fp32 grads."""
    native = load_kernels(**_kernel_knobs(nice))
    if native is not None:
        return [executor_adamw_block(native, size) for _ in range(arrays)], _describe(native)
    optimizers = []
    for _ in range(arrays):
        p = torch.nn.Parameter(repeated_randn(size))
        p.grad = repeated_randn(size, 1e-3)
        optimizers.append(torch.optim.AdamW([p], lr=1e-5, fused=True))
    kernel = f"torch's fused CPU AdamW, fp32 grads, {torch.get_num_threads()} threads"
    return [opt.step for opt in optimizers], kernel


def native_workers_nice() -> int:
    """The niceness this process's native AdamW workers run at: set once, it stays (0 without
    the native kernels, whose fallback's threads are never niced)."""
    native = load_kernels()
    return native.worker_nice if native is not None else 0


def _describe(native: NativeKernels) -> str:
    return (f"layerslide's native AdamW (bf16 grads in, bf16 weights out in their place, "
            f"{native.threads or torch.get_num_threads()} threads, chunks of "
            f"{native.chunk or 'one even slice'})")


def adamw_throughput(numel: int, repeats: int, arrays: int = 4) -> Measurement:
    """Params/s of AdamW as the executor runs it (28 B/param, the profile's definition; see
    adamw_blocks), called on `arrays` block-sized arrays in turn, over a working set far past
    the caches; the mean rate, since a step is many such calls back to back.

    On the H200 machine the best single call over one array ran 15% faster than the
    executor's own AdamW tasks, and this sustained rate within 5% of them
    (benchmarks/results/archive/cpu_split_2026-11-30)."""
    size = max(numel // arrays, 1)
    passes = max(repeats // 3, 2)
    steps, kernel = adamw_blocks(size, arrays)
    rate = sustained_rate(lambda i: steps[i](), arrays, arrays * size, passes)
    return Measurement(key="host.adamw_throughput", value=rate,
                       how=f"{kernel}, {arrays} arrays of {size / 2**20:.0f} Mi params in "
                           f"turn, mean of {passes} passes")


def compact_adamw_throughput(numel: int, repeats: int, arrays: int = 4) -> list[Measurement]:
    """As adamw_throughput, with bf16 and with 8-bit moments (none without native kernels,
    which alone run them)."""
    native = load_kernels(**_kernel_knobs())
    if native is None:
        return []
    size = max(numel // arrays, 1)
    passes = max(repeats // 3, 2)
    found = []
    for precision in ("bf16", "int8"):
        steps = [executor_adamw_block(native, size, precision) for _ in range(arrays)]
        rate = sustained_rate(lambda i, steps=steps: steps[i](), arrays, arrays * size, passes)
        found.append(Measurement(
            key=f"host.adamw_{precision}_throughput", value=rate,
            how=f"{_describe(native)} with {precision} moments, {arrays} arrays of "
                f"{size / 2**20:.0f} Mi params in turn, mean of {passes} passes"))
        del steps  # free one precision's arrays before the next
    return found


def cast_throughput(numel: int, repeats: int) -> Measurement:
    """fp32 bytes read per second by the fp32->bf16 cast (the one the executor runs)."""
    src, dst = repeated_randn(numel), torch.empty(numel, dtype=torch.bfloat16)
    native = load_kernels(**_kernel_knobs())
    if native is not None:
        cast, kernel = (lambda: native.cast(src, dst)), "layerslide's native cast"
    else:
        cast, kernel = (lambda: dst.copy_(src)), "torch copy_"
    rate = best_rate(cast, 4 * numel, repeats)
    return Measurement(key="host.cast_throughput", value=rate,
                       how=f"{kernel}, {numel / 2**20:.0f} Mi params, "
                           f"{torch.get_num_threads()} threads, best of {repeats}")


def physical_ram_bytes() -> int:
    """This machine's RAM: its physical pages times the page size."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def machine_sizes(ram_bytes: int | None = None) -> list[Measurement]:
    """Cores, and RAM: as given (a machine whose RAM grows as used reports less), else the
    physical pages."""
    if ram_bytes is None:
        ram = Measurement(key="host.ram", value=physical_ram_bytes(),
                          how="physical pages x page size")
    else:
        ram = Measurement(key="host.ram", value=ram_bytes, how="given (--ram)")
    return [Measurement(key="host.cores", value=os.cpu_count() or 1, how="os.cpu_count()"), ram]


def disk(folder: Path, nbytes: int) -> list[Measurement]:
    """Write then read one file of nbytes as the NVMe tier does (O_DIRECT where the filesystem
    takes it, 64 MiB calls, page-aligned buffers), then write a second file while reading the
    first (the tier's writes and read-aheads overlap), then write the first again, and the free
    space there. The write rate kept is the first: on the H200 machine the second pass ran
    1.27 GB/s against 1.80, and the NVMe row of the validation came out +12% on the second and
    +0.7% on the first (benchmarks/results/archive/validation_2026-11-30i); the second stays in the
    source, a sign of how the disk holds up under sustained writes."""
    folder.mkdir(parents=True, exist_ok=True)
    path, other = folder / ".layerslide-calibrate.bin", folder / ".layerslide-calibrate-2.bin"
    direct = os.O_DIRECT if supports_direct(folder) else 0
    buffers = [memoryview(aligned_buffer(CHUNK_BYTES).numpy()) for _ in range(2)]
    nbytes = max(CHUNK_BYTES, nbytes // CHUNK_BYTES * CHUNK_BYTES)
    try:
        write = _timed_rate(lambda: _write_file(path, nbytes, direct, buffers[0]), nbytes)
        read = _timed_rate(lambda: _read_file(path, nbytes, direct, buffers[0]), nbytes)
        duplex, read_share = _both_at_once(path, other, nbytes, direct, buffers)
        again = _timed_rate(lambda: _write_file(path, nbytes, direct, buffers[0]), nbytes)
    finally:
        path.unlink(missing_ok=True)
        other.unlink(missing_ok=True)
    how = (f"{'O_DIRECT' if direct else 'buffered'} 64 MiB calls, {nbytes / GIB:.2f} GiB "
           f"file in {folder}")
    free = shutil.disk_usage(folder).free
    return [Measurement(key="storage.write", value=write,
                        how=how + f", then fsync (written again after the tests of reads: "
                                  f"{again / 1e9:.2f} GB/s)"),
            Measurement(key="storage.read", value=read, how=how),
            Measurement(key="storage.duplex", value=duplex,
                        how=how + ": one written while another is read, bytes of both "
                                  "until the first is done"),
            Measurement(key="storage.duplex_read_share", value=read_share,
                        how=how + ": the read's part of the bytes moved while both ran"),
            Measurement(key="storage.capacity", value=free, how=f"free space in {folder}")]


def _timed_rate(work: Callable[[], object], nbytes: int) -> float:
    start = time.perf_counter()
    work()
    return nbytes / (time.perf_counter() - start)


def _both_at_once(path: Path, other: Path, nbytes: int, direct: int,
                  buffers: list[memoryview]) -> tuple[float, float]:
    """Bytes/s of reading `path` and writing `other` at once, counted until the first of the
    two is done (the simulator's duplex holds only while both run), and the read's part of
    those bytes. Exact with O_DIRECT; buffered, the writer's bytes are those handed to the page
    cache by then."""
    stop = threading.Event()
    moved = [0, 0]
    finished_s: list[float] = []
    lock = threading.Lock()

    def run(index: int, work: Callable[..., int]) -> None:
        moved[index] = work(stop=stop)
        with lock:
            if not finished_s:
                finished_s.append(time.perf_counter())
                stop.set()

    start = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:  # the calls release the GIL
        jobs = [pool.submit(run, 0, lambda stop: _write_file(other, nbytes, direct,
                                                             buffers[0], stop=stop)),
                pool.submit(run, 1, lambda stop: _read_file(path, nbytes, direct,
                                                            buffers[1], stop=stop))]
        for job in jobs:
            job.result()
    total = sum(moved)
    # one side may finish before the other moved a chunk: keep the share inside (0, 1)
    share = min(max(moved[1] / total, 0.01), 0.99) if total else 0.5
    return total / (finished_s[0] - start), share


def _write_file(path: Path, nbytes: int, direct: int, buf: memoryview,
                stop: threading.Event | None = None) -> int:
    """Bytes written (all of nbytes unless `stop` came first), then fsync'ed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | direct, 0o644)
    written = 0
    try:
        for offset in range(0, nbytes, CHUNK_BYTES):
            if stop is not None and stop.is_set():
                break
            os.pwritev(fd, [buf], offset)
            written += CHUNK_BYTES
        os.fsync(fd)
        if not direct:  # a later read comes from the disk, not from the page cache
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return written


def _read_file(path: Path, nbytes: int, direct: int, buf: memoryview,
               stop: threading.Event | None = None) -> int:
    """Bytes read from the disk (all of nbytes unless `stop` came first)."""
    fd = os.open(path, os.O_RDONLY | direct)
    done = 0
    try:
        if not direct:  # an earlier read of this file left it in the page cache
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        for offset in range(0, nbytes, CHUNK_BYTES):
            if stop is not None and stop.is_set():
                break
            os.preadv(fd, [buf], offset)
            done += CHUNK_BYTES
    finally:
        os.close(fd)
    return done


def _kernel_knobs(nice: int = 0) -> dict:
    """The native kernels' spread over the cores as the environment sets it (ExecutorKnobs),
    their workers at `nice`, not the environment's: niceness is process-wide and cannot be
    lowered again unprivileged, so calibrate measures at 0 and nices only its last step."""
    knobs = ExecutorKnobs.from_env()
    return {"threads": knobs.cpu_threads, "chunk": knobs.cpu_chunk_elements, "nice": nice}
