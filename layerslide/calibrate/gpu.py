"""GPU measurements: GEMM and attention efficiency at a model's shapes, HBM bandwidth, launch
cost and the host<->GPU copies. Efficiencies are fractions of the profile's bf16 peak."""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable

import torch
from torch.nn import functional

from layerslide.calibrate.host import GIB, Measurement, adamw_blocks, native_workers_nice
from layerslide.planner.model import ModelSpec
from layerslide.planner.settings import LANES_FIRST_NICE, ExecutorKnobs


def _cuda_ms(fn: Callable[[], object], repeats: int, batch: int = 10) -> float:
    """Median milliseconds of one fn call on the current stream, after a warm-up; each sample
    times `batch` calls back to back, so Python's launch time hides behind the GPU's work."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / batch)
    return sorted(times)[len(times) // 2]


def layer_gemm_shapes(model: ModelSpec) -> list[tuple[int, int]]:
    """(in, out) of a decoder layer's seven GEMMs: q, k, v, o, gate, up, down."""
    h, q, kv, f = model.hidden_size, model.q_dim, model.kv_dim, model.intermediate_size
    return [(h, q), (h, kv), (h, kv), (q, h), (h, f), (h, f), (f, h)]


def matmul_efficiency(model: ModelSpec, tokens: list[int], peak_flops: float,
                      repeats: int) -> Measurement:
    """FLOP-weighted efficiency of a layer's GEMMs, forward and both backward products."""
    dev = torch.device("cuda")
    points = []
    for t in tokens:
        flops, ms = 0.0, 0.0
        for k, n in layer_gemm_shapes(model):
            x = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            dy = torch.randn(t, n, device=dev, dtype=torch.bfloat16)
            for fn in (lambda x=x, w=w: x @ w.T, lambda dy=dy, w=w: dy @ w,
                       lambda dy=dy, x=x: dy.T @ x):
                ms += _cuda_ms(fn, repeats)
                flops += 2.0 * t * k * n
        points.append((t, round(flops / (ms / 1e3) / peak_flops, 3)))
    return Measurement(key="gpu.matmul_efficiency", value=tuple(points),
                       how=f"{model.name} layer GEMMs (7, forward + 2 backward each), bf16, "
                           f"median of {repeats}, FLOP-weighted, vs {peak_flops / 1e12:.0f} "
                           "TFLOP/s")


