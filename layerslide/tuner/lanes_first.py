"""Which plans run their CPU kernels niced. A GPU-bound plan waits on its launches, which queue
behind AdamW's workers for a core; niced workers let them through (H200: Qwen3-4B layer-major
-25% step time). A CPU-bound plan would only lose to the lanes' threads what they take (-3% to
+8%), so it keeps them at 0 (benchmarks/results/validation_2026-12-04c)."""

from __future__ import annotations

from layerslide.kinds import Lane
from layerslide.planner.settings import LANES_FIRST_NICE, Policy


def lanes_first(policy: Policy, bottleneck: str | None) -> Policy | None:
    """The policy with its CPU kernels' workers at LANES_FIRST_NICE where its prediction has the
    GPU lane for bottleneck (Prediction.bottleneck) and it leaves their niceness at 0; None
    where it stays as it is."""
    if bottleneck != Lane.GPU or policy.executor.cpu_nice != 0:
        return None
    return policy.with_(cpu_nice=LANES_FIRST_NICE)
