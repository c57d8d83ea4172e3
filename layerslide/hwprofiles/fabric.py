"""How a host's GPUs reach each other and other hosts: the GPU interconnect and the network.

Both are optional parts of a profile: without an interconnect a profile holds one GPU, without a
network it is one host. Rates are per GPU (interconnect) or per network card (network), per
direction, in bytes/s; latencies are per step of a ring collective, in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

# nvlink: GPUs exchange over their own links (NVLink, through NVSwitch where there is one);
# pcie_p2p: GPU to GPU over PCIe, each GPU's host link carrying its sends and receives;
# host: no peer-to-peer (GeForce cards such as the RTX 4090): every byte goes down to host
# memory and up again, over each GPU's PCIe link both ways and through host memory.
INTERCONNECT_KINDS = ("nvlink", "pcie_p2p", "host")


@dataclass(frozen=True, kw_only=True)
class InterconnectSpec:
    """The GPUs of one host between themselves."""

    kind: str
    # each GPU's rate one way (a ring collective's bus bandwidth); None only for kind "host",
    # whose rate is then the GPU's host link's
    bandwidth_bytes_per_s: float | None = None
    latency_s: float = 0.0  # one step of a ring collective

    def __post_init__(self) -> None:
        if self.kind not in INTERCONNECT_KINDS:
            raise ValueError(f"interconnect kind {self.kind!r} is not one of "
                             f"{', '.join(INTERCONNECT_KINDS)}")
        if self.bandwidth_bytes_per_s is None and self.kind != "host":
            raise ValueError(f"an interconnect of kind {self.kind!r} needs its bandwidth (each "
                             "GPU's rate one way); only kind 'host' takes its host link's")


@dataclass(frozen=True, kw_only=True)
class NetworkSpec:
    """The hosts between themselves: `nics` network cards per host, each this rate one way."""

    bandwidth_bytes_per_s: float
    latency_s: float = 0.0  # one step of a ring collective between hosts
    nics: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.nics, bool) or not isinstance(self.nics, int) or self.nics < 1:
            raise ValueError(f"network nics must be a whole number >= 1, got {self.nics!r}")

    @property
    def host_bytes_per_s(self) -> float:
        """What the host's cards move together, one way."""
        return self.bandwidth_bytes_per_s * self.nics


# A run across hosts whose profile has no [network] is predicted on this one (and says so): one
# 100 Gbit/s card per host, a common cluster Ethernet; an assumption, not a measurement.
ASSUMED_NETWORK = NetworkSpec(bandwidth_bytes_per_s=100e9 / 8, latency_s=10e-6, nics=1)
