"""Memory helpers: RSS, the sampler behind the trace's memory samples, freeing heap pages."""

from __future__ import annotations

import gc
import time

import torch

from layerslide.executor.device import LaneDevice
from layerslide.executor.memory import MemorySampler, host_rss_bytes, return_freed_heap


def test_rss_follows_a_large_allocation_and_its_release():
    # Large next to what else the process may free meanwhile (CI once saw RSS rise
    # by 38 MB for a 64 MiB block while earlier tests' memory went back).
    gc.collect()
    before = host_rss_bytes()
    block = torch.ones(512 * 2**20, dtype=torch.uint8)  # touched: 512 MiB resident
    assert host_rss_bytes() - before > 384 * 2**20
    del block
    return_freed_heap()  # no error where glibc is or is not there
    assert host_rss_bytes() > 0


def test_sampler_records_host_samples_and_their_peak_until_stopped():
    device = LaneDevice("cpu")
    sampler = MemorySampler(device)
    time.sleep(0.1)
    sampler.stop()
    count = len(sampler.samples)
    time.sleep(0.05)
    assert count >= 2 and len(sampler.samples) == count  # stopped means stopped
    assert {s.tier for s in sampler.samples} == {"host"}  # no GPU on the CPU device
    assert sampler.peak_host_bytes >= max(s.bytes_in_use for s in sampler.samples)
    device.close()
