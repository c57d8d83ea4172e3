import pytest
import torch

from layerslide.executor.device import STREAM_LANES, LaneDevice


def test_on_the_cpu_no_lane_has_a_stream():
    assert LaneDevice("cpu").lane_of_stream() == {}


@pytest.mark.gpu
def test_each_lane_is_named_by_the_stream_memory_snapshots_report():
    device = LaneDevice("cuda")
    with device.on("h2d"):
        block = torch.empty(2**20, device=device.device)
    lanes = device.lane_of_stream()
    assert sorted(lanes.values()) == sorted(STREAM_LANES)
    owner = next(s["stream"] for s in torch.cuda.memory_snapshot()
                 if s["address"] <= block.data_ptr() < s["address"] + s["total_size"])
    assert lanes[owner] == "h2d"
