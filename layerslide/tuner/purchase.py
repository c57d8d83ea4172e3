"""What to buy: every machine variant in given ranges (platforms, GPU cards, RAM sizes, NVMe
drive counts) tuned for one model, against a target throughput.

Each variant is a built-in (or file) platform profile with a card from hwprofiles/builtin/gpus
and its RAM and drive count overridden (hwprofiles.variants); tune finds its best plan in a
coarse search space. Rows say whether the variant reaches the target, what it costs where the
profiles have prices, the resource that bounds its step (the largest of the simulator's
per-step floors), and how far the next cheaper variant falls short.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from layerslide.hwprofiles import HardwareProfile, ProfileError, ProfileSpec, build_variant
from layerslide.planner import ModelSpec
from layerslide.tuner.processes import in_processes, same_host, tune_size
from layerslide.tuner.search import tune
from layerslide.tuner.space import SearchSpace
from layerslide.tuner.whatif import WHATIF_SPACE, WhatIfRow

# The buyer's platforms and cards shipped with layerslide (hwprofiles/builtin).
DEFAULT_PLATFORMS = ("desktop-ddr5", "desktop-ddr5-4dimm", "workstation-4ch", "workstation-8ch")
DEFAULT_CARDS = ("rtx4090", "rtx5090", "rtx-pro-6000")
DEFAULT_RAM_SIZES = tuple(n * 2**30 for n in (128, 256, 512))
DEFAULT_DRIVE_COUNTS = (1, 2, 4)
# Coarser than what-if's: a third of its candidates, so that dozens of variants of a 70B or
# 123B model tune in minutes. Layer-major accumulation x16 is what the large models run at;
# micro-batch 4 or 16, window 2, checkpoints on the host or the GPU.
PURCHASE_SPACE = replace(WHATIF_SPACE, windows=(2,), micro_batches=(4, 16), grad_accums=(1, 16))

# The simulator's per-step floors (simulator.predict.step_floors) by the resource a buyer
# changes to lift them.
RESOURCE_OF_FLOOR = {
    "lane:gpu": "GPU", "dispatch:gpu": "GPU launches (host CPU)",
    "lane:h2d": "PCIe", "lane:d2h": "PCIe", "pcie": "PCIe",
    "lane:cpu": "CPU AdamW", "lane:cpu_cast": "CPU casts",
    "host_memory": "host memory bandwidth",
    "nvme": "NVMe", "lane:nvme_read": "NVMe", "lane:nvme_write": "NVMe",
}


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One machine to price and tune: its platform, card, RAM and drives, as a profile."""

    platform: str
    card: str
    ram_bytes: int
    drives: int
    profile: HardwareProfile

    @property
    def spec(self) -> str:
        return self.profile.name


def variants(platforms: Sequence[str] = DEFAULT_PLATFORMS, cards: Sequence[str] = DEFAULT_CARDS,
             ram_sizes: Sequence[int] = DEFAULT_RAM_SIZES,
             drive_counts: Sequence[int] = DEFAULT_DRIVE_COUNTS,
             ) -> tuple[list[Variant], list[tuple[str, str]]]:
    """Every combination the platforms take, and (spec, why) for those they cannot (more RAM
    or drives than the platform's host.ram_max / storage.drives_max). An unknown platform or
    card raises ProfileError before anything is built."""
    if not (platforms and cards and ram_sizes and drive_counts):
        raise ValueError("give at least one platform, card, RAM size and drive count")
    for size in ram_sizes:
        if size <= 0:
            raise ValueError(f"RAM sizes must be more than 0 bytes, got {size}")
    for n in drive_counts:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"drive counts must be whole numbers >= 1, got {n!r}")
    out: list[Variant] = []
    skipped: list[tuple[str, str]] = []
    for platform in platforms:
        for card in cards:
            build_variant(ProfileSpec(base=platform, gpu=card))  # unknown names fail here
            for ram in ram_sizes:
                for drives in drive_counts:
                    spec = ProfileSpec(base=platform, gpu=card, ram_bytes=ram, drives=drives)
                    try:
                        profile = build_variant(spec)
                    except ProfileError as e:
                        skipped.append((spec.text(), str(e).split(": ", 2)[-1]))
                        continue
                    out.append(Variant(platform=platform, card=card, ram_bytes=ram,
                                       drives=drives, profile=profile))
    return out, skipped


def bound_of(prediction) -> tuple[str | None, float | None]:
    """The resource whose floor is the largest share of the step, and that share."""
    floors = prediction.floors_s or {}
    if not floors or not prediction.step_s:
        return None, None
    key = max(floors, key=floors.get)
    return RESOURCE_OF_FLOOR.get(key, key), floors[key] / prediction.step_s


def _tune_variant(model: ModelSpec, variant: Variant, seq_len: int,
                  space: SearchSpace, exhaustive: bool = False, tolerance: float = 0.0) -> dict:
    result = tune(model, variant.profile, seq_len=seq_len, space=space, workers=1,
                  exhaustive=exhaustive, tolerance=tolerance, interruptible=False, with_plan=False)
    profile = variant.profile
    row = WhatIfRow(model=model.name, params=model.total_params, profile=profile.name,
                    gpu_bytes=profile.gpu.memory_bytes, ram_bytes=profile.host.ram_bytes,
                    nvme_bytes=profile.storage.total_capacity_bytes, result=result).row()
    best = result.best
    bound, share = bound_of(best.prediction) if best else (None, None)
    prices = profile.prices
    return {
        "model": model.name, "profile": profile.name, "platform": variant.platform,
        "card": variant.card, "gpu": profile.gpu.name, "ram_bytes": profile.host.ram_bytes,
        "drives": profile.storage.drives, "cost": profile.cost(), "currency": prices.currency,
        "price_basis": ",".join(f"{k}:{v.basis}" for k, v in prices.given().items()),
        "feasible": row["feasible"], "tokens_per_s": row["tokens_per_s"],
        "step_s": row["step_s"], "mfu": row["mfu"], "bound": bound,
        "bound_share_of_step": share, "busiest_lane": row["bottleneck"],
        "config": row["config"], "reason": row["reason"],
        "peak_gpu_bytes": row.get("peak_gpu_bytes"), "peak_host_bytes": row.get("peak_host_bytes"),
        "peak_nvme_bytes": row.get("peak_nvme_bytes"),
    }


