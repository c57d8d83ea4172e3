"""Read hardware profiles from TOML with strict validation; find the built-in ones."""

from __future__ import annotations

import os
import tomllib
from itertools import pairwise
from pathlib import Path
from typing import Any

from .fabric import InterconnectSpec, NetworkSpec
from .profile import (
    PRICE_BASES,
    PRICE_COMPONENTS,
    GPUSpec,
    HardwareProfile,
    HostSpec,
    LinkSpec,
    Price,
    Prices,
    StorageSpec,
)
from .units import UNIT_KIND, UNITS_BY_KIND, to_si

BUILTIN_DIR = Path(__file__).parent / "builtin"
# GPU cards a profile (or --profile BASE+CARD) can put in: each file a [gpu] and the [link] its
# PCIe generation gives, and optionally [price.gpu].
CARDS_DIR = BUILTIN_DIR / "gpus"
# What a source says it is, its first word: a vendor's datasheet or spec page, a measurement on
# a named machine, a figure derived from others (the source says how), an assumption (no public
# figure found: said so), an older estimate, or a what-if override. Built-in profiles must start
# every source with one of these (user files are not held to it).
SOURCE_KINDS = ("datasheet", "measured", "derived", "assumption", "estimate", "override")

# TOML field -> (dataclass attribute, unit kind). "text" is a plain string, "efficiency" the
# GEMM table; every other kind is a {value, unit, source} table converted to SI.
PROFILE_FIELDS: dict[str, tuple[type, dict[str, tuple[str, str]]]] = {
    "gpu": (
        GPUSpec,
        {
            "name": ("name", "text"),
            "memory": ("memory_bytes", "bytes"),
            "bf16_flops": ("bf16_flops_per_s", "FLOP/s"),
            "hbm_bandwidth": ("hbm_bytes_per_s", "bytes/s"),
            "matmul_efficiency": ("matmul_efficiency", "efficiency"),
            "attention_forward_efficiency": ("attention_forward_efficiency", "efficiency"),
            "attention_backward_efficiency": ("attention_backward_efficiency", "efficiency"),
            "kernel_launch": ("kernel_launch_s", "seconds"),
            "busy_speedup": ("busy_speedup", "busy_table"),
        },
    ),
    "link": (
        LinkSpec,
        {
            "h2d": ("h2d_bytes_per_s", "bytes/s"),
            "d2h": ("d2h_bytes_per_s", "bytes/s"),
            "duplex": ("duplex_bytes_per_s", "bytes/s"),
            "h2d_pageable": ("h2d_pageable_bytes_per_s", "bytes/s"),
        },
    ),
    "host": (
        HostSpec,
        {
            "cores": ("cores", "count"),
            "ram": ("ram_bytes", "bytes"),
            "memory_bandwidth": ("memory_bytes_per_s", "bytes/s"),
            "adamw_throughput": ("adamw_params_per_s", "params/s"),
            "adamw_bytes_per_param": ("adamw_bytes_per_param", "bytes/param"),
            "adamw_bf16_throughput": ("adamw_bf16_params_per_s", "params/s"),
            "adamw_int8_throughput": ("adamw_int8_params_per_s", "params/s"),
            "adamw_call_overhead": ("adamw_call_s", "seconds"),
            "cast_throughput": ("cast_bytes_per_s", "bytes/s"),
            "dma_share": ("dma_share", "ratio"),
            "dma_write_share": ("dma_write_share", "ratio"),
            "dma_read_cost": ("dma_read_cost", "ratio"),
            "dma_write_cost": ("dma_write_cost", "ratio"),
            "dispatch_cores": ("dispatch_cores", "ratio"),
            "kernel_launch_beside_kernels": ("kernel_launch_beside_kernels_s", "seconds"),
            "kernel_launch_beside_niced_kernels": ("kernel_launch_beside_niced_kernels_s",
                                                   "seconds"),
            "reserve": ("reserve_bytes", "bytes"),
            "ram_max": ("ram_max_bytes", "bytes"),
            "gpus": ("gpus", "count"),
            "gpus_per_link": ("gpus_per_link", "count"),
        },
    ),
    "storage": (
        StorageSpec,
        {
            "read": ("read_bytes_per_s", "bytes/s"),
            "write": ("write_bytes_per_s", "bytes/s"),
            "capacity": ("capacity_bytes", "bytes"),
            "duplex": ("duplex_bytes_per_s", "bytes/s"),
            "duplex_read_share": ("duplex_read_share", "ratio"),
            "drives": ("drives", "count"),
            "drives_max": ("drives_max", "count"),
        },
    ),
    "interconnect": (
        InterconnectSpec,
        {
            "kind": ("kind", "text"),
            "bandwidth": ("bandwidth_bytes_per_s", "bytes/s"),
            "latency": ("latency_s", "seconds"),
        },
    ),
    "network": (
        NetworkSpec,
        {
            "bandwidth": ("bandwidth_bytes_per_s", "bytes/s"),
            "latency": ("latency_s", "seconds"),
            "nics": ("nics", "count"),
        },
    ),
}
# Tables a profile may leave out: a host of one GPU has no interconnect, one host no network.
OPTIONAL_SECTIONS = {"interconnect", "network"}
# Fields a profile may leave out; the dataclass default stands, with no source.
OPTIONAL_FIELDS = {"storage.duplex", "storage.duplex_read_share", "storage.drives",
                   "gpu.busy_speedup",
                   "host.dma_write_share", "host.dma_read_cost", "host.dma_write_cost",
                   "host.dispatch_cores", "host.reserve", "host.adamw_bf16_throughput",
                   "host.adamw_int8_throughput", "host.adamw_call_overhead", "host.ram_max",
                   "host.kernel_launch_beside_kernels", "host.kernel_launch_beside_niced_kernels",
                   "storage.drives_max", "host.gpus", "host.gpus_per_link",
                   "interconnect.bandwidth", "interconnect.latency", "network.latency",
                   "network.nics"}
