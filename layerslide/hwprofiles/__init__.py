"""Hardware as data: TOML hardware profiles (GPU, link, host, storage, and where a host holds
several GPUs or meets others, their interconnect and network) in SI units, with sources."""

from .fabric import InterconnectSpec, NetworkSpec
from .loader import (
    ProfileError,
    builtin_card_names,
    builtin_one_gpu_profiles,
    builtin_profile_names,
    builtin_profiles,
    builtin_several_gpu_profiles,
    load_profile,
)
from .profile import GPUSpec, HardwareProfile, HostSpec, LinkSpec, Price, Prices, StorageSpec
from .units import parse_bytes
from .variants import ProfileSpec, build_variant, parse_profile_spec, resolve_profile

__all__ = [
    "GPUSpec",
    "HardwareProfile",
    "HostSpec",
    "InterconnectSpec",
    "LinkSpec",
    "NetworkSpec",
    "Price",
    "Prices",
    "ProfileError",
    "ProfileSpec",
    "StorageSpec",
    "build_variant",
    "builtin_card_names",
    "builtin_one_gpu_profiles",
    "builtin_profile_names",
    "builtin_profiles",
    "builtin_several_gpu_profiles",
    "load_profile",
    "parse_bytes",
    "parse_profile_spec",
    "resolve_profile",
]
