"""What-if: one model across hardware profiles (on one GPU each, or on several GPUs and hosts),
or one profile across models and RAM/NVMe sizes.

Each row is the best configuration that tune finds in a small search space, or why nothing fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from layerslide.hwprofiles import HardwareProfile
from layerslide.planner import ModelSpec, sizes
from layerslide.trace import TIERS
from layerslide.tuner.processes import in_processes, same_host, tune_size
from layerslide.tuner.search import TuneResult, tune
from layerslide.tuner.space import SearchSpace

# Small enough to sweep many profiles or models in seconds, wide enough to find the regime.
# Accumulation 16, layer-major, is what lets the largest models run at speed (64k tokens a step
# at micro-batch 4).
WHATIF_SPACE = SearchSpace(windows=(2, 4), micro_batches=(1, 4, 16), grad_accums=(1, 16),
                           accumulations=("layer_major",), activations=("host", "gpu"),
                           casts=("cpu_once", "gpu"))


@dataclass(frozen=True, kw_only=True)
class WhatIfRow:
    """The outcome for one (model, profile) pair."""

    model: str
    params: int
    profile: str
    gpu_bytes: int
    ram_bytes: int
    nvme_bytes: int
    result: TuneResult
    gpus: int = 1  # ranks per host
    hosts: int = 1

    def row(self) -> dict:
        """The row's columns: its best configuration's tokens/s (every rank's), what bounds it,
        and each tier's peak (the GPU's per GPU, the host's and NVMe's per host)."""
        best = self.result.best
        base = {"model": self.model, "params": self.params, "profile": self.profile,
                "gpus": self.gpus, "hosts": self.hosts, "gpu_bytes": self.gpu_bytes,
                "ram_bytes": self.ram_bytes, "nvme_bytes": self.nvme_bytes,
                "feasible": best is not None}
        if best is None:
            # the closest miss: the candidate whose worst overflow is the smallest
            closest = min(self.result.candidates, key=_worst_ratio)
            return {**base, "reason": closest.prediction.reason, "tokens_per_s": None,
                    "step_s": None, "bottleneck": None, "bound": None, "mfu": None,
                    "config": "", **_peaks(closest.prediction)}
        r = best.row()
        accumulation = (f"x{r['grad_accum']} {r['accumulation'].replace('_major', '-major')}"
                        if r["grad_accum"] > 1 else "")
        parts = [f"mb={r['micro_batch']}{accumulation}", f"w={r['window']}",
                 f"act={r['activations']}",
                 f"cast={r['cast']}" + ("+worker" if r["cast_worker"] else "")]
        if r["host_grad_buffers"]:
            parts.append(f"grad_bufs={r['host_grad_buffers']}")
        if r["gpu_updated_blocks"]:
            parts.append(f"gpu_upd={r['gpu_updated_blocks']}"
                         + (" (layers first)" if r["gpu_updated_order"] == "layers_first" else ""))
        parts.append(f"nvme(m={r['moments_on_nvme']:g},p={r['master_on_nvme']:g}"
                     + (f",w={r['weights_on_nvme']:g}" if r["weights_on_nvme"] else "") + ")")
        if r["moment_precision"] != "fp32":
            parts.append(f"moments={r['moment_precision']}")
        config = " ".join(parts)
        return {**base, "reason": "", "tokens_per_s": r["tokens_per_s"], "step_s": r["step_s"],
                "bottleneck": r["bottleneck"], "bound": best.prediction.bound, "mfu": r["mfu"],
                "config": config, **_peaks(best.prediction)}


def _peaks(prediction) -> dict[str, int]:
    """Each tier's peak: the GPU's per GPU, the host's RAM and NVMe per host (all its ranks)."""
    per_host = prediction.peak_bytes_per_host
    return {f"peak_{tier}_bytes": (prediction.peak_bytes if tier == "gpu" else per_host).get(
        tier, 0) for tier in TIERS}


def _worst_ratio(candidate) -> float:
    return max((o.need_bytes / max(o.limit_bytes, 1) for o in candidate.prediction.overflows),
               default=0.0)


def _evaluate(model: ModelSpec, profile: HardwareProfile, gpus: int = 1, hosts: int = 1, *,
              seq_len: int, gpu_memory_bytes: int | None, space: SearchSpace,
              exhaustive: bool = False, tolerance: float = 0.0) -> WhatIfRow:
    result = tune(model, profile, seq_len=seq_len, space=space,
                  gpu_memory_bytes=gpu_memory_bytes, workers=1, exhaustive=exhaustive,
                  tolerance=tolerance, interruptible=False, with_plan=False, gpus=gpus,
                  hosts=hosts)
    gpu = profile.gpu.memory_bytes if gpu_memory_bytes is None else min(
        gpu_memory_bytes, profile.gpu.memory_bytes)
    return WhatIfRow(model=model.name, params=model.total_params, profile=profile.name,
                     gpu_bytes=gpu, ram_bytes=profile.host.ram_bytes,
                     nvme_bytes=profile.storage.total_capacity_bytes, result=result, gpus=gpus,
                     hosts=hosts)


