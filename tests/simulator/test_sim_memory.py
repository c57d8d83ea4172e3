"""Memory peaks of small plans worked out by hand from planner/sizes.py and build.py, and the
infeasible results (Overflow) when a tier is too small."""

from __future__ import annotations

import pytest
from helpers import GIB, make_round_profile, make_tiny_model

from layerslide.planner import Policy, TrainSpec, build_plan, sizes
from layerslide.simulator import Overflow, simulate

TRAIN = TrainSpec(micro_batch=2, seq_len=16)  # 32 tokens per micro-batch

# Tiny model (hidden h=64, FFN f=128, 4 heads x 16 = q_dim 64, 2 KV heads x 16 = kv_dim 32,
# vocab V=256), T = 32 tokens:
LAYER_PARAMS = 36992  # 64*64 + 2*64*32 + 64*64 (attention) + 3*64*128 (FFN) + 2*64 (norms)
EMB_PARAMS = 256 * 64  # 16384
HEAD_PARAMS = 256 * 64 + 64  # LM head + final norm = 16448
TOTAL_PARAMS = 2 * LAYER_PARAMS + EMB_PARAMS + HEAD_PARAMS  # 106816
HIDDEN_BYTES = 2 * 64 * 32  # bf16 [T, h]: a checkpoint or a dgrad: 4096
FWD_WORKSPACE_BYTES = 2 * 3 * 128 * 32  # gate, up, act in bf16: 24576
# layer_activation_bytes_per_token: bf16 (3h + 3q_dim + 2kv_dim + 4f) = 960 elements = 1920 B,
# fp32 (2 norms + 4 heads) = 24 B: 1944 B/token.
BWD_WORKSPACE_BYTES = 1944 * 32 + FWD_WORKSPACE_BYTES  # 62208 + 24576 = 86784
# fused head: 1 GiB of bf16 logits allows 2**21 rows, so one chunk of all 32; its bf16 logits
# (overwritten by their grad) and fp32 row losses: (2*256 + 4)*32 = 16512 (the grad of the
# head's input is its dgrad buffer); and what the final norm keeps for its backward, 10 B per
# hidden element: 10*64*32 = 20480.
HEAD_WORKSPACE_BYTES = (2 * 256 + 4) * 32 + 10 * 64 * 32  # 36992

# the runtime estimate less cuBLAS's two 32 MiB workspaces, which the plan allocates itself
GPU_RUNTIME_BYTES = int(0.75 * GIB) - 64 * 2**20  # 738197504
BLAS_WORKSPACES_BYTES = 2 * 32 * 2**20  # the compute lane's first task makes both, keeps them
# Static GPU buffers (build.static_buffers), default window 2:
GPU_STATIC_BYTES = (
    GPU_RUNTIME_BYTES
    + 2 * 2 * LAYER_PARAMS  # two bf16 weight units of the window: 147968
    + 2 * EMB_PARAMS  # embedding bf16 weights: 32768
    + 2 * HEAD_PARAMS  # head bf16 weights: 32896
)  # = 738411136
# No bf16 grads are static: each block's backward (the head's is the head task) makes them and
# their offload frees them. The head's: 32896, a layer's: 73984 (the embedding's: 32768)
HEAD_GRAD_BYTES = 2 * HEAD_PARAMS
LAYER_GRAD_BYTES = 2 * LAYER_PARAMS
# Static host buffers with cast=cpu_once: runtime 2 GiB, fp32 master 4, moments 8, bf16 copy 2
# (the offloaded grads land in it: no landing buffers): 14 B/param
HOST_STATIC_BYTES = 2 * GIB + (4 + 8 + 2) * TOTAL_PARAMS  # 2147483648 + 1495424 = 2148979072
# activations on the host add one pinned checkpoint buffer per layer
HOST_STATIC_BYTES_HOST_ACTS = HOST_STATIC_BYTES + 2 * HIDDEN_BYTES  # 2148987264


@pytest.fixture(scope="module")
def gpu_acts():
    plan = build_plan(make_tiny_model(), TRAIN, Policy.of(activations="gpu", layer_kernels="eager"),
                      num_steps=3)
    return plan, simulate(plan, make_round_profile())


