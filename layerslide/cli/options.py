"""Command-line options shared by subcommands, and their conversion into specs (bytes in, GiB out)."""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import MISSING, Field
from types import UnionType
from typing import Literal, Union, get_args, get_origin, get_type_hints

from layerslide.hwprofiles import HardwareProfile, parse_bytes, resolve_profile
from layerslide.planner import ModelSpec, Policy, TrainSpec, resolve_model
from layerslide.planner.plan import STEADY_STEPS
from layerslide.planner.settings import (
    POLICY_GROUPS,
    doc_of,
    flag_fields,
    policy_flag_fields,
)
from layerslide.training.run import with_environment as with_env_overrides

GIB = 1024**3


class UsageError(Exception):
    """Bad command-line input; main() prints it and exits with status 2."""


def gib(nbytes: float | None) -> float | None:
    return None if nbytes is None else nbytes / GIB


_NOT_GIVEN = object()


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> frozenset[str]:
    """The options argv gives (their dests), as the parser reads them (abbreviations and
    --flag=value included): told from those left at their defaults even where a user typed
    the default's value."""
    actions = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    saved = {a.dest: a.default for a in actions}
    parser.set_defaults(**dict.fromkeys(saved, _NOT_GIVEN))
    try:
        parsed = parser.parse_args(argv)
    finally:
        parser.set_defaults(**saved)
    return frozenset(dest for dest in saved if getattr(parsed, dest) is not _NOT_GIVEN)


def plan_settings(parser: argparse.ArgumentParser) -> list[str]:
    """The dests of a command's options that a plan holds: its training settings and policy
    (add_train's and add_policy's groups)."""
    return [a.dest for g in parser._action_groups if g.title in ("training settings", "policy")
            for a in g._group_actions]


def flag_of(dest: str) -> str:
    """The command-line flag of an option's dest."""
    return "--" + dest.replace("_", "-")


# a spec's field named otherwise than the flag that sets it
_FIELD_FLAGS = {"num_steps": "steps"}


def in_flag_words(message: str, parser: argparse.ArgumentParser, given) -> str:
    """A refusal that names a spec's field (`Policy.moments_on_nvme=2.0: ...`, or a bare
    `num_steps=1: ...` opening it) said as the flag the user gave (`--moments-on-nvme 2.0:`):
    a value from a plan file, or a profile variant's `drives=x`, stays as it is."""
    dests = {a.dest for a in parser._actions if a.option_strings} & set(given)

    def flag(match: re.Match) -> str:
        dest = _FIELD_FLAGS.get(match["field"], match["field"])
        if dest not in dests:
            return match[0]
        return f"{flag_of(dest)} {match['value']}:"
    return re.sub(r"(?:\b[A-Z]\w*\.|^)(?P<field>[a-z_]+)=(?P<value>[^:\s]+):", flag, message)


def given_as(args, dest: str) -> str:
    """The flag of an option the user gave, and where: typed, or in the --config file."""
    where = f" (in --config {args.config})" if dest in getattr(args, "from_config", ()) else ""
    return flag_of(dest) + where


def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 1,2,4")
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= 1")
    return values


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number, e.g. 5")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least 1")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds, e.g. 300")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give more than 0 seconds")
    return value


