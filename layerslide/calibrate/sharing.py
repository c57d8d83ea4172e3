"""The profile's host-memory sharing, fitted to what AdamW and each copy direction did beside each
other (calibrate.gpu.host_sharing_rates). Pure arithmetic: runs and is tested without a GPU.

The simulator's model (HostSpec): a capacity C of host memory; the CPU's AdamW takes its own
bytes of it, a copied byte dma_read_cost (H2D: the DMA reads host memory) or dma_write_cost
(D2H); an oversubscribed C is split by weight, the CPU's 1.0 against each direction's. With
a_m, u_m, d_m the bytes/s AdamW, H2D and D2H moved in run m, every run where they contend has
C = a_m + k_up u_m + k_down d_m: three runs (beside H2D, beside D2H, beside both) give C and
the two costs. A direction's weight is its share of its solo rate over AdamW's in the run
beside it alone (the water-filling split; a copy that kept its full rate then gets just the
weight that makes it so).
"""

from __future__ import annotations

import numpy as np

from layerslide.calibrate.host import Measurement

CONTENDED = ("adamw+h2d", "adamw+d2h", "adamw+both")
UNSLOWED = 0.98  # AdamW at this share of its solo rate or more: the copy did not contend
WEIGHT_RANGE = (0.05, 20.0)


def fit_host_sharing(rates: dict[str, dict[str, float]]) -> list[Measurement]:
    """The capacity C over AdamW's own rate alone in these runs (key "shared_capacity_per_adamw":
    calibrate multiplies it by the profile's AdamW x 28 B for host.memory_bandwidth, a ratio
    measured side by side being steadier than two absolute rates from two tests), and
    host.dma_read_cost, dma_write_cost, dma_share and dma_write_share, from the bytes/s of each
    mode of calibrate.gpu.SHARING_MODES."""
    for mode in ("adamw", "h2d", "d2h", *CONTENDED):
        if mode not in rates:
            raise ValueError(f"host-sharing rates lack the {mode!r} run")
    alone = rates["adamw"]["adamw"]
    rows = np.array([[1.0, -rates[m].get("h2d", 0.0), -rates[m].get("d2h", 0.0)]
                     for m in CONTENDED])
    moved = np.array([rates[m]["adamw"] for m in CONTENDED])
    capacity, cost_up, cost_down = np.linalg.lstsq(rows, moved, rcond=None)[0]
    if min(cost_up, cost_down) < 0:  # noise: a direction that costs nothing, the rest refitted
        keep = [0, 1 if cost_up >= 0 else 2]
        capacity, kept = np.linalg.lstsq(rows[:, keep], moved, rcond=None)[0]
        cost_up, cost_down = (max(kept, 0.0), 0.0) if keep[1] == 1 else (0.0, max(kept, 0.0))
    capacity = max(float(capacity), alone)  # AdamW alone moved this much: C is not less
    share_up = _weight(rates, "h2d", alone)
    share_down = _weight(rates, "d2h", alone)
    runs = "; ".join(
        f"{m}: AdamW {rates[m]['adamw'] / 1e9:.1f}"
        + "".join(f", {d.upper()} {rates[m][d] / 1e9:.1f}" for d in ("h2d", "d2h") if d in rates[m])
        for m in CONTENDED)
    how = (f"AdamW (28 B/param) alone {alone / 1e9:.1f} GB/s, H2D alone "
           f"{rates['h2d']['h2d'] / 1e9:.1f}, D2H alone {rates['d2h']['d2h'] / 1e9:.1f}; "
           f"beside each other: {runs} GB/s; fitted C = AdamW + cost x copies")
    return [Measurement(key="shared_capacity_per_adamw", value=capacity / alone, how=how),
            Measurement(key="host.dma_read_cost", value=float(cost_up), how=how),
            Measurement(key="host.dma_write_cost", value=float(cost_down), how=how),
            Measurement(key="host.dma_share", value=share_up,
                        how="H2D's share of its solo rate over AdamW's, beside each other"),
            Measurement(key="host.dma_write_share", value=share_down,
                        how="D2H's share of its solo rate over AdamW's, beside each other")]


def _weight(rates: dict[str, dict[str, float]], direction: str, alone: float) -> float:
    beside = rates[f"adamw+{direction}"]
    adamw_kept = beside["adamw"] / alone
    if adamw_kept >= UNSLOWED:
        return 1.0  # no contention: the split never comes into play
    copy_kept = min(beside[direction] / rates[direction][direction], 1.0)
    low, high = WEIGHT_RANGE
    return min(max(copy_kept / adamw_kept, low), high)