@pytest.fixture(scope="module")
def host_acts():
    plan = build_plan(make_tiny_model(), TRAIN, Policy.of(activations="host", cpu_optimizer="torch",
                                                     layer_kernels="eager"), num_steps=3)
    return plan, simulate(plan, make_round_profile())


def _first_peak_time_s(prediction, tier: str) -> float:
    peak = prediction.peak_bytes[tier]
    return next(m.time_s for m in prediction.trace.memory
                if m.tier == tier and m.bytes_in_use == peak)


def test_static_bytes_by_hand(gpu_acts):
    plan, _ = gpu_acts
    assert TOTAL_PARAMS == plan.model.total_params
    assert GPU_STATIC_BYTES == 738411136
    assert plan.static_bytes("gpu") == GPU_STATIC_BYTES
    assert plan.static_bytes("host") == HOST_STATIC_BYTES
    assert plan.static_bytes("nvme") == 0


def test_host_static_bytes_with_checkpoints_on_host(host_acts):
    plan, _ = host_acts
    assert plan.static_bytes("host") == HOST_STATIC_BYTES_HOST_ACTS


# Every block's bf16 grads wait on the GPU for the d2h lane: it takes ~33 us for the head's
# 32896 B and ~74 us for a layer's 73984 B, a backward ~7.5 us, so as the embedding's backward
# ends all four blocks' grads are alive (the head's still being offloaded).
ALL_GRADS_BYTES = HEAD_GRAD_BYTES + 2 * LAYER_GRAD_BYTES + 2 * EMB_PARAMS  # 213632


def test_gpu_peak_with_checkpoints_on_gpu(gpu_acts):
    # The GPU runs its sequence one task at a time. A task's scratch comes as it starts; what
    # it hands on (a backward's dgrad and grads, a forward's checkpoint) as it ends, when its
    # scratch is gone. Around the GPU tasks, besides the grads awaiting the d2h lane:
    #   forward L1: ckpt L0 + ckpt L1 + workspace            = 2*4096 + 24576       = 32768
    #   head:       2 ckpts + final hidden + its workspace   = 3*4096 + 36992       = 49280
    #   backward L1: both ckpts + head's dgrad + workspace   = 3*4096 + 86784       = 99072
    #   backward L0: ckpt L0 + L1's dgrad + workspace        = 2*4096 + 86784       = 94976
    # with the grads: the head's (made as it starts) at backward L1, 99072 + 32896 = 131968;
    # the head's and L1's at backward L0, 94976 + 32896 + 73984 = 201856; all four as the
    # embedding's backward ends, 213632, beside the dgrad it read, which the executor holds
    # until the task returns (its outputs come first): the peak. Plus cuBLAS's two workspaces,
    # which the first GPU task makes and keeps.
    assert ALL_GRADS_BYTES == 213632
    _plan, prediction = gpu_acts
    assert prediction.peak_bytes["gpu"] == (GPU_STATIC_BYTES + BLAS_WORKSPACES_BYTES
                                            + ALL_GRADS_BYTES + HIDDEN_BYTES) == 805737728
    events = {e.task_id: e for e in prediction.trace.events}
    assert _first_peak_time_s(prediction, "gpu") == events["s0.m0.backward.emb"].end_s
    # no host traffic for checkpoints: the host only sees grads and optimizer buffers
    assert not any(e.kind in ("offload_activation", "fetch_activation")
                   for e in prediction.trace.events)


def test_head_and_forward_sets_are_smaller(gpu_acts):
    """The head's set (82176 B: 2 ckpts, final hidden, its workspace with the final norm's
    saved tensors, and the head's grads; its dgrad comes as it ends) stays below the peak."""
    _plan, prediction = gpu_acts
    events = {e.task_id: e for e in prediction.trace.events}
    head = events["s0.m0.head.head"]
    at_head = [m.bytes_in_use for m in prediction.trace.memory
               if m.tier == "gpu" and head.start_s <= m.time_s < head.end_s]
    head_set = 3 * HIDDEN_BYTES + HEAD_WORKSPACE_BYTES + HEAD_GRAD_BYTES
    assert head_set == 82176 < prediction.peak_bytes["gpu"] - GPU_STATIC_BYTES
    assert max(at_head) == GPU_STATIC_BYTES + BLAS_WORKSPACES_BYTES + head_set


