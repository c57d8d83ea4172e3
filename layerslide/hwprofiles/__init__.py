"""Hardware as data: TOML hardware profiles (GPU, link, host, storage) in SI units, with sources."""

from .loader import ProfileError, builtin_profile_names, builtin_profiles, load_profile
from .profile import GPUSpec, HardwareProfile, HostSpec, LinkSpec, StorageSpec
from .units import parse_bytes

__all__ = [
    "GPUSpec",
    "HardwareProfile",
    "HostSpec",
    "LinkSpec",
    "ProfileError",
    "StorageSpec",
    "builtin_profile_names",
    "builtin_profiles",
    "load_profile",
    "parse_bytes",
]
