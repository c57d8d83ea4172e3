"""What the commands refuse rather than drop or clamp, and what they say to change: an option
that would change nothing (a flag a --plan replaces, a policy flag the rest of the plan leaves
idle, a cap above the card), and what a plan that overflows a tier could change."""

from __future__ import annotations

import argparse
import sys

from layerslide.cli.options import GIB, UsageError, given_as, plan_settings
from layerslide.hwprofiles import HardwareProfile
from layerslide.planner import Policy, TrainSpec
from layerslide.training.plan_checks import (  # FIT_HINTS: what simulate says too
    FIT_HINTS,  # noqa: F401
    refuse_options_a_plan_replaces,
    refuse_policy_options_that_would_not_act,
)


def refuse_flags_a_plan_replaces(args, parser: argparse.ArgumentParser, plan, *,
                                 also: dict[str, object] | None = None) -> None:
    """A --plan file's training settings and policy replace the flags of those groups: refuse
    one the user gave (args.given) with another value than the plan's (`prepare`'s rule)."""
    given = set(getattr(args, "given", ())) & {*plan_settings(parser), *(also or {})}
    refuse_options_a_plan_replaces(plan, args.plan, given, lambda dest: getattr(args, dest),
                                   lambda dest: given_as(args, dest), also=also)


def refuse_policy_flags_that_would_not_act(args, train: TrainSpec, policy: Policy) -> None:
    """A policy flag given where the rest of the plan leaves it nothing to change (`prepare`'s
    rule)."""
    refuse_policy_options_that_would_not_act(train, policy, getattr(args, "given", frozenset()),
                                             lambda dest: given_as(args, dest))


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
