"""Tests for the profile dataclasses: GEMM efficiency interpolation, overrides, to_dict."""

import dataclasses
import json

import pytest

from layerslide.hwprofiles import GPUSpec, load_profile


def _gpu(points, busy_speedup=None):
    return GPUSpec(
        name="test",
        memory_bytes=2**30,
        bf16_flops_per_s=1e12,
        hbm_bytes_per_s=1e12,
        matmul_efficiency=points,
        attention_forward_efficiency=points,
        attention_backward_efficiency=points,
        kernel_launch_s=1e-5,
        busy_speedup=busy_speedup,
    )


def test_busy_speedup_interpolates_linearly_and_clamps():
    gpu = _gpu(((4096, 0.7),), busy_speedup=((0.5, 1.2), (0.9, 1.04), (1.0, 1.0)))
    assert gpu.speedup_at_busy(0.0) == gpu.speedup_at_busy(0.5) == 1.2
    assert gpu.speedup_at_busy(0.7) == pytest.approx(1.12)
    assert gpu.speedup_at_busy(0.95) == pytest.approx(1.02)
    assert gpu.speedup_at_busy(1.0) == gpu.speedup_at_busy(1.3) == 1.0
    assert _gpu(((4096, 0.7),)).speedup_at_busy(0.3) == 1.0  # no table: the tables at any duty


@pytest.mark.parametrize("table", [(), ((0.9, 1.0), (0.5, 1.2)), ((0.5, 1.2), (1.5, 1.0)),
                                   ((0.5, 0.0), (1.0, 1.0))])
def test_busy_speedup_table_is_checked(table):
    with pytest.raises(ValueError, match="busy_speedup"):
        _gpu(((4096, 0.7),), busy_speedup=table)


def test_matmul_efficiency_interpolates_in_log2_and_clamps():
    gpu = _gpu(((512, 0.4), (2048, 0.6), (8192, 0.8)))
    assert gpu.matmul_efficiency_at(1) == 0.4
    assert gpu.matmul_efficiency_at(512) == 0.4
    assert gpu.matmul_efficiency_at(1024) == pytest.approx(0.5)  # halfway in log2
    assert gpu.matmul_efficiency_at(2048) == pytest.approx(0.6)
    assert gpu.matmul_efficiency_at(4096) == pytest.approx(0.7)
    assert gpu.matmul_efficiency_at(8192) == pytest.approx(0.8)
    assert gpu.matmul_efficiency_at(10**7) == 0.8
    assert 0.4 < gpu.matmul_efficiency_at(700) < 0.5


def test_matmul_efficiency_single_point_and_bad_tokens():
    gpu = _gpu(((4096, 0.7),))
    assert gpu.matmul_efficiency_at(10) == gpu.matmul_efficiency_at(10**6) == 0.7
    with pytest.raises(ValueError):
        gpu.matmul_efficiency_at(0)


def test_matmul_efficiency_table_must_be_sorted():
    with pytest.raises(ValueError, match="increasing"):
        _gpu(((2048, 0.6), (512, 0.4)))
    with pytest.raises(ValueError):
        _gpu(())


def test_h200_efficiency_curve():
    gpu = load_profile("h200-bench").gpu
    assert gpu.matmul_efficiency_at(8192) == pytest.approx(0.69)
    assert gpu.matmul_efficiency_at(10**6) == pytest.approx(0.68)
    assert gpu.matmul_efficiency_at(64) == pytest.approx(0.31)
    at = gpu.matmul_efficiency_at
    assert at(512) < at(1536) < at(2048)
    attention = gpu.attention_efficiency_at
    assert attention(1024, backward=False) == pytest.approx(0.21)
    assert attention(4096, backward=True) == pytest.approx(0.08 + (0.37 - 0.08) * 2 / 3)  # log2


