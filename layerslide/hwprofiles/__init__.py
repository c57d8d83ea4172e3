"""Hardware as data: TOML hardware profiles (GPU, link, host, storage) in SI units, with sources."""

from .loader import (
    ProfileError,
    builtin_card_names,
    builtin_profile_names,
    builtin_profiles,
    load_profile,
)
from .profile import GPUSpec, HardwareProfile, HostSpec, LinkSpec, Price, Prices, StorageSpec
from .units import parse_bytes
from .variants import ProfileSpec, build_variant, parse_profile_spec, resolve_profile

__all__ = [
    "GPUSpec",
    "HardwareProfile",
    "HostSpec",
    "LinkSpec",
    "Price",
    "Prices",
    "ProfileError",
    "ProfileSpec",
    "StorageSpec",
    "build_variant",
    "builtin_card_names",
    "builtin_profile_names",
    "builtin_profiles",
    "load_profile",
    "parse_bytes",
    "parse_profile_spec",
    "resolve_profile",
]