def str_list(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated names")
    return values


def profile_list(text: str) -> tuple[str, ...]:
    """Comma-separated profiles, a variant's own `,key=value` parts kept with it
    (`workstation-8ch+rtx5090,ram=512GiB,drives=4,h200-bench` is two profiles)."""
    profiles: list[str] = []
    for part in str_list(text):
        if "=" in part and profiles:
            profiles[-1] += f",{part}"
        elif "=" in part:
            raise argparse.ArgumentTypeError(f"{text!r}: {part} follows no profile (a variant "
                                             "is BASE[+CARD],key=value,...)")
        else:
            profiles.append(part)
    return tuple(profiles)


def byte_size(text: str) -> int:
    size = byte_size_or_zero(text)
    if size == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be more than 0 bytes")
    return size


def byte_size_or_zero(text: str) -> int:
    try:
        size = parse_bytes(text)
    except (TypeError, ValueError) as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    if size < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be 0 bytes or more")
    return size


def byte_sizes(text: str) -> tuple[int, ...]:
    return tuple(byte_size(v) for v in str_list(text))


def add_model(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required,
                   help="preset name (see `layerslide models`) or a Hugging Face config.json "
                        "file or folder")


DEFAULT_PROFILE = "h200-bench"


def add_profile(p: argparse.ArgumentParser, default: str | None = DEFAULT_PROFILE) -> None:
    p.add_argument("--profile", default=default,
                   help="built-in hardware profile (see `layerslide profiles`) or a path to a "
                        f"TOML profile (default: {default or DEFAULT_PROFILE})")
    p.add_argument("--gpu-memory", type=byte_size, default=None, metavar="SIZE",
                   help="cap GPU memory, e.g. 24GiB (bytes; units B, KB, MB, GB, KiB, MiB, GiB...)")
    add_nvme_drives(p)


def add_nvme_drives(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nvme-drives", type=int, default=None, metavar="N",
                   help="the profile's NVMe drive N times over (the tier stripes its files "
                        "over one folder per drive: each drive's rates and capacity, N of "
                        "them; default: the profile's own count)")


def add_train(p: argparse.ArgumentParser) -> None:
    add_field_flags(p.add_argument_group("training settings"), TrainSpec)


def add_policy(p: argparse.ArgumentParser, *, plan_steps: bool = True) -> None:
    g = p.add_argument_group("policy")
    for cls in POLICY_GROUPS.values():
        add_field_flags(g, cls)
    if not plan_steps:
        return
    p.add_argument("--steps", type=int, default=STEADY_STEPS,
                   help=f"consecutive training steps to plan (simulate needs >= {STEADY_STEPS}: "
                        "the last cycle is the steady-state step it reports)")


def add_field_flags(group: argparse._ArgumentGroup, cls: type,
                    only: tuple[str, ...] | None = None) -> None:
    """A flag for each field of a settings class that is one (settings.flag_fields), or of
    those named in `only`, all read off the field: --its-name, its doc the help, its default,
    a Literal's values the choices."""
    hints = get_type_hints(cls)
    for f in flag_fields(cls):
        if only is not None and f.name not in only:
            continue
        group.add_argument(flag_of(f.name), **_flag_options(cls, f, hints[f.name]))


def _flag_options(cls: type, f: Field, hint) -> dict:
    """argparse's options for a field's flag: a bool is a switch, X | None takes an X."""
    where = f"{cls.__name__}.{f.name}"
    if doc_of(f) is None or f.default is MISSING:
        raise TypeError(f"{where} is a command-line flag: declare it with settings.setting("
                        "default, doc), or name it in settings.NOT_ON_COMMAND_LINE")
    options = {"default": f.default, "help": doc_of(f).replace("%", "%%")}  # argparse's %
    if hint is bool:
        if f.default is not False:
            raise TypeError(f"{where}: a switch defaults to False (its flag turns it on)")
        return {**options, "action": "store_true"}
    if get_origin(hint) is Literal:
        return {**options, "choices": get_args(hint)}
    if get_origin(hint) in (Union, UnionType):  # X | None: None is the default's, not a value
        kinds = [t for t in get_args(hint) if t is not type(None)]
        hint = kinds[0] if len(kinds) == 1 else hint
    if hint not in (int, float, str):
        raise TypeError(f"{where}: no flag for a {hint}; give it int, float, str, bool, a "
                        "Literal, or one of those | None")
    return {**options, "type": hint}


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON (SI units: bytes, seconds)")


def model_of(args) -> ModelSpec:
    return resolve_model(args.model)


def profile_of(name: str, nvme_drives: int | None = None) -> HardwareProfile:
    """A profile by name or path, or a variant BASE[+CARD][,ram=SIZE][,drives=N][,nvme=SIZE]
    (hwprofiles.variants), with --nvme-drives applied where given."""
    profile = resolve_profile(name)
    if nvme_drives is None:
        return profile
    if ",drives=" in name and nvme_drives != profile.storage.drives:
        raise UsageError(f"--profile {name} names {profile.storage.drives} drives, and "
                         f"--nvme-drives {nvme_drives} another count: give it once")
    if nvme_drives < 1:
        raise UsageError(f"--nvme-drives {nvme_drives}: give a whole number of drives >= 1")
    return profile.with_overrides(nvme_drives=nvme_drives)


def train_of(args) -> TrainSpec:
    return TrainSpec(**{f.name: getattr(args, f.name) for f in flag_fields(TrainSpec)})


def policy_of(args) -> Policy:
    """The policy the flags say, with the executor settings the environment gives."""
    return with_env_overrides(Policy.of(**{f.name: getattr(args, f.name)
                                           for f in policy_flag_fields()}))


def progress_printer(what: str, *, quiet_s: float = 5.0):
    """A progress callback: on a terminal `what: done/total (elapsed, about N s left)` redrawn
    on stderr; elsewhere (a log, a pipe) a line at every tenth of the work once it has run
    quiet_s. The time left is the time so far per item done, times the items left (a
    best-first search counts the candidates its bounds rule out as done)."""
    start = time.monotonic()
    tty = sys.stderr.isatty()
    last = [0]

    def show(done: int, total: int) -> None:
        elapsed = time.monotonic() - start
        left = f", about {elapsed / done * (total - done):.0f} s left" if 0 < done < total else ""
        text = f"{what}: {done}/{total} ({elapsed:.0f} s{left})"
        if tty:
            end = "\n" if done >= total else ""
            print(f"\r{text}\033[K", end=end, file=sys.stderr, flush=True)
        elif elapsed >= quiet_s and total and (done >= total or done * 10 // total > last[0]):
            last[0] = done * 10 // total
            print(text, file=sys.stderr, flush=True)

    return show


def tolerance_of(args) -> float:
    """--tolerance PCT as a fraction, refused outside [0, 100)."""
    if not 0.0 <= args.tolerance < 100.0:
        raise UsageError(f"--tolerance {args.tolerance:g}: give a percentage from 0 to below 100")
    return args.tolerance / 100