def test_with_overrides_returns_a_copy_and_records_the_source():
    base = load_profile("h200-bench")
    over = base.with_overrides(gpu_memory_bytes=24 * 2**30, ram_bytes=256 * 10**9)
    assert over.gpu.memory_bytes == 24 * 2**30
    assert over.host.ram_bytes == 256 * 10**9
    assert over.storage.capacity_bytes == base.storage.capacity_bytes
    assert over.sources["gpu.memory"] == "override"
    assert over.sources["host.ram"] == "override"
    assert over.sources["storage.capacity"] == base.sources["storage.capacity"]
    # The original is untouched.
    assert base.gpu.memory_bytes == 139 * 2**30
    assert base.sources["gpu.memory"].startswith("measured")
    nvme = base.with_overrides(nvme_capacity_bytes=2 * 10**12)
    assert nvme.storage.capacity_bytes == 2 * 10**12
    assert nvme.sources["storage.capacity"] == "override"
    assert base.with_overrides() == base


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "24GiB"])
def test_with_overrides_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="ram_bytes"):
        load_profile("h200-bench").with_overrides(ram_bytes=bad)


def test_profile_is_frozen_and_hashable():
    p = load_profile("h200-bench")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.sources["gpu.memory"] = "x"  # type: ignore[index]
    assert hash(p) == hash(load_profile("h200-bench"))


def test_to_dict_is_json_and_si():
    p = load_profile("h200-bench")
    d = json.loads(json.dumps(p.to_dict()))
    assert d["name"] == "h200-bench"
    assert d["gpu"]["memory_bytes"] == 139 * 2**30
    assert d["link"]["h2d_bytes_per_s"] == pytest.approx(55.4e9)
    assert d["host"]["adamw_params_per_s"] == pytest.approx(4.751e9)
    assert d["host"]["adamw_call_s"] == pytest.approx(2.28e-3)
    assert d["gpu"]["matmul_efficiency"][0] == [512, 0.31]
    assert d["sources"]["link.h2d"].startswith("measured")
    assert d["path"].endswith("h200-bench.toml")


def test_profiles_pickle_for_worker_processes():
    import pickle

    from layerslide.hwprofiles import load_profile

    profile = load_profile("h200-bench")
    copy = pickle.loads(pickle.dumps(profile))
    assert copy == profile
    assert dict(copy.sources) == dict(profile.sources)


def test_several_drives_stripe_as_one_with_their_rates_and_room_added():
    base = load_profile("h200-bench")
    four = base.with_overrides(nvme_drives=4)
    assert four.storage.drives == 4 and four.sources["storage.drives"] == "override"
    assert four.storage.read_bytes_per_s == base.storage.read_bytes_per_s  # each drive's own
    assert four.storage.total_capacity_bytes == 4 * base.storage.capacity_bytes
    striped = four.storage.striped()
    assert striped.drives == 1
    assert striped.read_bytes_per_s == pytest.approx(4 * base.storage.read_bytes_per_s)
    assert striped.write_bytes_per_s == pytest.approx(4 * base.storage.write_bytes_per_s)
    assert striped.duplex_bytes_per_s == pytest.approx(4 * base.storage.duplex_bytes_per_s)
    assert striped.read_share == base.storage.read_share
    # a capacity override is all the drives' together
    sized = base.with_overrides(nvme_drives=4, nvme_capacity_bytes=8 * 10**12)
    assert sized.storage.capacity_bytes == 2 * 10**12
    assert sized.storage.total_capacity_bytes == 8 * 10**12
    with pytest.raises(ValueError, match="nvme_drives must be a positive whole number of drives"):
        base.with_overrides(nvme_drives=0)
    with pytest.raises(ValueError, match="drives must be a whole number"):
        dataclasses.replace(base.storage, drives=1.5)


def test_an_adamw_rate_carries_the_host_memory_and_compact_rates_with_it():
    base = load_profile("h200-bench")
    faster = base.with_adamw_rate(2 * base.host.adamw_params_per_s, "a test")
    assert faster.host.memory_bytes_per_s == 2 * base.host.memory_bytes_per_s
    assert faster.host.adamw_int8_params_per_s == 2 * base.host.adamw_int8_params_per_s
    assert faster.host.adamw_call_s == base.host.adamw_call_s  # a call's fixed part stays
    assert faster.sources["host.adamw_throughput"] == (
        f"{base.sources['host.adamw_throughput']}; then a test")  # what it was, then the change
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="positive number"):
            base.with_adamw_rate(bad, "a test")
