"""`layerslide calibrate`: measure this machine and write a hardware profile.

Host parts (memory bandwidth, the CPU AdamW, the cast, RAM and cores) and the disk are measured
everywhere; the GPU parts (GEMM and attention efficiency at a model's shapes, HBM bandwidth,
launch cost, host<->GPU copies, how AdamW and the copies share host memory) where CUDA is
present. Whatever is not measured (the GPU's bf16 peak, AdamW's bytes per parameter, without a
GPU the host-memory sharing) comes from a base profile, with the base's sources.
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from layerslide.calibrate import host
from layerslide.calibrate.host import GIB, Measurement
from layerslide.calibrate.sharing import fit_host_sharing
from layerslide.hwprofiles import HardwareProfile
from layerslide.hwprofiles.loader import INTEGER_ATTRS, PROFILE_FIELDS
from layerslide.planner.model import ModelSpec
from layerslide.planner.settings import LANES_FIRST_NICE

QUICK_TOKENS = [1024, 8192, 32768]
THOROUGH_TOKENS = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
# A layer's GEMMs at micro-batch 8 x 1024: bursts of a few ms to tens of ms, as a layer's
# forward and backward run in training.
BUSY_PROBE_TOKENS = 8192
# AdamW's large block, and its small one 1/SMALL_BLOCK_SHARE of it, span the decoder layers the
# profile prices (1B's 58 Mi params, 3B's 96 Mi, 8B's 208 Mi, Qwen3-14B's 315 Mi): the rate rose
# 2.5-7% from 64 to 256 Mi blocks on the H200 machine (adamw_blocks_2026-11-30), so a fit on
# 8 and 64 Mi priced 7-8B layers slow (validation_2026-12-03b)
ADAMW_BLOCK_PARAMS = 256 * 2**20
# the 4 blocks' state (14 B/param) takes at most a quarter of the RAM: 4 * 14 * 4 B per param
ADAMW_RAM_SHARE = 4 * 14 * 4
# AdamW's test, run this many times spread over the calibration; the profile keeps the median.
# One run of it moved 24% within a minute on the H200 machine (4.40, 5.13, 5.47 Gparam/s; ten
# runs back to back 3.91-5.01, ten 3 s apart 4.71-5.12: benchmarks/results/adamw_blocks_2026-
# 11-30, adamw_drift_2026-11-30), more than the step-time target the profile serves.
ADAMW_SAMPLES_THOROUGH = 5
ADAMW_SAMPLES_QUICK = 2
# seconds at least between the end of one run and the start of the next, where no other step
# lies between them (a thorough calibration without a GPU)
ADAMW_SPACING_S = 3.0


# AdamW's second block size, for the fixed time of a call: 1/SMALL_BLOCK_SHARE of the first
SMALL_BLOCK_SHARE = 8
ADAMW_ARRAYS = 4  # blocks an AdamW test steps in turn (host.adamw_throughput's arrays)
ADAMW_BYTES_PER_PARAM = 28  # the host bytes the sharing runs count per AdamW param


class AdamwSamples:
    """calibrate's AdamW rate taken at several points of the calibration, each at two block
    sizes, and from their medians the profile's two figures: a call's fixed time and the rate
    of the rest (a block of n params takes call + n / rate)."""

    def __init__(self, *, numel: int, repeats: int, wanted: int, spacing_s: float = 0.0):
        if wanted < 1:
            raise ValueError(f"wanted={wanted}: take at least one AdamW sample")
        self.numel, self.repeats, self.wanted = numel, repeats, wanted
        self.spacing_s = spacing_s
        self.taken: list[Measurement] = []  # at blocks of numel / ADAMW_ARRAYS
        self.taken_small: list[Measurement] = []  # SMALL_BLOCK_SHARE times smaller
        self._last_end_s: float | None = None

    def sample(self) -> list[Measurement]:
        if self._last_end_s is not None:  # back to back, runs of the test drifted more
            time.sleep(max(0.0, self._last_end_s + self.spacing_s - time.monotonic()))
        self.taken.append(host.adamw_throughput(self.numel, self.repeats, ADAMW_ARRAYS))
        self.taken_small.append(host.adamw_throughput(self.numel // SMALL_BLOCK_SHARE,
                                                      self.repeats, ADAMW_ARRAYS))
        self._last_end_s = time.monotonic()
        return []

    @property
    def block_params(self) -> tuple[int, int]:
        """The two block sizes, large then small."""
        large = max(self.numel // ADAMW_ARRAYS, 1)
        return large, max(large // SMALL_BLOCK_SHARE, 1)

    def call_s(self) -> float:
        """The fixed time of one call: where t = call + n / rate meets both sizes' medians."""
        if not self.taken:
            raise RuntimeError("no AdamW sample was taken")
        return adamw_call_s(self.block_params, (statistics.median(m.value for m in self.taken),
                                                statistics.median(m.value for m in
                                                                  self.taken_small)))

    def measurements(self) -> list[Measurement]:
        large, small = self.block_params
        call = self.call_s()
        rates = [m.value for m in self.taken]
        median = statistics.median(rates)
        spread = ", ".join(f"{rate / 1e9:.2f}" for rate in rates)
        small_rates = ", ".join(f"{m.value / 1e9:.2f}" for m in self.taken_small)
        return [
            Measurement(key="host.adamw_throughput", value=without_call(median, large, call),
                        how=f"{self.taken[0].how}; the median of {len(rates)} such runs spread "
                            f"over the calibration ({spread} Gparam/s), less "
                            f"{call * 1e3:.2f} ms a call"),
            Measurement(key="host.adamw_call_overhead", value=call,
                        how=f"fixed time of a call where t = call + n / rate meets the medians "
                            f"at {large / 2**20:.0f} Mi params a block (above) and at "
                            f"{small / 2**20:.0f} Mi ({small_rates} Gparam/s)")]


