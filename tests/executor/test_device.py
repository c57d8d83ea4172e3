import pytest
import torch

from layerslide.executor.device import STREAM_LANES, LaneDevice
from layerslide.planner import sizes


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


@pytest.mark.gpu
def test_priming_makes_the_blas_workspaces_of_the_thread_and_of_autograd_once():
    device = LaneDevice("cuda")
    stream = device._streams["gpu"].cuda_stream

    def large_blocks() -> int:
        return sum(1 for s in torch.cuda.memory_snapshot() if s["stream"] == stream
                   for b in s["blocks"] if b["state"] == "active_allocated"
                   and b["size"] >= 2**20)

    before = large_blocks()
    device.prime_blas_workspaces("gpu")
    torch.cuda.synchronize()
    made = large_blocks() - before
    # this thread's handle and autograd's, each a workspace on the stream, as the plan has them
    # (on Hopper; sizes.BLAS_WORKSPACE_BYTES)
    assert made == sizes.BLAS_WORKSPACES
    device.prime_blas_workspaces("gpu")  # they stay: the next GEMMs take nothing more
    torch.cuda.synchronize()
    assert large_blocks() - before == made


def test_priming_does_nothing_on_the_cpu(monkeypatch):
    device = LaneDevice("cpu")

    def no_tensors(*args, **kwargs):
        raise AssertionError("the CPU has no cuBLAS workspaces to make")

    monkeypatch.setattr(torch, "ones", no_tensors)
    device.prime_blas_workspaces("gpu")
