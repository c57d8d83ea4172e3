"""`layerslide train --config run.toml`: every train option in a TOML file (named as the flags
are, without the leading dashes: `micro-batch = 8` or `micro_batch = 8`); flags on the command
line override it. The resolved options are written beside the trained model."""

from __future__ import annotations

import argparse
import difflib
import tomllib
from pathlib import Path

from layerslide.cli.options import UsageError
from layerslide.training.run import (
    POLICY_OPTIONS,
    TRAIN_OPTIONS,
    RunConfig,
    with_absolute_paths,
)

RESOLVED_NAME = "layerslide-train.toml"
# options that are not run settings: how the file itself is found, or how a run is resumed
NOT_IN_FILE = ("config", "resume", "resume_fallback", "help")


def file_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The options a run config file may set, by their argparse dest."""
    return {a.dest: a for a in parser._actions
            if a.option_strings and a.dest not in NOT_IN_FILE}


def load_run_config(path: str, parser: argparse.ArgumentParser) -> dict:
    """The file's options as argparse would have parsed them, or a UsageError that says which
    entry is wrong and what it may be."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except FileNotFoundError as err:
        raise UsageError(f"--config {path}: no such file") from err
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise UsageError(f"--config {path}: not a readable TOML file ({err})") from err
    options, values, keys = file_options(parser), {}, {}
    for key, value in table.items():
        dest = key.replace("-", "_")
        if dest in keys:  # TOML takes both spellings as two keys: one would silently win
            raise UsageError(f"--config {path}: {keys[dest]!r} and {key!r} both set "
                             f"--{dest.replace('_', '-')}: keep one of them")
        keys[dest] = key
        if dest in NOT_IN_FILE:
            raise UsageError(f"--config {path}: {key!r} is a command-line-only option: pass "
                             f"--{dest.replace('_', '-')} on the command line, not in the file")
        if dest not in options:
            close = difflib.get_close_matches(dest, options, n=1)
            hint = f" (did you mean {close[0].replace('_', '-')}?)" if close else ""
            raise UsageError(f"--config {path}: {key!r} is not a train option{hint}; the file "
                             "takes the flags of `layerslide train --help`, without dashes")
        values[dest] = _converted(path, key, value, options[dest])
    return values


def _converted(path: str, key: str, value, action: argparse.Action):
    """A TOML value checked and converted as the flag's own parser would."""
    where = f"--config {path}: {key} = {value!r}"
    if isinstance(action, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise UsageError(f"{where}: give true or false")
        return value
    if isinstance(value, dict | list):
        raise UsageError(f"{where}: give one value (a string, number or boolean)")
    if isinstance(value, bool):
        raise UsageError(f"{where}: a flag with a value, not a switch")
    try:
        converted = action.type(value if isinstance(value, str) else str(value)) \
            if action.type is not None else (value if isinstance(value, str) else str(value))
    except (TypeError, ValueError, argparse.ArgumentTypeError) as err:
        raise UsageError(f"{where}: {err}") from err
    if action.choices is not None and converted not in action.choices:
        raise UsageError(f"{where}: choose one of {', '.join(map(str, action.choices))}")
    return converted


def with_run_config(args, parser: argparse.ArgumentParser, argv: list[str]):
    """args re-parsed with the --config file's options as defaults: the command line wins."""
    values = load_run_config(args.config, parser)
    defaults = {a.dest: a.default for a in parser._actions}
    parser.set_defaults(**values)
    try:
        resolved = parser.parse_args(argv)
    finally:
        parser.set_defaults(**{k: defaults[k] for k in values})
    # the file gives its entries too, those at the flag's default aside (a resolved file lists
    # every option, --keep-checkpoints at its default with no --checkpoint-dir among them)
    typed = getattr(args, "given", frozenset())
    resolved.given = typed | {dest for dest, value in values.items() if value != defaults[dest]}
    resolved.from_config = resolved.given - typed  # said so where one is refused
    return resolved


def write_resolved(folder: str | Path, config: RunConfig) -> Path:
    """The run's options as a config file (those left unset are left out, and under --plan
    the training settings and policy: the plan has them), into folder; paths absolute."""
    lines = ["# the options `layerslide train` ran with; rerun with --config this-file"]
    planned = set(TRAIN_OPTIONS) | set(POLICY_OPTIONS) if config.plan else set()
    for name, value in with_absolute_paths(config.options()).items():
        if value is None or name in planned or name in NOT_IN_FILE:
            continue
        lines.append(f"{name.replace('_', '-')} = {_toml_value(value)}")
    path = Path(folder) / RESOLVED_NAME
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'
