"""Units for hardware profiles: names, kinds and SI factors, plus a byte-size parser for the CLI."""

from __future__ import annotations

import re

# kind -> {unit: factor to SI}. Units are case-sensitive on purpose: "Mb" vs "MB" is a real
# difference elsewhere, so we accept only the spellings listed here and say which ones.
UNITS_BY_KIND: dict[str, dict[str, float]] = {
    "bytes": {
        "B": 1.0,
        "KB": 1e3,
        "MB": 1e6,
        "GB": 1e9,
        "TB": 1e12,
        "KiB": 2.0**10,
        "MiB": 2.0**20,
        "GiB": 2.0**30,
        "TiB": 2.0**40,
    },
    "bytes/s": {
        "B/s": 1.0,
        "KB/s": 1e3,
        "MB/s": 1e6,
        "GB/s": 1e9,
        "TB/s": 1e12,
        "KiB/s": 2.0**10,
        "MiB/s": 2.0**20,
        "GiB/s": 2.0**30,
        "Gbit/s": 1e9 / 8,  # network cards are rated in bits
    },
    "FLOP/s": {"FLOP/s": 1.0, "GFLOP/s": 1e9, "TFLOP/s": 1e12, "PFLOP/s": 1e15},
    "params/s": {"param/s": 1.0, "Mparam/s": 1e6, "Gparam/s": 1e9},
    "seconds": {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9},
    "count": {"count": 1.0},
    "bytes/param": {"B/param": 1.0},
    "ratio": {"ratio": 1.0},
}

UNIT_KIND: dict[str, str] = {u: k for k, units in UNITS_BY_KIND.items() for u in units}
UNIT_FACTOR: dict[str, float] = {u: f for units in UNITS_BY_KIND.values() for u, f in units.items()}

_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d+))?\s*([A-Za-z]*)\s*$")


def to_si(value: float, unit: str, kind: str) -> float:
    """Convert value in unit to SI; ValueError if the unit is unknown or of another kind."""
    if unit not in UNIT_KIND:
        raise ValueError(f"unknown unit {unit!r}; accepted units: {', '.join(UNIT_KIND)}")
    if UNIT_KIND[unit] != kind:
        raise ValueError(
            f"unit {unit!r} is a {UNIT_KIND[unit]} unit, expected a {kind} unit "
            f"({', '.join(UNITS_BY_KIND[kind])})"
        )
    return value * UNIT_FACTOR[unit]


def parse_bytes(text: str) -> int:
    """Parse a size such as "24GiB", "256 GB", "1.5TB" or "1024" (plain bytes) into bytes."""
    m = _BYTES_RE.match(text)
    if m is None:
        raise ValueError(
            f"cannot read {text!r} as a size: write a non-negative number and an optional "
            f"unit, e.g. '24GiB', '256GB', '1.5TB' or '1024' (bytes); "
            f"units: {', '.join(UNITS_BY_KIND['bytes'])}"
        )
    number, exponent, unit = m.groups()
    unit = unit or "B"
    factors = UNITS_BY_KIND["bytes"]
    if unit not in factors:
        hint = next((u for u in factors if u.lower() == unit.lower()), None)
        did_you_mean = f" (did you mean {hint!r}?)" if hint else ""
        raise ValueError(
            f"unknown size unit {unit!r} in {text!r}{did_you_mean}; "
            f"accepted: {', '.join(factors)} (KB/GB are powers of 10, KiB/GiB powers of 2)"
        )
    try:
        value = float(number) * (10.0 ** int(exponent) if exponent else 1.0)
        return round(value * factors[unit])
    except (OverflowError, ValueError):
        raise ValueError(f"{text!r} is too large to be a size in bytes") from None
