"""`layerslide calibrate`: measure this machine and write a hardware profile.

Host parts (memory bandwidth, the CPU AdamW, the cast, RAM and cores) and the disk are measured
everywhere; the GPU parts (GEMM and attention efficiency at a model's shapes, HBM bandwidth,
launch cost, host<->GPU copies) where CUDA is present. Whatever is not measured (the GPU's bf16
peak, the share of host bandwidth the DMA takes, AdamW's bytes per parameter) comes from a base
profile, with the base's sources.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from pathlib import Path

import torch

from layerslide.calibrate import host
from layerslide.calibrate.host import GIB, Measurement
from layerslide.hwprofiles import HardwareProfile
from layerslide.hwprofiles.loader import INTEGER_ATTRS, PROFILE_FIELDS
from layerslide.planner.model import ModelSpec

QUICK_TOKENS = [1024, 8192, 32768]
THOROUGH_TOKENS = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]


def measure(*, quick: bool, model: ModelSpec, peak_flops: float, disk_dir: Path | None,
            gpu: bool, seq_len: int = 1024,
            progress: Callable[[str], None] = lambda _step: None) -> list[Measurement]:
    """Every measurement this machine allows; `progress` hears of each before it runs."""
    numel = (64 if quick else 256) * 2**20
    repeats = 3 if quick else 10
    steps: list[tuple[str, Callable[[], list[Measurement]]]] = [
        ("sizes", host.machine_sizes),
        ("host memory bandwidth", lambda: [host.memory_bandwidth(numel, repeats)]),
        ("CPU AdamW", lambda: [host.adamw_throughput(numel, repeats)]),
        ("fp32->bf16 cast", lambda: [host.cast_throughput(numel, repeats)]),
    ]
    if disk_dir is not None:
        steps.append(("disk", lambda: host.disk(disk_dir, (GIB // 4) if quick else 4 * GIB)))
    if gpu:
        from layerslide.calibrate import gpu as device

        tokens = QUICK_TOKENS if quick else THOROUGH_TOKENS
        steps += [
            ("GPU basics", lambda: device.device_basics(repeats)),
            ("GEMMs", lambda: [device.matmul_efficiency(model, tokens, peak_flops, repeats)]),
            ("attention", lambda: device.attention_efficiency(model, seq_len, tokens,
                                                               peak_flops, repeats)),
            ("host<->GPU copies", lambda: device.link(GIB // (4 if quick else 1), repeats)),
        ]
    found: list[Measurement] = []
    for name, run in steps:
        progress(name)
        found += run()
    return found


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