def purchase_search(model: ModelSpec, target_tokens_per_s: float, candidates: Sequence[Variant],
                    *, seq_len: int = 1024, space: SearchSpace = PURCHASE_SPACE,
                    workers: int | None = None,
                    progress: Callable[[int, int], None] | None = None,
                    exhaustive: bool = False, tolerance: float = 0.0) -> list[dict]:
    """Tune the model on every variant; rows that reach the target first, cheapest first (by
    tokens/s where a price is missing), then those that fall short, fastest first. Each row
    says how far the next cheaper variant falls short of the target. Ctrl-C raises
    processes.Interrupted with the rows done (unranked; None for the rest)."""
    if not target_tokens_per_s > 0:
        raise ValueError(f"the target must be more than 0 tokens/s, got {target_tokens_per_s}")
    if not candidates:
        raise ValueError("no variant to try: every combination was refused by its platform")
    rows = in_processes(_tune_variant,
                        [(model, v, seq_len, space, exhaustive, tolerance) for v in candidates],
                        workers=workers, progress=progress, size=_size, alike=_alike)
    return rank(rows, target_tokens_per_s)


def _size(item: tuple) -> tuple[float, float]:  # item: (model, variant, ...)
    return tune_size(item[0], item[1].profile)


def _alike(item: tuple) -> tuple:
    return same_host(item[0], item[1].profile)


def rank(rows: Sequence[dict], target: float) -> list[dict]:
    """Mark each row against the target, add tokens/s per 1,000 of cost and the next cheaper
    variant's shortfall, and order them (see purchase_search)."""
    out = []
    for r in rows:
        tps = r["tokens_per_s"] or 0.0
        cost = r["cost"]
        out.append({**r, "target_tokens_per_s": target, "meets_target": tps >= target,
                    "tokens_per_s_per_1k_cost": (tps / (cost / 1000) if cost else None)})
    priced = sorted((r for r in out if r["cost"] is not None),
                    key=lambda r: (r["cost"], -(r["tokens_per_s"] or 0.0)))
    for r in out:
        cheaper = [c for c in priced if r["cost"] is not None and c["cost"] < r["cost"]]
        nxt = cheaper[-1] if cheaper else None
        r["next_cheaper"] = nxt["profile"] if nxt else None
        r["next_cheaper_cost"] = nxt["cost"] if nxt else None
        r["next_cheaper_tokens_per_s"] = nxt["tokens_per_s"] if nxt else None
        r["next_cheaper_short_of_target"] = (
            max(0.0, 1 - (nxt["tokens_per_s"] or 0.0) / target) if nxt else None)

    def order(r: dict) -> tuple:
        tps = r["tokens_per_s"] or 0.0
        if r["meets_target"]:
            return (0, r["cost"] if r["cost"] is not None else float("inf"), -tps)
        return (1, -tps, r["cost"] if r["cost"] is not None else float("inf"))

    return sorted(out, key=order)


def summary(rows: Sequence[dict], target: float) -> list[str]:
    """Plain sentences: the cheapest variant that reaches the target and what the next cheaper
    one reaches, or the fastest and how far it falls short."""
    meeting = [r for r in rows if r["meets_target"]]
    lines = []
    if meeting:
        best = meeting[0]
        cost = (f"{best['cost']:,.0f} {best['currency']}" if best["cost"] is not None
                else "no price")
        lines.append(f"cheapest that reaches {target:g} tokens/s: {best['profile']} at {cost}, "
                     f"{best['tokens_per_s']:.0f} tokens/s, bound by {best['bound']}")
        if best["next_cheaper"]:
            lines.append(f"  the next cheaper, {best['next_cheaper']} at "
                         f"{best['next_cheaper_cost']:,.0f}, reaches "
                         f"{best['next_cheaper_tokens_per_s'] or 0:.0f} tokens/s "
                         f"({best['next_cheaper_short_of_target']:.0%} short)")
        per_cost = [r for r in meeting if r["tokens_per_s_per_1k_cost"]]
        if per_cost:
            top = max(per_cost, key=lambda r: r["tokens_per_s_per_1k_cost"])
            lines.append(f"most tokens/s per 1,000 {top['currency']} among those: "
                         f"{top['profile']} ({top['tokens_per_s_per_1k_cost']:.1f})")
    else:
        fit = [r for r in rows if r["feasible"]]
        if fit:
            fastest = max(fit, key=lambda r: r["tokens_per_s"])
            lines.append(f"none reaches {target:g} tokens/s: the fastest, {fastest['profile']}, "
                         f"reaches {fastest['tokens_per_s']:.0f} "
                         f"({1 - fastest['tokens_per_s'] / target:.0%} short), bound by "
                         f"{fastest['bound']}")
        else:
            lines.append(f"none reaches {target:g} tokens/s: the model fits on none of them")
    return lines
