"""Write a hardware profile back as TOML that the loader reads to the same profile: every
number in its SI unit, with its source (the calibrate command's measurements, or the base
profile's own sources for what was not measured), and its prices. The file stands alone: a
base's and a card's figures are written out."""

from __future__ import annotations

import json
from pathlib import Path

from .loader import OPTIONAL_FIELDS, PROFILE_FIELDS
from .profile import HardwareProfile

# the SI spelling of each unit kind the loader accepts
SI_UNIT = {"bytes": "B", "bytes/s": "B/s", "FLOP/s": "FLOP/s", "params/s": "param/s",
           "seconds": "s", "count": "count", "bytes/param": "B/param", "ratio": "ratio"}


def _string(text: str) -> str:
    return json.dumps(text)  # a TOML basic string is JSON's escaping for what we write


def to_toml(profile: HardwareProfile) -> str:
    lines = [f"name = {_string(profile.name)}", f"description = {_string(profile.description)}"]
    parts = {"gpu": profile.gpu, "link": profile.link, "host": profile.host,
             "storage": profile.storage, "interconnect": profile.interconnect,
             "network": profile.network}
    for section, (_, fields) in PROFILE_FIELDS.items():
        if parts[section] is None:  # an optional table the profile has not
            continue
        lines += ["", f"[{section}]"]
        tables = []
        for key, (attr, kind) in fields.items():
            value = getattr(parts[section], attr)
            dotted = f"{section}.{key}"
            if value is None or (dotted in OPTIONAL_FIELDS and dotted not in profile.sources):
                continue  # an optional field not given: its default stands
            source = _string(profile.sources.get(dotted, "unknown"))
            if kind == "text":
                lines.append(f"{key} = {_string(value)}")
            elif kind == "efficiency":
                tables += ["", f"[{section}.{key}]",
                           f"tokens = [{', '.join(str(t) for t, _ in value)}]",
                           f"efficiency = [{', '.join(repr(e) for _, e in value)}]",
                           f"source = {source}"]
            elif kind == "busy_table":
                tables += ["", f"[{section}.{key}]",
                           f"busy = [{', '.join(repr(b) for b, _ in value)}]",
                           f"speedup = [{', '.join(repr(x) for _, x in value)}]",
                           f"source = {source}"]
            else:
                lines.append(f"{key} = {{ value = {value!r}, unit = {_string(SI_UNIT[kind])}, "
                             f"source = {source} }}")
        lines += tables
    for key, price in profile.prices.given().items():
        lines += ["", f"[price.{key}]", f"value = {price.value!r}",
                  f"unit = {_string(price.currency)}", f"basis = {_string(price.basis)}"]
        if price.date is not None:
            lines.append(f"date = {_string(price.date)}")
        lines.append(f"source = {_string(price.source)}")
    return "\n".join(lines) + "\n"


def save_profile(profile: HardwareProfile, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_toml(profile))
    return path
