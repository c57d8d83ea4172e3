"""One rank's share of its host, and whether a profile can hold a plan's ranks.

Every rank runs the same plan at the same time, so the simulator runs one of them on its share
of what the host's `gpus` ranks divide between them: the cores (whole ones: each rank's threads
are its own), the memory bandwidth and with it the CPU kernels' rates, the NVMe drives' rates
(each rank reads and writes its own slices on them) and a host link that `gpus_per_link` GPUs
split. Its own GPU, its own PCIe link and its interconnect rate stay whole. Memory is compared
per host instead (predict.py: a rank's host and NVMe peaks times the ranks of a host).
"""

from __future__ import annotations

import dataclasses

from layerslide.hwprofiles import HardwareProfile


def check_ranks(profile: HardwareProfile, gpus: int, hosts: int) -> None:
    """Refuse, naming both numbers and what to change, a plan of `gpus` ranks per host and
    `hosts` hosts that the profile cannot hold."""
    held = profile.host.gpus
    if gpus > held:
        raise ValueError(f"the plan runs {gpus} GPUs per host but profile {profile.name} holds "
                         f"{held}: plan with --gpus {held} or fewer, or choose a profile of "
                         f"{gpus} or more GPUs")
    if gpus > profile.host.cores:
        raise ValueError(f"the plan runs {gpus} GPUs per host but profile {profile.name} has "
                         f"{profile.host.cores} cores: each rank needs a core of its own")
    if hosts > 1 and profile.network is None:
        raise ValueError(f"the plan runs on {hosts} hosts but profile {profile.name} has no "
                         "[network] between hosts: plan with --hosts 1, or give the profile a "
                         "[network] table (bandwidth per card, cards per host, latency)")


def rank_share(profile: HardwareProfile, gpus: int) -> HardwareProfile:
    """The profile as one of `gpus` ranks of its host sees it (the profile itself for one)."""
    if gpus == 1:
        return profile
    host, link = profile.host, profile.link
    cores = host.cores // gpus

    def part(rate: float | None) -> float | None:
        return None if rate is None else rate / gpus

    shared_host = dataclasses.replace(
        host, cores=cores, dispatch_cores=min(host.dispatch_cores, cores),
        memory_bytes_per_s=host.memory_bytes_per_s / gpus,
        adamw_params_per_s=host.adamw_params_per_s / gpus,
        adamw_bf16_params_per_s=part(host.adamw_bf16_params_per_s),
        adamw_int8_params_per_s=part(host.adamw_int8_params_per_s),
        cast_bytes_per_s=host.cast_bytes_per_s / gpus)
    split = min(host.gpus_per_link, gpus)  # the ranks that share one link
    shared_link = dataclasses.replace(
        link, h2d_bytes_per_s=link.h2d_bytes_per_s / split,
        d2h_bytes_per_s=link.d2h_bytes_per_s / split,
        duplex_bytes_per_s=link.duplex_bytes_per_s / split,
        h2d_pageable_bytes_per_s=link.h2d_pageable_bytes_per_s / split)
    storage = profile.storage
    shared_storage = dataclasses.replace(
        storage, read_bytes_per_s=storage.read_bytes_per_s / gpus,
        write_bytes_per_s=storage.write_bytes_per_s / gpus,
        duplex_bytes_per_s=part(storage.duplex_bytes_per_s))
    return dataclasses.replace(profile, name=f"{profile.name} (one of {gpus} ranks)",
                               host=shared_host, link=shared_link, storage=shared_storage,
                               sources=dict(profile.sources))
