"""What the commands refuse rather than drop or clamp, and what they say to change: an option
that would change nothing (a flag a --plan replaces, a policy flag the rest of the plan leaves
idle, a cap above the card), and what a plan that overflows a tier could change."""

from __future__ import annotations

import argparse
import sys

from layerslide.cli.options import GIB, UsageError, given_as, plan_settings
from layerslide.hwprofiles import HardwareProfile
from layerslide.planner import Policy, TrainSpec

# what to change when a tier's need exceeds its limit, by tier (simulate and train say it)
FIT_HINTS = {
    "gpu": "lower --micro-batch or --window, keep activations off the GPU (--activations host), "
           "or let `layerslide tune` pick settings that fit",
    "host": "keep part of the state on NVMe (--moments-on-nvme/--master-on-nvme, fractions 0-1; "
            "train needs --nvme-dir), checkpoints too (--activations nvme), or let "
            "`layerslide tune` place it",
    "nvme": "keep less on NVMe (lower the --*-on-nvme fractions), stripe over more drives "
            "(--nvme-drives), or take a profile with a larger drive",
}


def refuse_flags_a_plan_replaces(args, parser: argparse.ArgumentParser, plan, *,
                                 also: dict[str, object] | None = None) -> None:
    """A --plan file's training settings and policy replace the flags of those groups: refuse
    one the user gave (args.given) with another value than the plan's, rather than drop it
    unsaid (a --max-grad-norm that would not clip). also: more flags the plan decides, by dest,
    with the plan's value."""
    planned = {**plan.train.to_dict(), **plan.policy.flat(), **(also or {})}
    dests = [*plan_settings(parser), *(also or {})]
    clashes = [f"{given_as(args, dest)} {getattr(args, dest)} (the plan has {planned[dest]})"
               for dest in dests if dest in planned and dest in getattr(args, "given", ())
               and getattr(args, dest) != planned[dest]]
    if clashes:
        raise UsageError(f"--plan {args.plan} sets the training settings and policy, so these "
                         f"would be ignored: {'; '.join(clashes)}. Drop them, make the plan "
                         "with them (`layerslide tune` takes --seq-len and --max-grad-norm), or "
                         "give the flags without --plan to build the plan from them")


def refuse_policy_flags_that_would_not_act(args, train: TrainSpec, policy: Policy) -> None:
    """Refuse a policy flag given (args.given) where the rest of the plan leaves it nothing to
    change: said with what it needs, rather than planned as if it did something."""
    given = getattr(args, "given", frozenset())
    s = policy.schedule
    idle = {
        "cast_worker": (s.cast_worker and not policy.cpu_casts,
                        (f"there are no CPU cast tasks to give a worker (--cast {s.cast} with "
                        f"--cpu-optimizer {policy.kernels.cpu_optimizer}); --cast cpu_per_load, "
                        "or cpu_once with --cpu-optimizer torch, has them")),
        "accumulation": (train.grad_accum == 1, "it schedules --grad-accum above 1"),
        "sweep_groups": (train.grad_accum == 1 or s.accumulation != "layer_major",
                         ("it groups a layer_major sweep (--accumulation layer_major with "
                         "--grad-accum above 1)")),
        "gpu_updated_order": (policy.residency.gpu_updated_blocks == 0,
                              "it orders --gpu-updated-blocks, and there are none"),
    }
    for dest, (inert, why) in idle.items():
        if dest in given and inert:
            raise UsageError(f"{given_as(args, dest)} would change nothing here: {why}; drop it")


def check_gpu_cap(gpu_memory: int | None, profile: HardwareProfile) -> None:
    """Refuse a --gpu-memory cap above the profile's GPU: a cap can only lower it."""
    if gpu_memory is not None and gpu_memory > profile.gpu.memory_bytes:
        raise UsageError(f"--gpu-memory {gpu_memory / GIB:g}GiB is more than {profile.name}'s "
                         f"GPU has ({profile.gpu.memory_bytes / GIB:g} GiB): a cap can only "
                         "lower it; give a smaller one, or another --profile")


def note_cards_under_cap(gpu_memory: int | None, profiles: list[HardwareProfile]) -> None:
    """Say which profiles' cards a cap across profiles leaves whole (it lowers only the larger
    cards), so that their rows are not read as run at the cap."""
    if gpu_memory is None:
        return
    smaller = [p for p in profiles if p.gpu.memory_bytes < gpu_memory]
    if smaller:
        cards = ", ".join(f"{p.name} ({p.gpu.memory_bytes / GIB:g} GiB)" for p in smaller)
        print(f"note: --gpu-memory {gpu_memory / GIB:g}GiB is more than {cards} has: "
              "those rows use the whole card", file=sys.stderr)