def attention_batches(tokens: list[int], seq_len: int) -> list[int]:
    """Micro-batches of whole sequences for the token counts asked; counts below one sequence
    are one sequence, measured once (the profile's tokens must strictly increase)."""
    return sorted({max(1, t // seq_len) for t in tokens})


def attention_efficiency(model: ModelSpec, seq_len: int, tokens: list[int], peak_flops: float,
                         repeats: int) -> list[Measurement]:
    """Causal SDPA forward, and forward + backward, at micro-batch tokens / seq_len."""
    dev = torch.device("cuda")
    a, g, d = model.num_attention_heads, model.num_key_value_heads, model.head_dim
    forward, both = [], []
    for b in attention_batches(tokens, seq_len):
        q = torch.randn(b, a, seq_len, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, g, seq_len, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, g, seq_len, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        grad_out = torch.randn(b, a, seq_len, d, device=dev, dtype=torch.bfloat16)
        flops = 4.0 * seq_len * a * d * b * seq_len  # non-causal count, as the cost model

        def run_forward(q=q, k=k, v=v) -> torch.Tensor:
            with torch.no_grad():
                return functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                               enable_gqa=g != a)

        def run_both(q=q, k=k, v=v, grad_out=grad_out) -> None:
            out = functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                          enable_gqa=g != a)
            torch.autograd.grad(out, (q, k, v), grad_out)

        forward.append((b * seq_len, round(flops / (_cuda_ms(run_forward, repeats) / 1e3)
                                           / peak_flops, 3)))
        both.append((b * seq_len, round(3 * flops / (_cuda_ms(run_both, repeats) / 1e3)
                                        / peak_flops, 3)))
    how = (f"SDPA causal, {a}/{g} heads x {d}, seq {seq_len}, median of {repeats}; FLOPs "
           "4*s*heads*head_dim per token forward")
    return [Measurement(key="gpu.attention_forward_efficiency", value=tuple(forward), how=how),
            Measurement(key="gpu.attention_backward_efficiency", value=tuple(both),
                        how=how + ", 3x for forward + backward")]


BUSY_FRACTIONS = (0.25, 0.5, 0.75, 0.9, 1.0)
LAUNCHES, LAUNCH_ROUNDS = 2000, 5  # ~0.2 s in all


def busy_speedup(model: ModelSpec, tokens: int, seconds: float,
                 repeats: int = 5) -> Measurement:
    """How much faster a layer's GEMMs run when the GPU idles between layers: the layer's 21
    GEMMs issued as one burst, with idle gaps that keep the GPU busy each BUSY_FRACTIONS of the
    time for `seconds`; the median burst after the clocks settled, as a speedup over the same
    GEMMs timed as matmul_efficiency times them (the tables' baseline, so a table point may be
    below 1). A power-capped GPU clocks down under continuous load (the H200 machine: 1.18x at
    50% busy over 100%), which the efficiency tables, measured back to back, do not see."""
    dev = torch.device("cuda")
    products = []
    for k, n in layer_gemm_shapes(model):
        x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(tokens, n, device=dev, dtype=torch.bfloat16)
        products += [lambda x=x, w=w: x @ w.T, lambda dy=dy, w=w: dy @ w,
                     lambda dy=dy, x=x: dy.T @ x]

    def burst_s() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for fn in products:
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    baseline_s = sum(_cuda_ms(fn, repeats) for fn in products) / 1e3
    burst_s()
    median_s = {}
    for busy in sorted(BUSY_FRACTIONS, reverse=True):  # from the hottest: each settles lower
        times, until = [], time.monotonic() + seconds
        while time.monotonic() < until:
            took = burst_s()
            times.append(took)
            time.sleep(took * (1.0 / busy - 1.0))
        steady = sorted(times[len(times) // 4:])  # after the clocks settled into this duty
        median_s[busy] = steady[len(steady) // 2]
    points = tuple((busy, round(baseline_s / median_s[busy], 3))
                   for busy in sorted(BUSY_FRACTIONS))
    return Measurement(key="gpu.busy_speedup", value=points,
                       how=f"{model.name} layer GEMMs at {tokens} tokens in bursts with idle gaps, "
                           f"{seconds:g} s per busy fraction, median burst vs the same GEMMs "
                           f"timed as for matmul_efficiency")


def device_basics(repeats: int) -> list[Measurement]:
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    src = torch.empty(GIB, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    hbm = 2 * GIB / (_cuda_ms(lambda: dst.copy_(src), repeats, batch=1) / 1e3)
    launch_s = median_launch_s(torch.zeros(1, device=dev), LAUNCHES, LAUNCH_ROUNDS)
    return [Measurement(key="gpu.name", value=props.name, how="torch.cuda device name"),
            Measurement(key="gpu.memory", value=props.total_memory, how="total device memory"),
            Measurement(key="gpu.hbm_bandwidth", value=hbm,
                        how=f"1 GiB device-to-device copy, bytes read + written, median of "
                            f"{repeats}"),
            Measurement(key="gpu.kernel_launch", value=launch_s,
                        how=f"tiny kernel launches from Python, median of {LAUNCH_ROUNDS} "
                            f"rounds of {LAUNCHES} after a warm-up round")]


def median_launch_s(tiny: torch.Tensor, launches: int, rounds: int) -> float:
    """Seconds per launch of a tiny kernel, the median round after a warm-up: a single cold
    round varied twofold between leases of one machine (the validation results' profiles), and
    a layer's dispatch floor is priced from it. (A CPU tensor times its op's dispatch.)"""
    sync = torch.cuda.synchronize if tiny.is_cuda else (lambda: None)
    per_round = []
    for round_ in range(rounds + 1):
        sync()
        start = time.perf_counter()
        for _ in range(launches):
            tiny.add_(1)
        sync()
        elapsed_s = time.perf_counter() - start
        if round_:  # the first warms the caches and the clocks
            per_round.append(elapsed_s / launches)
    return statistics.median(per_round)


LANE_POLLERS = 3  # the executor's other lanes that poll GPU events while the GPU lane launches


def launch_beside_kernels(tiny: torch.Tensor, block_params: int, *, nice: int = 0,
                          launches: int = LAUNCHES, rounds: int = LAUNCH_ROUNDS,
                          pollers: int | None = None) -> Measurement:
    """host.kernel_launch_beside_kernels (nice 0) or host.kernel_launch_beside_niced_kernels
    (nice LANES_FIRST_NICE): seconds per tiny launch as the executor's GPU lane launches beside
    its CPU lane. AdamW over a block of `block_params` runs on every core in a thread of its
    own, its workers at `nice`, and `pollers` threads take the GIL every engine.POLL_S to query
    an event (as the lanes waiting for GPU work do; none where the run's lanes are watched),
    under the run's GIL switch interval (ExecutorKnobs from the environment). In training on
    the H200 machine a layer's backward enqueued 1.4-1.5x slower beside AdamW than without it
    (benchmarks/results/archive/validation_2026-12-04b); an idle launch loop did not show it.
    Niceness is process-wide and is not lowered again: time the niced price last."""
    from layerslide.executor.engine import POLL_S

    keys = {0: "host.kernel_launch_beside_kernels",
            LANES_FIRST_NICE: "host.kernel_launch_beside_niced_kernels"}
    if nice not in keys:
        raise ValueError(f"nice={nice}: the profile has launch prices beside AdamW workers at "
                         f"{' and '.join(map(str, keys))} only")
    knobs = ExecutorKnobs.from_env()
    if pollers is None:
        pollers = 0 if knobs.lane_waits == "watch" else LANE_POLLERS
    steps, kernel = adamw_blocks(block_params, 2, nice=nice)
    workers_nice = native_workers_nice()
    if workers_nice != nice:
        raise RuntimeError(f"this process's AdamW workers run at nice {workers_nice}, not "
                           f"{nice} (niced earlier, and not lowered again): time the price at "
                           "nice 0 first, or in a new process")
    stop, began = threading.Event(), threading.Event()
    failed: list[BaseException] = []
    marker = torch.cuda.Event() if tiny.is_cuda else None
    if marker is not None:
        marker.record()

    def adamw_on_every_core() -> None:
        try:
            while not stop.is_set():
                for step in steps:
                    step()
                    began.set()
        except BaseException as exc:  # noqa: BLE001 (handed to the measuring thread)
            failed.append(exc)
            began.set()

    def poll() -> None:
        try:
            while not stop.wait(POLL_S):
                if marker is not None:
                    marker.query()
        except BaseException as exc:  # noqa: BLE001 (handed to the measuring thread)
            failed.append(exc)

    threads = [threading.Thread(target=adamw_on_every_core, daemon=True),
               *(threading.Thread(target=poll, daemon=True) for _ in range(pollers))]
    switch_s = sys.getswitchinterval()
    sys.setswitchinterval(knobs.lane_switch_interval_s)
    try:
        for t in threads:
            t.start()
        began.wait()  # set by the first AdamW step's end, or by its failure
        launch_s = median_launch_s(tiny, launches, rounds)
    finally:
        stop.set()
        for t in threads:
            t.join()
        sys.setswitchinterval(switch_s)
    if failed:  # timed beside nothing: not the figure asked for
        raise RuntimeError(f"the launches beside AdamW were not timed beside it: {failed[0]!r}")
    return Measurement(key=keys[nice], value=launch_s,
                       how=f"tiny kernel launches from Python, median of {rounds} rounds of "
                           f"{launches}, beside {kernel} looping over {block_params / 2**20:.0f} "
                           f"Mi params (its workers at nice {workers_nice}) and {pollers} threads "
                           f"polling an event every {POLL_S * 1e3:g} ms, GIL switch interval "
                           f"{knobs.lane_switch_interval_s * 1e3:g} ms")


class CopyEngines:
    """Both copy engines busy at once: pinned host buffers of nbytes streamed to the GPU on one
    stream and back on another, as a training step's loads and grad offloads run."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.up_host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.down_host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.up_gpu, self.down_gpu = (torch.empty(nbytes, dtype=torch.uint8, device="cuda")
                                      for _ in range(2))
        self.streams = torch.cuda.Stream(), torch.cuda.Stream()

    def start(self, copies: int, *, up: bool = True,
              down: bool = True) -> list[torch.cuda.Event]:
        """Enqueue `copies` copies each way asked for (host-to-GPU: up, back: down); the events
        mark when each of those directions is done."""
        done = []
        for stream, wanted, dst, src in ((self.streams[0], up, self.up_gpu, self.up_host),
                                         (self.streams[1], down, self.down_host, self.down_gpu)):
            if not wanted:
                continue
            with torch.cuda.stream(stream):
                for _ in range(copies):
                    dst.copy_(src, non_blocking=True)
            done.append(torch.cuda.Event())
            done[-1].record(stream)
        return done


SHARING_MODES = ("adamw", "h2d", "d2h", "adamw+h2d", "adamw+d2h", "adamw+both")


def host_sharing_rates(block_params: int, copy_bytes: int, *, seconds: float,
                       rounds: int) -> dict[str, dict[str, float]]:
    """How the CPU AdamW and each copy direction slow each other down: for each of
    SHARING_MODES, AdamW's host bytes/s (28 B/param, as calibrate's AdamW step runs it over 4
    blocks of block_params, back to back) and each direction's bytes/s, while pinned copies of
    copy_bytes stream for about `seconds`. The median of `rounds`, modes interleaved so a slow
    spell of the machine hits each alike. What calibrate.sharing fits the profile's host-memory
    sharing to (benchmarks/host_sharing_probe.py prints it)."""
    steps, _kernel = adamw_blocks(block_params, 4)
    for step in steps:  # first touch, the kernel's thread pool
        step()
    engines = CopyEngines(copy_bytes)
    solo = _sharing_run("h2d", steps, block_params, engines, 4)["h2d"]
    copies = max(4, int(seconds * solo / copy_bytes))
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in SHARING_MODES}
    for _ in range(rounds):
        for mode in SHARING_MODES:
            runs[mode].append(_sharing_run(mode, steps, block_params, engines, copies,
                                           seconds=seconds))
    return {mode: {k: statistics.median(r[k] for r in got) for k in got[0]}
            for mode, got in runs.items()}


def _sharing_run(mode: str, steps: list[Callable[[], None]], block_params: int,
                 engines: CopyEngines, copies: int, seconds: float = 1.0) -> dict[str, float]:
    up, down = ("h2d" in mode or "both" in mode), ("d2h" in mode or "both" in mode)
    wanted = [(name, stream) for name, stream, on in
              (("h2d", engines.streams[0], up), ("d2h", engines.streams[1], down)) if on]
    torch.cuda.synchronize()
    firsts = [torch.cuda.Event(enable_timing=True) for _ in wanted]
    for event, (_, stream) in zip(firsts, wanted, strict=True):
        event.record(stream)
    done = engines.start(copies, up=up, down=down) if wanted else []
    lasts = [torch.cuda.Event(enable_timing=True) for _ in wanted]
    for event, (_, stream) in zip(lasts, wanted, strict=True):
        event.record(stream)
    rates: dict[str, float] = {}
    if mode.startswith("adamw"):
        start = last_end = time.perf_counter()
        calls = finished = 0
        while True:
            steps[calls % len(steps)]()
            calls += 1
            now = time.perf_counter()
            if done and any(e.query() for e in done):
                break  # ended after a direction had: not beside the copies throughout
            finished, last_end = finished + 1, now
            if not done and now - start >= seconds:
                break
        if finished < 4:
            raise RuntimeError(f"{mode}: only {finished} AdamW calls ran beside the copies")
        rates["adamw"] = finished * block_params * 28 / (last_end - start)
    torch.cuda.synchronize()
    for (name, _), first, last in zip(wanted, firsts, lasts, strict=True):
        rates[name] = copies * engines.nbytes / (first.elapsed_time(last) / 1e3)
    return rates


def link(nbytes: int, repeats: int) -> list[Measurement]:
    """Pinned H2D and D2H alone and at once (total of both), and H2D from pageable memory."""
    dev = torch.device("cuda")
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pinned_back = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    on_gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    from_gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    h2d = nbytes / (_cuda_ms(lambda: on_gpu.copy_(pinned, non_blocking=True), repeats,
                             batch=1) / 1e3)
    d2h = nbytes / (_cuda_ms(lambda: pinned_back.copy_(from_gpu, non_blocking=True),
                             repeats, batch=1) / 1e3)
    pageable_rate = nbytes / (_cuda_ms(lambda: on_gpu.copy_(pageable), repeats, batch=1) / 1e3)
    up, down = torch.cuda.Stream(), torch.cuda.Stream()

    def both() -> None:
        with torch.cuda.stream(up):
            on_gpu.copy_(pinned, non_blocking=True)
        with torch.cuda.stream(down):
            pinned_back.copy_(from_gpu, non_blocking=True)
        torch.cuda.current_stream().wait_stream(up)
        torch.cuda.current_stream().wait_stream(down)

    duplex = 2 * nbytes / (_cuda_ms(both, repeats, batch=1) / 1e3)
    how = f"{nbytes / GIB:.2f} GiB copies, median of {repeats}"
    return [Measurement(key="link.h2d", value=h2d, how="pinned H2D, " + how),
            Measurement(key="link.d2h", value=d2h, how="pinned D2H, " + how),
            Measurement(key="link.duplex", value=duplex,
                        how="pinned H2D + D2H at once on two streams, total, " + how),
            Measurement(key="link.h2d_pageable", value=pageable_rate,
                        how="H2D from pageable memory, " + how)]
