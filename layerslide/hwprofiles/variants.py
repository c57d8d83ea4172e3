"""Profile variants without hand copies: `BASE[+CARD][,key=value...]`.

`workstation-8ch+rtx5090,ram=512GiB,drives=4` is the built-in (or file) profile workstation-8ch
with the rtx5090 card from builtin/gpus/ in place of its own GPU and link, 512 GiB of RAM and
four of its NVMe drives. Every command's --profile takes this (cli.options.profile_of). Keys:

- gpu=CARD: the same as +CARD
- ram=SIZE: host RAM (DIMM sizes are binary: 256GiB); refused above the profile's host.ram_max
- drives=N: N of the profile's NVMe drive (each its rates and capacity); refused above
  storage.drives_max
- nvme=SIZE: the NVMe capacity of all the drives together

The variant's name is the canonical spelling, its overridden figures' sources say "override",
and its cost (where the profile has prices) counts its own RAM and drives.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .loader import ProfileError, _find, builtin_card_names, load_profile
from .profile import HardwareProfile
from .units import parse_bytes

OVERRIDE_KEYS = {
    "gpu": "a GPU card of builtin/gpus/ (the same as +CARD)",
    "ram": "host RAM, e.g. 256GiB",
    "drives": "how many of the profile's NVMe drive, e.g. 2",
    "nvme": "NVMe capacity of all the drives together, e.g. 4TB",
}
SPEC_SYNTAX = "BASE[+CARD][,ram=SIZE][,drives=N][,nvme=SIZE][,gpu=CARD]"


@dataclass(frozen=True, kw_only=True)
class ProfileSpec:
    """A base profile and what a variant changes in it."""

    base: str
    gpu: str | None = None
    ram_bytes: int | None = None
    drives: int | None = None
    nvme_bytes: int | None = None

    def text(self) -> str:
        """The canonical spelling (the variant's profile name)."""
        out = self.base + (f"+{self.gpu}" if self.gpu else "")
        if self.ram_bytes is not None:
            out += f",ram={_size(self.ram_bytes)}"
        if self.drives is not None:
            out += f",drives={self.drives}"
        if self.nvme_bytes is not None:
            out += f",nvme={_size(self.nvme_bytes)}"
        return out


def _size(nbytes: int) -> str:
    if nbytes % 2**30 == 0:
        return f"{nbytes // 2**30}GiB"
    if nbytes % 10**9 == 0:
        return f"{nbytes // 10**9}GB"
    return str(nbytes)


def is_spec(text: str) -> bool:
    """Whether the text asks for a variant (and is not a profile name or file as it stands)."""
    return _find(text) is None and ("+" in text or "," in text)


def parse_profile_spec(text: str) -> ProfileSpec:
    """Read `BASE[+CARD][,key=value...]`; a ProfileError (a ValueError) names what is wrong.
    Checks the syntax, the keys, the values and the card's name; not whether the base exists."""
    parts = [p.strip() for p in text.split(",")]
    head, pairs = parts[0], parts[1:]
    base, _, card = head.partition("+")
    base, card = base.strip(), card.strip() or None
    if not base:
        raise ProfileError(text, "", f"no base profile before '+' or ','; write {SPEC_SYNTAX}")
    if "+" in (card or ""):
        raise ProfileError(text, "", f"one card only after the base; write {SPEC_SYNTAX}")
    values: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = (s.strip() for s in pair.partition("="))
        if not eq or not key or not value:
            raise ProfileError(text, key or pair, f"expected key=value, got {pair!r}; write "
                                                  f"{SPEC_SYNTAX}")
        if key not in OVERRIDE_KEYS:
            raise ProfileError(text, key, "unknown override; known: " + "; ".join(
                f"{k} ({why})" for k, why in OVERRIDE_KEYS.items()))
        if key in values:
            raise ProfileError(text, key, "given twice")
        values[key] = value
    if "gpu" in values:
        if card is not None and values["gpu"] != card:
            raise ProfileError(text, "gpu", f"two cards: +{card} and gpu={values['gpu']}")
        card = values["gpu"]
    if card is not None and card not in builtin_card_names():
        raise ProfileError(text, "gpu", f"unknown GPU card {card!r}; cards: "
                                        f"{', '.join(builtin_card_names())}")
    sizes: dict[str, int] = {}
    for key in ("ram", "nvme"):
        if key in values:
            try:
                sizes[key] = parse_bytes(values[key])
            except ValueError as e:
                raise ProfileError(text, key, str(e)) from None
            if sizes[key] <= 0:
                raise ProfileError(text, key, f"must be more than 0 bytes, got {values[key]!r}")
    drives = None
    if "drives" in values:
        try:
            drives = int(values["drives"])
        except ValueError:
            drives = 0
        if drives < 1:
            raise ProfileError(text, "drives", f"must be a whole number >= 1, got "
                                               f"{values['drives']!r}")
    return ProfileSpec(base=base, gpu=card, ram_bytes=sizes.get("ram"), drives=drives,
                       nvme_bytes=sizes.get("nvme"))


def build_variant(spec: ProfileSpec) -> HardwareProfile:
    """The base profile with the spec's card, RAM, drives and capacity; refused (ProfileError)
    where the platform cannot take them (host.ram_max, storage.drives_max)."""
    profile = load_profile(spec.base, gpu=spec.gpu)
    try:
        profile = profile.with_overrides(ram_bytes=spec.ram_bytes, nvme_drives=spec.drives,
                                         nvme_capacity_bytes=spec.nvme_bytes)
    except ValueError as e:
        raise ProfileError(spec.text(), "", f"{profile.name}: {e}") from None
    return dataclasses.replace(profile, name=spec.text(), sources=dict(profile.sources))


def resolve_profile(text: str) -> HardwareProfile:
    """A profile by built-in name, by path, or as a variant `BASE[+CARD][,key=value...]`."""
    if is_spec(text):
        return build_variant(parse_profile_spec(text))
    return load_profile(text)