# Fields that may be 0 (every other number must be > 0): a copy that takes nothing of the
# host memory the CPU uses
ZERO_ALLOWED_FIELDS = {"host.dma_read_cost", "host.dma_write_cost", "host.adamw_call_overhead"}
_TOP_LEVEL = ("name", "description", *PROFILE_FIELDS, "price")
_CARD_TOP_LEVEL = ("description", "gpu", "link", "price")
# Byte counts and core counts are whole numbers inside; everything else stays a float.
INTEGER_ATTRS = {"memory_bytes", "ram_bytes", "capacity_bytes", "cores", "drives",
                 "reserve_bytes", "ram_max_bytes", "drives_max", "gpus", "gpus_per_link", "nics"}
_PRICE_KEYS = ("value", "unit", "basis", "date", "source")


class ProfileError(ValueError):
    """A hardware profile file is invalid; the message names the file and the dotted field."""

    def __init__(self, file: str, field: str, message: str) -> None:
        self.file = file
        self.field = field
        super().__init__(f"{file}: {field}: {message}" if field else f"{file}: {message}")


def builtin_profile_names() -> list[str]:
    """Names of the profiles shipped in builtin/, sorted."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))


def builtin_card_names() -> list[str]:
    """Names of the GPU cards in builtin/gpus/, sorted (for `base+card` and `gpu = "card"`)."""
    return sorted(p.stem for p in CARDS_DIR.glob("*.toml"))


def builtin_profiles() -> list[HardwareProfile]:
    """All shipped profiles, loaded and validated, sorted by name."""
    return [load_profile(name) for name in builtin_profile_names()]


def builtin_one_gpu_profiles() -> list[HardwareProfile]:
    """The shipped profiles of one GPU: what `whatif` and the demo compare by default (hosts of
    several GPUs are `whatif --gpu-counts`'s)."""
    return [p for p in builtin_profiles() if p.host.gpus == 1]


def builtin_several_gpu_profiles() -> list[HardwareProfile]:
    """The shipped hosts of several GPUs: what `whatif --gpu-counts` compares by default."""
    return [p for p in builtin_profiles() if p.host.gpus > 1]


def load_profile(name_or_path: str | os.PathLike[str], *,
                 gpu: str | None = None) -> HardwareProfile:
    """Load a built-in profile by name, or any profile by path to a .toml file. A profile may
    build on another (`base = "name or path"`, its own tables replacing the base's fields) and
    take a card from builtin/gpus/ (`gpu = "card"`); `gpu` here swaps the card in as well (the
    profile is then named `name+card`)."""
    text = os.fspath(name_or_path)
    found = _find(text, pathlike=isinstance(name_or_path, os.PathLike))
    if found is None:
        raise ProfileError(
            text,
            "",
            f"unknown hardware profile: not a built-in name and no such file; "
            f"built-ins: {', '.join(builtin_profile_names())}",
        )
    path, shown = found
    data = _resolve(_read(path, shown=shown), file=shown, path=path, seen=())
    if gpu is not None:
        data = _with_card(data, gpu, file=shown, field="gpu")
        data["name"] = f"{_text(data.get('name'), file=shown, field='name')}+{gpu}"
    return _build(data, file=shown, path=str(path), strict=path.parent == BUILTIN_DIR)


def _find(text: str, *, pathlike: bool = False,
          relative_to: Path | None = None) -> tuple[Path, str] | None:
    """(path, name shown in messages) of a built-in name or a file, or None."""
    if not pathlike and text in builtin_profile_names():
        return BUILTIN_DIR / f"{text}.toml", f"{text}.toml"
    path = Path(text)
    if relative_to is not None and not path.is_absolute():
        path = relative_to / path
    return (path, text) if path.is_file() else None


def _read(path: Path, *, shown: str) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(shown, "", f"malformed TOML: {e}") from e
    except OSError as e:
        raise ProfileError(shown, "", f"cannot read: {e}") from e


def _resolve(data: dict[str, Any], *, file: str, path: Path,
             seen: tuple[str, ...]) -> dict[str, Any]:
    """The file's tables over its base's (field by field), with its card (`gpu = "card"`)
    put in first; bases may build on bases, never in a circle."""
    data = dict(data)
    merged: dict[str, Any] = {}
    if "base" in data:
        name = _text(data.pop("base"), file=file, field="base")
        found = _find(name, relative_to=path.parent)
        if found is None:
            raise ProfileError(file, "base", f"unknown base profile {name!r}: not a built-in "
                                             f"name and no such file; built-ins: "
                                             f"{', '.join(builtin_profile_names())}")
        base_path, base_shown = found
        key = str(base_path.resolve())
        if key in seen or key == str(path.resolve()):
            raise ProfileError(file, "base", f"{name!r} builds on itself (a circle of bases)")
        merged = _resolve(_read(base_path, shown=base_shown), file=base_shown, path=base_path,
                          seen=(*seen, str(path.resolve())))
        if "name" not in data:
            raise ProfileError(file, "name", "missing: a profile built on a base names itself")
    if isinstance(data.get("gpu"), str):
        merged = _with_card(merged, data.pop("gpu"), file=file, field="gpu")
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}  # this file's fields over the base's
        else:
            merged[key] = value
    return merged


