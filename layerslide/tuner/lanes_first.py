"""Which plans run their CPU kernels niced. A GPU-bound plan waits on its launches, which queue
behind AdamW's workers for a core; niced workers let them through (H200: Qwen3-4B layer-major
-25% step time). A CPU-bound plan gains nothing sure from it (-3% to +8% step time), so it
keeps them at 0 (benchmarks/results/archive/validation_2026-12-04c). A plan given as a file, or a
niceness set in the environment, is run as given."""

from __future__ import annotations

from collections.abc import Callable

from layerslide.hwprofiles import HardwareProfile
from layerslide.kinds import Lane
from layerslide.planner.settings import LANES_FIRST_NICE, ExecutorKnobs, Policy
from layerslide.simulator import Prediction


def chosen_in_environment() -> bool:
    """LAYERSLIDE_CPU_NICE is set (to any value, 0 included): the niceness is the user's."""
    return "cpu_nice" in ExecutorKnobs.env_settings()


def priced_apart(profile: HardwareProfile) -> bool:
    """Whether the profile prices launches beside niced kernels apart from plain ones: a niced
    plan must then be simulated again (else it predicts as it did at nice 0)."""
    return profile.host.kernel_launch_beside_niced_kernels_s is not None


def lanes_first(policy: Policy, bottleneck: str | None) -> Policy | None:
    """The policy with its CPU kernels' workers at LANES_FIRST_NICE where its prediction has the
    GPU lane for bottleneck (Prediction.bottleneck) and it leaves their niceness at 0; None
    where it stays as it is."""
    if bottleneck != Lane.GPU or policy.executor.cpu_nice != 0:
        return None
    return policy.with_(cpu_nice=LANES_FIRST_NICE)


def niced_where_gpu_bound(policy: Policy, prediction: Prediction, profile: HardwareProfile,
                          predict: Callable[[Policy], Prediction | None],
                          ) -> tuple[Policy, Prediction] | None:
    """The policy niced where its prediction is GPU-bound (lanes_first), and its prediction:
    `predict` runs again only where the profile prices niced launches apart. None where the
    policy stays, or where the niced plan no longer fits (None from `predict`, or infeasible):
    its timing moved a peak past a limit, so it runs as it was."""
    niced = lanes_first(policy, prediction.bottleneck)
    if niced is None:
        return None
    if not priced_apart(profile):
        return niced, prediction
    again = predict(niced)
    if again is None or not again.feasible:
        return None
    return niced, again