def _size(item: tuple) -> tuple[float, float]:  # item: (model, profile, gpus, hosts)
    return tune_size(item[0], item[1])


def _alike(item: tuple) -> tuple:
    return (*same_host(item[0], item[1]), *item[2:])


def across_profiles(model: ModelSpec, profiles: Sequence[HardwareProfile],
                    **search) -> list[WhatIfRow]:
    """One model on one GPU of each profile (search: across_ranks' options)."""
    return across_ranks(model, [(profile, 1, 1) for profile in profiles], **search)


def rank_counts(profiles: Sequence[HardwareProfile], gpu_counts: Sequence[int],
                host_counts: Sequence[int]) -> tuple[list[tuple], list[str]]:
    """The (profile, gpus, hosts) each profile can hold, and why the others were left out."""
    held, skipped = [], []
    for profile in profiles:
        over = [g for g in gpu_counts if g > profile.host.gpus]
        if over:
            skipped.append(f"{profile.name} holds {profile.host.gpus} GPUs: "
                           f"{', '.join(map(str, over))} not tried")
        several_hosts = [h for h in host_counts if h > 1]
        if several_hosts and profile.network is None:
            skipped.append(f"{profile.name} has no [network] between hosts: "
                           f"{', '.join(map(str, several_hosts))} hosts not tried")
        held += [(profile, g, h) for h in host_counts for g in gpu_counts
                 if g <= profile.host.gpus and (h == 1 or profile.network is not None)]
    return held, skipped


def across_ranks(model: ModelSpec, placements: Sequence[tuple], *, seq_len: int = 1024,
                 gpu_memory_bytes: int | None = None, space: SearchSpace = WHATIF_SPACE,
                 progress: Callable[[int, int], None] | None = None,
                 workers: int | None = None, exhaustive: bool = False,
                 tolerance: float = 0.0) -> list[WhatIfRow]:
    """One model on each (profile, GPUs per host, hosts) of rank_counts: "one GPU or two?"
    (exhaustive, tolerance: as tune's)."""
    job = partial(_evaluate, seq_len=seq_len, gpu_memory_bytes=gpu_memory_bytes, space=space,
                  exhaustive=exhaustive, tolerance=tolerance)
    return in_processes(job, [(model, *placed) for placed in placements], workers=workers,
                        progress=progress, size=_size, alike=_alike)


def speedups(rows: Sequence[WhatIfRow]) -> list[float | None]:
    """Each row's tokens/s over its profile's one-GPU row's (None where either is missing)."""
    one = {r.profile: r.result.best.prediction.tokens_per_s for r in rows
           if r.gpus == 1 and r.hosts == 1 and r.result.best is not None}
    return [r.result.best.prediction.tokens_per_s / one[r.profile]
            if r.result.best is not None and r.profile in one else None for r in rows]


def across_models(profile: HardwareProfile, models: Sequence[ModelSpec], *,
                  ram_sizes: Sequence[int | None] = (None,),
                  nvme_sizes: Sequence[int | None] = (None,), seq_len: int = 1024,
                  gpu_memory_bytes: int | None = None, space: SearchSpace = WHATIF_SPACE,
                  progress: Callable[[int, int], None] | None = None,
                  workers: int | None = None, exhaustive: bool = False,
                  tolerance: float = 0.0) -> list[WhatIfRow]:
    """Each model on one profile, for each RAM and NVMe size (None: the profile's own)."""
    pairs = [(m, profile.with_overrides(ram_bytes=r, nvme_capacity_bytes=n))
             for r in ram_sizes for n in nvme_sizes for m in models]
    job = partial(_evaluate, seq_len=seq_len, gpu_memory_bytes=gpu_memory_bytes, space=space,
                  exhaustive=exhaustive, tolerance=tolerance)
    return in_processes(job, pairs, workers=workers, progress=progress, size=_size)


def largest_fitting(rows: Sequence[WhatIfRow]) -> WhatIfRow | None:
    """The row with the most parameters that has a feasible configuration."""
    fitting = [r for r in rows if r.result.best is not None]
    return max(fitting, key=lambda r: r.params) if fitting else None


# Per-parameter state in this plan family (the planner's ledger) with fp32 moments: master
# weights, moments and the bf16 copy that loads read, each of which may go to NVMe.
STATE_BYTES_PER_PARAM = sizes.HOST_STATE_BYTES_PER_PARAM


def capacity_bounds(profile: HardwareProfile,
                    moment_precision: str = "fp32") -> dict[str, float]:
    """Most parameters whose training state fits the host: all in RAM, or spread over RAM and
    NVMe. Counts state only (no activations, pinned buffers or GPU): an upper bound."""
    ram = profile.host.usable_ram_bytes - sizes.HOST_RUNTIME_BYTES
    nvme = profile.storage.total_capacity_bytes
    per_param = sizes.host_state_bytes_per_param(moment_precision)
    return {
        "all_in_ram_params": ram / per_param,
        "ram_and_nvme_params": (ram + nvme) / per_param,
    }