def _with_card(data: dict[str, Any], card: Any, *, file: str, field: str) -> dict[str, Any]:
    """The data with the card's [gpu], [link] and GPU price in place of its own."""
    name = _text(card, file=file, field=field)
    cards = builtin_card_names()
    if name not in cards:
        raise ProfileError(file, field, f"unknown GPU card {name!r}; cards: {', '.join(cards)}")
    shown = f"gpus/{name}.toml"
    card_data = _read(CARDS_DIR / f"{name}.toml", shown=shown)
    _check_keys(card_data, _CARD_TOP_LEVEL, file=shown, prefix="",
                optional={"price", "description"})
    out = {**data, "gpu": card_data["gpu"], "link": card_data["link"]}
    price = dict(out.get("price") or {})
    price.pop("gpu", None)
    card_price = card_data.get("price", {})
    if not isinstance(card_price, dict) or set(card_price) - {"gpu"}:
        raise ProfileError(shown, "price", "a card gives only [price.gpu]")
    if "gpu" in card_price:
        price["gpu"] = card_price["gpu"]
    out["price"] = price
    return out


def _build(data: dict[str, Any], *, file: str, path: str,
           strict: bool = False) -> HardwareProfile:
    _check_keys(data, _TOP_LEVEL, file=file, prefix="", optional={"price", *OPTIONAL_SECTIONS})
    sources: dict[str, str] = {}
    parts: dict[str, Any] = {}
    for section, (cls, fields) in PROFILE_FIELDS.items():
        if section not in data:  # an optional table left out
            continue
        table = data[section]
        if not isinstance(table, dict):
            raise ProfileError(file, section, f"must be a table ([{section}]), got {_type(table)}")
        _check_keys(table, fields, file=file, prefix=f"{section}.",
                    optional={k.split(".", 1)[1] for k in OPTIONAL_FIELDS
                              if k.startswith(f"{section}.")})
        kwargs: dict[str, Any] = {}
        for key, (attr, kind) in fields.items():
            dotted = f"{section}.{key}"
            if key not in table:  # an optional field left out
                continue
            if kind == "text":
                kwargs[attr] = _text(table[key], file=file, field=dotted)
                continue
            if kind == "efficiency":
                # attention FLOPs are counted non-causal, so a causal kernel can pass 1 (up to 2)
                ceiling = 2.0 if key.startswith("attention") else 1.0
                kwargs[attr], sources[dotted] = _efficiency(table[key], file=file, field=dotted,
                                                            ceiling=ceiling)
                continue
            if kind == "busy_table":
                kwargs[attr], sources[dotted] = _busy_table(table[key], file=file, field=dotted)
                continue
            value, sources[dotted] = _quantity(table[key], kind, file=file, field=dotted)
            if attr in INTEGER_ATTRS:
                value = round(value)
            kwargs[attr] = value
        try:
            parts[section] = cls(**kwargs)
        except ValueError as e:  # the dataclass's own checks: name the file
            raise ProfileError(file, section, str(e)) from e
    if strict:
        for dotted, source in sources.items():
            kind = source.replace(":", " ").split(" ", 1)[0]
            if kind not in SOURCE_KINDS:
                raise ProfileError(file, f"{dotted}.source",
                                   f"must start with what it is, one of {', '.join(SOURCE_KINDS)}"
                                   f" (got {source[:40]!r})")
    named = {"name": _text(data["name"], file=file, field="name"),
             "description": _text(data["description"], file=file, field="description"),
             "prices": _prices(data.get("price", {}), file=file)}
    try:
        return HardwareProfile(sources=sources, path=path, **named, **parts)
    except ValueError as e:  # the whole profile's checks (a host of several GPUs)
        raise ProfileError(file, "", str(e)) from e


