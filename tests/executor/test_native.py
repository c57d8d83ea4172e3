"""The native one-pass AdamW and cast against torch's fused AdamW and tensor cast."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from layerslide.executor.native import load_kernels
from layerslide.planner.settings import ExecutorKnobs

KERNELS = load_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None, reason="no C compiler for the native kernels")


@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float32])
def test_adamw_matches_torch_fused_adamw_to_float_rounding(grad_dtype):
    n, decay_end, wd, scale = 100_003, 60_000, 0.1, 0.7
    gen = torch.Generator().manual_seed(0)
    param = torch.randn(n, generator=gen)
    exp_avg, exp_avg_sq = torch.zeros(n), torch.zeros(n)
    reference = param.clone()
    groups = [torch.nn.Parameter(reference[:decay_end]), torch.nn.Parameter(reference[decay_end:])]
    opt = torch.optim.AdamW([{"params": [groups[0]], "weight_decay": wd},
                             {"params": [groups[1]], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
    weights = torch.empty(n, dtype=torch.bfloat16)
    for step in range(1, 5):
        grad = torch.randn(n, generator=gen).to(grad_dtype)
        lr = 1e-3 * step
        KERNELS.adamw_step(param=param, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq, grad=grad,
                           weights_out=weights, decay_end=decay_end, lr=lr, beta1=0.9,
                           beta2=0.95, eps=1e-8, weight_decay=wd, grad_scale=scale, step=step)
        scaled = grad.float() * scale
        groups[0].grad, groups[1].grad = scaled[:decay_end], scaled[decay_end:]
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
    torch.testing.assert_close(param, reference, rtol=1e-5, atol=1e-6)
    assert not torch.equal(param, torch.randn(n, generator=torch.Generator().manual_seed(0)))
    state = opt.state[groups[0]]
    torch.testing.assert_close(exp_avg[:decay_end], state["exp_avg"], rtol=1e-5, atol=1e-7)
    assert torch.equal(weights, param.to(torch.bfloat16))  # the bf16 copy is of the new weights


def test_without_weights_out_nothing_else_is_written():
    n = 1000
    param, m, v = torch.ones(n), torch.zeros(n), torch.zeros(n)
    KERNELS.adamw_step(param=param, exp_avg=m, exp_avg_sq=v, grad=torch.ones(n), weights_out=None,
                       decay_end=0, lr=0.1, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.5,
                       grad_scale=1.0, step=1)
    # step 1 moves every element by lr * m_hat / (sqrt(v_hat) + eps) = lr (grads all 1)
    torch.testing.assert_close(param, torch.full((n,), 0.9), rtol=0, atol=1e-6)


def test_cast_rounds_like_torch_including_specials():
    values = torch.randn(1 << 16, generator=torch.Generator().manual_seed(1)) * 1e3
    values[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    values[4] = 1.0 + 2**-8  # a tie: rounds to even
    out = torch.empty(values.numel(), dtype=torch.bfloat16)
    KERNELS.cast(values, out)
    expected = values.to(torch.bfloat16)
    assert torch.isnan(out[0])
    assert torch.equal(out[1:], expected[1:])


@pytest.mark.parametrize(("threads", "chunk"), [(0, 0), (3, 7)])
def test_accumulating_bf16_grads_gives_torchs_fp32_sum_bit_for_bit(threads, chunk):
    from layerslide.executor.native import NativeKernels
    kernels = NativeKernels(KERNELS._lib, threads=threads, chunk=chunk)
    gen = torch.Generator().manual_seed(3)
    micro = [(torch.randn(10_001, generator=gen) * 10 ** i).to(torch.bfloat16) for i in range(4)]
    micro[1][:3] = torch.tensor([float("inf"), -0.0, 1e-40])  # specials and a subnormal
    total, expected = torch.full((10_001,), 7.0), torch.empty(10_001)
    for i, grads in enumerate(micro):
        kernels.accumulate(total, grads, first=i == 0)
        if i == 0:
            expected.copy_(grads)
        else:
            expected.add_(grads)
    assert torch.equal(total, expected)
    with pytest.raises(ValueError, match="fp32 sum and bf16 grads"):
        kernels.accumulate(total, micro[0].float(), first=False)


def one_step(kernels, start: torch.Tensor, grad: torch.Tensor, *, in_place: bool,
             decay_end: int) -> tuple[torch.Tensor, ...]:
    """(param, m, v, bf16 weights) after one AdamW step from `start`; in_place: the weights
    are written over (a copy of) the grads, as the executor lands them in the upload copy."""
    n = start.numel()
    param, m, v = start.clone(), torch.zeros(n), torch.zeros(n)
    grad = grad.clone()
    weights = grad if in_place else torch.empty(n, dtype=torch.bfloat16)
    kernels.adamw_step(param=param, exp_avg=m, exp_avg_sq=v, grad=grad, weights_out=weights,
                       decay_end=decay_end, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8,
                       weight_decay=0.1, grad_scale=0.5, step=1)
    return param, m, v, weights


@pytest.mark.parametrize(("threads", "chunk"), [(1, 0), (2, 0), (2, 1000), (3, 7), (0, 1 << 20)])
def test_every_split_over_threads_gives_the_same_update_and_cast(threads, chunk):
    """How a call is cut into chunks and spread over threads must not change a single bit,
    including a last chunk shorter than the others and the decay boundary inside a chunk."""
    from layerslide.executor.native import load_kernels as load

    split = load(threads=threads, chunk=chunk)
    n, decay_end = 10_007, 4_321
    gen = torch.Generator().manual_seed(2)
    start = torch.randn(n, generator=gen)
    grad = torch.randn(n, generator=gen).to(torch.bfloat16)
    results = []
    for kernels in (KERNELS, split):
        cast = torch.empty(n, dtype=torch.bfloat16)
        kernels.cast(start, cast)
        results.append((*one_step(kernels, start, grad, in_place=False, decay_end=decay_end),
                        cast))
    for reference, got in zip(*results, strict=True):
        assert torch.equal(reference, got)
    assert not torch.equal(results[0][0], start)  # the step did move the weights


def test_bad_thread_settings_say_what_to_change(monkeypatch):
    from layerslide.executor.native import load_kernels as load

    with pytest.raises(ValueError, match="must be >= 0"):
        load(threads=-1)


def test_the_environment_sets_the_knobs_a_plan_records(monkeypatch):
    """LAYERSLIDE_CPU_THREADS / _CPU_CHUNK / _LANE_SWITCH_INTERVAL_S set the plan's executor
    knobs at the command line; the kernels then take them from the plan, not the environment."""
    from layerslide.executor.native import DEFAULT_CHUNK
    from layerslide.executor.native import load_kernels as load
    from layerslide.planner.settings import Policy

    assert ExecutorKnobs().cpu_chunk_elements == DEFAULT_CHUNK
    monkeypatch.setenv("LAYERSLIDE_CPU_CHUNK", "lots")
    with pytest.raises(ValueError, match="LAYERSLIDE_CPU_CHUNK='lots': must be a whole number"):
        ExecutorKnobs.from_env()
    monkeypatch.setenv("LAYERSLIDE_CPU_CHUNK", "4096")
    monkeypatch.setenv("LAYERSLIDE_CPU_THREADS", "2")
    monkeypatch.setenv("LAYERSLIDE_LANE_SWITCH_INTERVAL_S", "0.001")
    knobs = ExecutorKnobs.from_env()
    assert (knobs.cpu_threads, knobs.cpu_chunk_elements, knobs.lane_switch_interval_s) == (
        2, 4096, 0.001)
    assert Policy.from_dict(Policy(executor=knobs).to_dict()).executor == knobs
    kernels = load()  # the environment alone changes nothing here
    assert (kernels.threads, kernels.chunk) == (0, DEFAULT_CHUNK)
    with pytest.raises(ValueError, match="cpu_threads"):
        ExecutorKnobs(cpu_threads=-1)


@pytest.mark.parametrize("chunk", [0, 1000])
def test_weights_written_over_the_grads_they_were_computed_from_are_the_same(chunk):
    """The executor lands a block's grads in its bf16 upload copy and the step writes the new
    weights over them: each element is read before it is written, so the result must equal
    the step with separate buffers, bit for bit."""
    from layerslide.executor.native import load_kernels as load

    kernels = load(threads=2, chunk=chunk)
    n = 10_007
    gen = torch.Generator().manual_seed(3)
    start = torch.randn(n, generator=gen)
    grad = torch.randn(n, generator=gen).to(torch.bfloat16)
    results = [one_step(kernels, start, grad, in_place=in_place, decay_end=n // 2)
               for in_place in (False, True)]
    for separate, in_place in zip(*results, strict=True):
        assert torch.equal(separate, in_place)
    assert not torch.equal(results[1][3], grad)  # the grads were overwritten by the weights


def test_a_chunk_larger_than_an_even_share_is_cut_to_it():
    """A block smaller than threads x chunk must still reach every thread."""
    from layerslide.executor.native import load_kernels as load

    assert load(threads=16, chunk=1 << 20).chunk_elements(100_000_000) == 1 << 20
    assert load(threads=16, chunk=1 << 20).chunk_elements(15_000_000) == 937_500  # 16 chunks
    assert load(threads=4, chunk=0).chunk_elements(10) == 3  # the even split
    assert load(threads=4, chunk=1000).chunk_elements(0) == 1  # never 0


WORKER_NICE_SCRIPT = """
import os, threading, torch
from layerslide.executor.native import load_kernels
kernels = load_kernels(threads=2, chunk=1024, nice=7)
src = torch.randn(1 << 16)
kernels.cast(src, torch.empty(src.shape, dtype=torch.bfloat16))
nice = {int(t): int(open(f"/proc/self/task/{t}/stat").read().rsplit(")", 1)[1].split()[16])
        for t in os.listdir("/proc/self/task")}
print(nice[threading.get_native_id()], *sorted(set(nice.values())))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="per-thread niceness: Linux")
def test_the_kernels_workers_take_the_plans_niceness_and_the_caller_keeps_its_own():
    """cpu_nice lowers the OpenMP workers' priority, not the lane thread that calls the kernel
    (it launches GPU work and hands the GIL on). In a child: niceness cannot be lowered back."""
    import subprocess
    import sys

    ran = subprocess.run([sys.executable, "-c", WORKER_NICE_SCRIPT], capture_output=True,
                         text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    caller, *seen = (int(word) for word in ran.stdout.split())
    assert caller == 0
    assert 7 in seen  # the worker's


def test_a_niceness_beyond_linuxs_range_says_what_to_change():

    with pytest.raises(ValueError, match="cpu_nice.*0..19"):
        ExecutorKnobs(cpu_nice=20)
    assert ExecutorKnobs.env_settings({"LAYERSLIDE_CPU_NICE": "10"}) == {"cpu_nice": 10}