def adamw_call_s(block_params: tuple[int, int], rates: tuple[float, float]) -> float:
    """The fixed time of a call from two block sizes' params/s: 0 where the smaller ran as fast
    (noise), at most the smaller's whole time."""
    (large, small), (large_rate, small_rate) = block_params, rates
    if large <= small:  # blocks too small to tell apart (a test's): no fixed time measured
        return 0.0
    large_s, small_s = large / large_rate, small / small_rate
    call = (small_s * large - large_s * small) / (large - small)
    return min(max(call, 0.0), small_s)


def without_call(rate: float, block_params: int, call_s: float) -> float:
    """A rate measured on blocks of block_params with the fixed time of each call taken out."""
    block_s = block_params / rate
    return block_params / (block_s - call_s) if block_s > call_s else rate


def measure(*, quick: bool, model: ModelSpec, peak_flops: float,
            disk_dir: Path | list[Path] | None,
            gpu: bool, seq_len: int = 1024, ram_bytes: int | None = None,
            progress: Callable[[str], None] = lambda _step: None) -> list[Measurement]:
    """Every measurement this machine allows; `progress` hears of each before it runs."""
    numel = (64 if quick else 256) * 2**20
    repeats = 3 if quick else 10
    # AdamW over 4 blocks of ADAMW_BLOCK_PARAMS even when quick: blocks of 16 Mi ran 3.8-3.95
    # Gparam/s where 64 Mi ran 4.3-4.5 on the H200 machine (adamw_pages_2026-11-30), and a quick
    # profile put the 3B step 16-19% over the executor's (compare_2026-11-30f)
    ram = ram_bytes or host.physical_ram_bytes()
    adamw_numel = 4 * min(ADAMW_BLOCK_PARAMS, ram // ADAMW_RAM_SHARE)
    adamw = AdamwSamples(numel=adamw_numel, repeats=repeats,
                         wanted=ADAMW_SAMPLES_QUICK if quick else ADAMW_SAMPLES_THOROUGH,
                         spacing_s=0.0 if quick else ADAMW_SPACING_S)
    sharing: dict[str, dict[str, float]] = {}  # fitted once AdamW's call time is known
    steps: list[tuple[str, Callable[[], list[Measurement]]]] = [
        ("sizes", lambda: host.machine_sizes(ram_bytes)),
        ("host memory bandwidth", lambda: [host.memory_bandwidth(numel, repeats)]),
        ("CPU AdamW", adamw.sample),
        ("CPU AdamW with compact moments",
         lambda: host.compact_adamw_throughput(adamw_numel, repeats)),
        ("fp32->bf16 cast", lambda: [host.cast_throughput(numel, repeats)]),
    ]
    if disk_dir is not None:
        # not less than 1 GiB even when quick: on the H200 machine's disk a 0.25 GiB file read
        # 1.32 and wrote 1.42 GB/s where 1-4 GiB read 1.8-1.9 and wrote 2.0-2.3 (the tier's rate)
        steps.append(("disk", lambda: _disk(disk_dir, GIB if quick else 4 * GIB)))
    if gpu:
        from layerslide.calibrate import gpu as device

        tokens = QUICK_TOKENS if quick else THOROUGH_TOKENS
        steps += [
            ("GPU basics", lambda: device.device_basics(repeats)),
            ("GPU launches beside the CPU's AdamW", lambda: [device.launch_beside_kernels(
                torch.zeros(1, device="cuda"), adamw_numel // ADAMW_ARRAYS)]),
            ("GEMMs", lambda: [device.matmul_efficiency(model, tokens, peak_flops, repeats)]),
            ("attention", lambda: device.attention_efficiency(model, seq_len, tokens,
                                                               peak_flops, repeats)),
            ("GPU clocks by busy fraction", lambda: [device.busy_speedup(
                model, BUSY_PROBE_TOKENS, 0.8 if quick else 2.5)]),
            ("host<->GPU copies", lambda: device.link(GIB // (4 if quick else 1), repeats)),
            ("host memory shared by AdamW and the copies", lambda: _keep(sharing, (
                device.host_sharing_rates(adamw_numel // ADAMW_ARRAYS, GIB // 4,
                                          seconds=0.6 if quick else 1.5,
                                          rounds=1 if quick else 3)))),
        ]
    steps = _spread(steps, adamw)
    if gpu:  # last: the workers stay niced for the rest of the process
        steps.append(("GPU launches beside niced AdamW", lambda: _optional(
            "host.kernel_launch_beside_niced_kernels", lambda: [device.launch_beside_kernels(
                torch.zeros(1, device="cuda"), adamw_numel // ADAMW_ARRAYS,
                nice=LANES_FIRST_NICE)])))
    found: list[Measurement] = []
    for name, run in steps:
        progress(name)
        found += run()
    if sharing:
        found += fit_host_sharing(without_call_in_sharing(
            sharing, adamw_numel // ADAMW_ARRAYS, adamw.call_s()))
    return _shared_host_bandwidth([*found, *adamw.measurements()])


def _optional(field: str, run: Callable[[], list[Measurement]]) -> list[Measurement]:
    """An optional field's measurements, or none with a warning where they fail: the profile
    is whole without it (the simulator falls back on another figure)."""
    try:
        return run()
    except (RuntimeError, ValueError, OSError) as err:
        print(f"warning: {field} not measured ({err}); the profile leaves it out",
              file=sys.stderr)
        return []


def _keep(into: dict, rates: dict) -> list[Measurement]:
    into.update(rates)
    return []


def without_call_in_sharing(rates: dict[str, dict[str, float]], block_params: int,
                            call_s: float) -> dict[str, dict[str, float]]:
    """The sharing runs' AdamW bytes/s with each call's fixed time taken out: the capacity and
    the copies' costs are then those of the bytes part of a call, as the simulator costs it."""
    per_param = ADAMW_BYTES_PER_PARAM
    return {mode: {**run, **({"adamw": without_call(run["adamw"] / per_param, block_params,
                                                    call_s) * per_param}
                             if "adamw" in run else {})}
            for mode, run in rates.items()}


def _spread(steps: list[tuple[str, Callable[[], list[Measurement]]]],
            adamw: AdamwSamples) -> list[tuple[str, Callable[[], list[Measurement]]]]:
    """The steps with AdamW's further samples spread among those after its first, as evenly as
    their count allows (fewer later steps than samples: some come back to back, spaced by the
    sampler), the last at the end."""
    first = next(i for i, (_, run) in enumerate(steps) if run == adamw.sample)
    head, tail = steps[:first + 1], steps[first + 1:]
    more = adamw.wanted - 1
    if more <= 0:
        return steps
    spread: list[tuple[str, Callable[[], list[Measurement]]]] = []
    for k in range(more):
        # after a share of the later steps each, so the last sample comes last
        start, stop = len(tail) * k // more, len(tail) * (k + 1) // more
        spread += tail[start:stop]
        spread.append((f"CPU AdamW again ({k + 2} of {adamw.wanted})", adamw.sample))
    return head + spread


def _disk(folders: Path | list[Path], nbytes: int) -> list[Measurement]:
    """One drive's figures, measured in each folder in turn (one per drive, as the NVMe tier
    stripes its files over them): the slowest drive's rates and the least free space, since an
    even stripe waits for the slowest drive and fills the smallest first, and their count."""
    folders = [folders] if isinstance(folders, Path) else folders
    per_drive = []
    for folder in folders:
        try:
            per_drive.append(host.disk(folder, nbytes))
        except OSError as err:
            raise OSError(err.errno, f"measuring the disk in {folder}: {err}") from err
    if len(folders) == 1:
        return [*per_drive[0], Measurement(key="storage.drives", value=1,
                                           how="one folder given to calibrate --disk-dir")]
    combined = []
    for measured in zip(*per_drive, strict=True):
        slowest = min(measured, key=lambda m: m.value)
        each = ", ".join(f"{folder}: {m.value / 1e9:.3g}" for folder, m in
                         zip(folders, measured, strict=True))
        combined.append(Measurement(key=slowest.key, value=slowest.value,
                                    how=f"the least of {len(folders)} drives, measured one at "
                                        f"a time ({each}); {slowest.how}"))
    return [*combined, Measurement(key="storage.drives", value=len(folders),
                                   how="folders given to calibrate --disk-dir, one per drive")]


def _shared_host_bandwidth(found: list[Measurement]) -> list[Measurement]:
    """The profile's host.memory_bandwidth is the capacity AdamW, casts and both DMA directions
    share: with a GPU, the one fitted to AdamW beside the copies (calibrate.sharing); without,
    the largest of the CPU's own traffic (a copy, AdamW's 28 B/param, the cast's 1.5 B per
    fp32 byte read), which the others are then recorded beside."""
    by_key = {m.key: m for m in found}
    rates = {"fp32 copy/update": by_key["host.memory_bandwidth"].value,
             "AdamW x 28 B": by_key["host.adamw_throughput"].value * 28,
             "cast x 1.5": by_key["host.cast_throughput"].value * 1.5}
    alone = ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in rates.items())
    kept = [m for m in found
            if m.key not in ("shared_capacity_per_adamw", "host.memory_bandwidth")]
    if "shared_capacity_per_adamw" in by_key:
        # on one lease the sharing runs' AdamW alone moved 126.0 GB/s and the AdamW step's
        # 135.2, and training ran at the latter (validation_2026-11-30h): the fit's ratio holds
        fitted = by_key["shared_capacity_per_adamw"]
        return [*kept, Measurement(
            key="host.memory_bandwidth", value=fitted.value * rates["AdamW x 28 B"],
            how=f"{fitted.value:.3f} x AdamW x 28 B; {fitted.how}; the CPU alone: {alone}")]
    best = max(rates, key=rates.get)
    how = f"the largest of {alone} ({best}); {by_key['host.memory_bandwidth'].how}"
    return [*kept, Measurement(key="host.memory_bandwidth", value=rates[best], how=how)]


def merged_profile(base: HardwareProfile, found: list[Measurement], *, name: str,
                   quick: bool) -> HardwareProfile:
    """The base profile with every measured field replaced, each with its source."""
    parts = {"gpu": base.gpu, "link": base.link, "host": base.host, "storage": base.storage}
    sources = dict(base.sources)
    stamp = (f"measured {datetime.date.today().isoformat()} layerslide calibrate"
             f"{' --quick' if quick else ''}")
    for m in found:
        section, key = m.key.split(".")
        attr = PROFILE_FIELDS[section][1][key][0]
        value = round(m.value) if attr in INTEGER_ATTRS else m.value
        parts[section] = dataclasses.replace(parts[section], **{attr: value})
        sources[m.key] = f"{stamp}: {m.how}"
    return dataclasses.replace(
        base, name=name, path=None, sources=sources, **parts,
        description=f"{name}: measured by layerslide calibrate on {torch.__version__}; the "
                    f"fields not measured are {base.name}'s")