def _prices(table: Any, *, file: str) -> Prices:
    """Read [price]: each component { value, unit = "USD", basis = "list" | "user", date,
    source }; a list price needs its date."""
    if not isinstance(table, dict):
        raise ProfileError(file, "price", f"must be a table ([price]), got {_type(table)}")
    _check_keys(table, PRICE_COMPONENTS, file=file, prefix="price.",
                optional=set(PRICE_COMPONENTS))
    out: dict[str, Price] = {}
    for key, entry in table.items():
        field = f"price.{key}"
        if not isinstance(entry, dict):
            raise ProfileError(file, field, 'must be a table like { value = 1999, unit = "USD", '
                                            'basis = "list", date = "2025-01", source = "..." }, '
                                            f"got {_type(entry)}")
        _check_keys(entry, _PRICE_KEYS, file=file, prefix=f"{field}.", optional={"date"})
        value, unit, basis = entry["value"], entry["unit"], entry["basis"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProfileError(file, f"{field}.value", f"must be a number, got {_type(value)}")
        if not value >= 0:
            raise ProfileError(file, f"{field}.value", f"a price must be >= 0, got {value}")
        if not (isinstance(unit, str) and len(unit) == 3 and unit.isalpha() and unit.isupper()):
            raise ProfileError(file, f"{field}.unit",
                               f'must be a currency code such as "USD" or "EUR", got {unit!r}')
        if basis not in PRICE_BASES:
            raise ProfileError(file, f"{field}.basis",
                               f"must be one of {', '.join(PRICE_BASES)} (a dated list price or "
                               f"the user's own figure), got {basis!r}")
        date = entry.get("date")
        if basis == "list" and date is None:
            raise ProfileError(file, f"{field}.date", "missing: a list price says when it was "
                                                      'listed, e.g. date = "2025-01"')
        if date is not None:
            date = _text(str(date), file=file, field=f"{field}.date")
        try:
            out[key] = Price(value=float(value), currency=unit, basis=basis, date=date,
                             source=_text(entry["source"], file=file, field=f"{field}.source"))
        except ValueError as e:
            raise ProfileError(file, field, str(e)) from e
    try:
        return Prices(**out)
    except ValueError as e:
        raise ProfileError(file, "price", str(e)) from e


def _check_keys(table: dict[str, Any], known: Any, *, file: str, prefix: str,
                optional: set[str] = frozenset()) -> None:
    known = list(known)
    for key in table:
        if key not in known:
            raise ProfileError(
                file, f"{prefix}{key}", f"unknown field; known fields here: {', '.join(known)}"
            )
    for key in known:
        if key not in table and key not in optional:
            raise ProfileError(file, f"{prefix}{key}", "missing")


def _quantity(entry: Any, kind: str, *, file: str, field: str) -> tuple[float, str]:
    """Read {value, unit, source} and return (value in SI, source)."""
    example = f'{{ value = ..., unit = "{next(iter(UNITS_BY_KIND[kind]))}", source = "..." }}'
    if not isinstance(entry, dict):
        raise ProfileError(file, field, f"must be a table like {example}, got {_type(entry)}")
    _check_keys(entry, ("value", "unit", "source"), file=file, prefix=f"{field}.")
    value, unit = entry["value"], entry["unit"]
    source = _text(entry["source"], file=file, field=f"{field}.source")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(file, f"{field}.value", f"must be a number, got {_type(value)}")
    if not isinstance(unit, str):
        raise ProfileError(file, f"{field}.unit", f"must be a string, got {_type(unit)}")
    if unit not in UNIT_KIND:
        raise ProfileError(
            file,
            f"{field}.unit",
            f"unknown unit {unit!r}; accepted units: {', '.join(UNIT_KIND)}",
        )
    if UNIT_KIND[unit] != kind:
        raise ProfileError(
            file,
            f"{field}.unit",
            f"unit {unit!r} is a {UNIT_KIND[unit]} unit but this field needs a {kind} unit "
            f"({', '.join(UNITS_BY_KIND[kind])})",
        )
    if field in ZERO_ALLOWED_FIELDS:
        if not value >= 0:
            raise ProfileError(file, f"{field}.value", f"must be >= 0, got {value}")
    elif not value > 0:
        raise ProfileError(file, f"{field}.value", f"must be > 0, got {value}")
    if kind == "count" and not isinstance(value, int):
        raise ProfileError(file, f"{field}.value", f"must be a whole number, got {value}")
    return to_si(value, unit, kind), source


def _efficiency(entry: Any, *, file: str, field: str,
                ceiling: float = 1.0) -> tuple[tuple[tuple[int, float], ...], str]:
    """Read {tokens = [...], efficiency = [...], source} into sorted (tokens, fraction) pairs."""
    if not isinstance(entry, dict):
        raise ProfileError(
            file,
            field,
            f'must be a table like {{ tokens = [...], efficiency = [...], source = "..." }}, '
            f"got {_type(entry)}",
        )
    _check_keys(entry, ("tokens", "efficiency", "source"), file=file, prefix=f"{field}.")
    tokens, effs = entry["tokens"], entry["efficiency"]
    source = _text(entry["source"], file=file, field=f"{field}.source")
    for key, seq in (("tokens", tokens), ("efficiency", effs)):
        if not isinstance(seq, list) or not seq:
            raise ProfileError(file, f"{field}.{key}", f"must be a non-empty array, got {seq!r}")
    if len(tokens) != len(effs):
        raise ProfileError(
            file, field, f"tokens has {len(tokens)} entries but efficiency has {len(effs)}"
        )
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int) or t <= 0:
            raise ProfileError(file, f"{field}.tokens", f"must be positive integers, got {t!r}")
    if any(b <= a for a, b in pairwise(tokens)):
        raise ProfileError(file, f"{field}.tokens", f"must be strictly increasing, got {tokens}")
    for e in effs:
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0 < e <= ceiling:
            raise ProfileError(
                file, f"{field}.efficiency", f"must be fractions in (0, {ceiling:g}], got {e!r}"
            )
    return tuple((t, float(e)) for t, e in zip(tokens, effs)), source