def test_host_peak_with_checkpoints_on_host(host_acts):
    # Offloaded bf16 grads land in their block's static bf16 upload copy, checkpoints in the
    # static per-layer checkpoint buffer: neither comes and goes. What does is the torch
    # optimizer's fp32 grad upcast (4 B/param, during the block's step), and the CPU runs one
    # step at a time. The d2h lane lands all grads of a step within ~0.4 ms, while each
    # optimizer step takes ~20-45 ms, so the CPU order (head, then emb, L0, L1 under deadline
    # order) decides:
    #   during s0 head step: fp32 head 4*16448  = 65792
    #   during s0 emb step:  fp32 emb 4*16384   = 65536
    #   during s0 L0 step:   fp32 L0 4*36992    = 147968 (first reached here)
    #   during s0 L1 step:   fp32 L1 4*36992    = 147968
    # (step 1's checkpoints, offloaded meanwhile, add nothing: their buffer is static)
    dynamic_peak = 4 * LAYER_PARAMS
    assert dynamic_peak == 147968
    _plan, prediction = host_acts
    assert prediction.peak_bytes["host"] == HOST_STATIC_BYTES_HOST_ACTS + dynamic_peak
    events = {e.task_id: e for e in prediction.trace.events}
    opt_l0 = events["s0.m0.optimizer_step.L0"]
    assert opt_l0.start_s <= _first_peak_time_s(prediction, "host") < opt_l0.end_s
    # GPU with offloaded checkpoints: as with them on the GPU, the peak is every block's grads
    # awaiting the d2h lane as the embedding's backward ends, beside the dgrad it read
    assert prediction.peak_bytes["gpu"] == (GPU_STATIC_BYTES + BLAS_WORKSPACES_BYTES
                                            + ALL_GRADS_BYTES + HIDDEN_BYTES)


def test_gpu_allocated_peak_is_torchs_count_without_the_runtime_estimate(gpu_acts):
    # what torch.cuda.max_memory_allocated counts: the plan's buffers without the CUDA context,
    # workspaces and allocator slack of the gpu.runtime buffer, each from its request until
    # the host drops it as its last user is enqueued. A block's grads drop out as their offload
    # is enqueued (record_stream holds the block for the copy, not the count), so the peak is
    # not the bytes in use (every block's grads awaiting the d2h lane) but layer 1's backward:
    # weight units 147968 + emb weights 32768 + head weights 32896 (213632), cuBLAS's
    # workspaces, its workspace, and the two checkpoints and the head's dgrad still to be read
    _plan, prediction = gpu_acts
    assert prediction.gpu_runtime_bytes == sizes.GPU_RUNTIME_BYTES == GPU_RUNTIME_BYTES
    assert prediction.gpu_allocated_peak_bytes == (213632 + BLAS_WORKSPACES_BYTES
                                                   + BWD_WORKSPACE_BYTES + 3 * HIDDEN_BYTES)
    in_use = prediction.peak_bytes["gpu"] - sizes.GPU_RUNTIME_BYTES
    assert in_use == 213632 + BLAS_WORKSPACES_BYTES + ALL_GRADS_BYTES + HIDDEN_BYTES == 67540224
    assert prediction.gpu_allocated_peak_bytes < in_use


def test_gpu_allocated_peak_of_a_plan_rejected_before_simulating_leaves_out_the_runtime(gpu_acts):
    plan, _ = gpu_acts
    rejected = simulate(plan, make_round_profile(), gpu_memory_bytes=GPU_STATIC_BYTES - 1)
    assert rejected.step_s is None
    assert rejected.gpu_allocated_peak_bytes == GPU_STATIC_BYTES - GPU_RUNTIME_BYTES


def test_gpu_cap_just_below_what_must_fit_is_an_overflow(gpu_acts):
    plan, prediction = gpu_acts
    peak = prediction.gpu_need_bytes
    capped = simulate(plan, make_round_profile(), gpu_memory_bytes=peak - 1)
    assert not capped.feasible
    assert capped.overflows == (Overflow(tier="gpu", need_bytes=peak, limit_bytes=peak - 1),)
    assert capped.limits_bytes["gpu"] == peak - 1
    assert capped.step_s == prediction.step_s  # it was simulated, then checked
    assert capped.trace is not None
    assert "gpu" in capped.reason
    fits = simulate(plan, make_round_profile(), gpu_memory_bytes=peak)
    assert fits.feasible and fits.overflows == ()


