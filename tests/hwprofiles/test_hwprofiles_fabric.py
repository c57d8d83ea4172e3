"""A profile's GPUs per host, how they share the host link, their interconnect and the network:
optional, read in SI units, refused with the file and the field named, written back."""

from pathlib import Path

import pytest

from layerslide.hwprofiles import ProfileError, load_profile
from layerslide.hwprofiles.fabric import InterconnectSpec, NetworkSpec
from layerslide.hwprofiles.writer import to_toml

ONE_GPU = """base = "h200-bench"
name = "box"
description = "a test box"
"""
TWO_GPUS = ONE_GPU + """
[host]
gpus = { value = 2, unit = "count", source = "two cards" }
gpus_per_link = { value = 2, unit = "count", source = "x8/x8" }

[interconnect]
kind = "pcie_p2p"
bandwidth = { value = 20, unit = "GB/s", source = "measured" }
latency = { value = 8, unit = "us", source = "assumption" }

[network]
bandwidth = { value = 400, unit = "Gbit/s", source = "datasheet" }
latency = { value = 10, unit = "us", source = "assumption" }
nics = { value = 4, unit = "count", source = "four cards" }
"""


def _load(tmp_path: Path, text: str):
    path = tmp_path / "box.toml"
    path.write_text(text)
    return load_profile(path)


def _rejected(tmp_path: Path, text: str) -> str:
    with pytest.raises(ProfileError) as info:
        _load(tmp_path, text)
    assert "box.toml" in str(info.value)
    return str(info.value)


def test_without_them_a_profile_is_one_gpu_of_one_host(tmp_path):
    p = _load(tmp_path, ONE_GPU)
    assert (p.host.gpus, p.host.gpus_per_link) == (1, 1)
    assert p.interconnect is None and p.network is None


def test_they_are_read_in_si_units_with_their_sources(tmp_path):
    p = _load(tmp_path, TWO_GPUS)
    assert (p.host.gpus, p.host.gpus_per_link) == (2, 2)
    assert p.interconnect == InterconnectSpec(kind="pcie_p2p", bandwidth_bytes_per_s=20e9,
                                              latency_s=pytest.approx(8e-6))
    assert p.network.bandwidth_bytes_per_s == pytest.approx(50e9)  # 400 Gbit/s
    assert p.network.host_bytes_per_s == pytest.approx(200e9)
    assert p.sources["interconnect.bandwidth"] == "measured"
    assert p.sources["network.nics"] == "four cards"


def test_they_are_written_back_as_they_were_read(tmp_path):
    p = _load(tmp_path, TWO_GPUS)
    again = _load(tmp_path, to_toml(p))
    assert (again.host, again.interconnect, again.network) == (p.host, p.interconnect,
                                                                p.network)
    assert "[interconnect]" not in to_toml(_load(tmp_path, ONE_GPU))


def test_a_host_of_several_gpus_needs_an_interconnect(tmp_path):
    text = TWO_GPUS.split("[interconnect]")[0]
    message = _rejected(tmp_path, text)
    assert "2 GPUs needs an [interconnect]" in message


def test_an_interconnect_kind_is_one_of_three(tmp_path):
    message = _rejected(tmp_path, TWO_GPUS.replace('"pcie_p2p"', '"infiniband"'))
    assert "interconnect" in message and "nvlink, pcie_p2p, host" in message


def test_only_a_host_staged_interconnect_may_leave_out_its_bandwidth(tmp_path):
    without = TWO_GPUS.replace(
        'bandwidth = { value = 20, unit = "GB/s", source = "measured" }\n', "")
    assert "needs its bandwidth" in _rejected(tmp_path, without)
    staged = _load(tmp_path, without.replace('"pcie_p2p"', '"host"'))
    assert staged.interconnect.bandwidth_bytes_per_s is None


def test_more_gpus_on_a_link_than_the_host_has_is_refused(tmp_path):
    text = TWO_GPUS.replace('gpus_per_link = { value = 2', 'gpus_per_link = { value = 3')
    assert "gpus_per_link must lie in 1..gpus=2" in _rejected(tmp_path, text)


def test_network_figures_take_their_units_kind(tmp_path):
    text = TWO_GPUS.replace('value = 400, unit = "Gbit/s"', 'value = 400, unit = "GB"')
    message = _rejected(tmp_path, text)
    assert "network.bandwidth.unit" in message and "bytes/s unit" in message


def test_network_cards_are_a_whole_count():
    with pytest.raises(ValueError, match="whole number >= 1"):
        NetworkSpec(bandwidth_bytes_per_s=1e9, nics=0)


def test_a_run_of_more_ranks_than_its_profile_holds_is_predicted_on_stated_assumptions():
    from layerslide.hwprofiles import resolve_profile

    one = resolve_profile("h200-bench")
    assert one.with_ranks(1, 1) == (one, [])
    two, assumed = one.with_ranks(2, 2)
    assert two.host.gpus == 2 and two.interconnect.kind == "host"
    assert two.network.bandwidth_bytes_per_s == 100e9 / 8
    assert assumed == ["no peer-to-peer between its GPUs (collectives through host memory)",
                       "a 100 Gbit/s network between hosts"]
    box = resolve_profile("h100-sxm-x8")
    assert box.with_ranks(4, 1) == (box, [])  # holds them: nothing assumed