def _busy_table(entry: Any, *, file: str,
                field: str) -> tuple[tuple[tuple[float, float], ...], str]:
    """Read {busy = [...], speedup = [...], source} into (busy fraction, speedup) pairs."""
    if not isinstance(entry, dict):
        raise ProfileError(
            file, field,
            f'must be a table like {{ busy = [...], speedup = [...], source = "..." }}, '
            f"got {_type(entry)}")
    _check_keys(entry, ("busy", "speedup", "source"), file=file, prefix=f"{field}.")
    busy, speedup = entry["busy"], entry["speedup"]
    source = _text(entry["source"], file=file, field=f"{field}.source")
    for key, seq in (("busy", busy), ("speedup", speedup)):
        if not isinstance(seq, list) or not seq or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 for v in seq):
            raise ProfileError(file, f"{field}.{key}",
                               f"must be a non-empty array of positive numbers, got {seq!r}")
    if len(busy) != len(speedup):
        raise ProfileError(file, field,
                           f"busy has {len(busy)} entries but speedup has {len(speedup)}")
    if busy[-1] > 1 or any(b <= a for a, b in pairwise(busy)):
        raise ProfileError(file, f"{field}.busy",
                           f"must be fractions in (0, 1], strictly increasing, got {busy}")
    return tuple((float(b), float(x)) for b, x in zip(busy, speedup)), source


def _text(value: Any, *, file: str, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ProfileError(file, field, f"must be a non-empty string, got {_type(value)}")
    return value


def _type(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"