def test_gpu_cap_below_static_rejects_without_simulating(gpu_acts):
    plan, _ = gpu_acts
    cap = GPU_STATIC_BYTES - 1
    rejected = simulate(plan, make_round_profile(), gpu_memory_bytes=cap)
    assert not rejected.feasible
    assert rejected.step_s is None and rejected.trace is None
    assert rejected.tokens_per_s is None and rejected.bottleneck is None
    assert rejected.overflows == (Overflow(tier="gpu", need_bytes=GPU_STATIC_BYTES,
                                           limit_bytes=cap),)
    assert rejected.reason.startswith("gpu needs")
    assert rejected.tokens_per_step == 32


def test_small_host_is_a_host_overflow(host_acts):
    plan, prediction = host_acts
    peak = prediction.peak_bytes["host"]
    small = simulate(plan, make_round_profile(ram_bytes=peak - 1))
    assert small.overflows == (Overflow(tier="host", need_bytes=peak, limit_bytes=peak - 1),)
    assert small.step_s is not None
    tiny = simulate(plan, make_round_profile(ram_bytes=GIB))  # below the 2 GiB runtime
    assert tiny.trace is None
    assert tiny.overflows == (Overflow(tier="host", need_bytes=HOST_STATIC_BYTES_HOST_ACTS,
                                       limit_bytes=GIB),)
    assert "host" in tiny.reason


@pytest.mark.parametrize("activations", ["gpu", "host"])
def test_gpu_pools_are_the_lanes_that_allocate_and_add_up_to_at_least_the_tier_peak(activations):
    plan = build_plan(make_tiny_model(num_layers=2), TRAIN, Policy.of(activations=activations),
                      num_steps=3)
    pred = simulate(plan, make_round_profile())
    pools = pred.gpu_pool_peak_bytes
    assert pools["static"] == GPU_STATIC_BYTES
    if activations == "gpu":
        # every dynamic buffer is the GPU lane's: one pool, the tier's peak
        assert set(pools) == {"static", "gpu"}
        assert sum(pools.values()) == pred.peak_bytes["gpu"]
    else:
        # fetched checkpoints land on the h2d stream: its own pool, at least one checkpoint
        assert set(pools) == {"static", "gpu", "h2d"}
        assert pools["h2d"] >= HIDDEN_BYTES
        assert sum(pools.values()) >= pred.peak_bytes["gpu"]
    # the allocator reserves whole pages per pool: at least each pool's peak
    reserves = pred.gpu_pool_reserved_bytes
    assert set(reserves) == set(pools)
    assert reserves["static"] >= GPU_STATIC_BYTES - GPU_RUNTIME_BYTES
    assert all(reserves[p] >= pools[p] for p in pools if p != "static")
    # tiny buffers: each pool's requests fit whole 2 MiB pages of the small-block pool
    assert all(r % (2 * 2**20) == 0 for r in reserves.values())


def test_the_gpu_fits_only_if_every_stream_pool_as_the_allocator_reserves_it_fits():
    # checkpoints fetched on the h2d stream: their pool adds to the GPU stream's, though the
    # two peaks fall at different times; the allocator maps whole pages to each; a cap between
    # the tier's peak and that does not fit
    plan = build_plan(make_tiny_model(num_layers=2), TRAIN, Policy.of(activations="host"),
                      num_steps=3)
    pred = simulate(plan, make_round_profile())
    need = pred.gpu_reserved_bytes + GPU_RUNTIME_BYTES
    assert need == pred.gpu_need_bytes
    assert need >= sum(pred.gpu_pool_peak_bytes.values()) > pred.peak_bytes["gpu"]
    tight = simulate(plan, make_round_profile(), gpu_memory_bytes=need - 1)
    assert pred.feasible and not tight.feasible
    assert tight.overflows[0].tier == "gpu" and tight.overflows[0].need_bytes == need
    assert simulate(plan, make_round_profile(), gpu_memory_bytes=need).feasible
