"""Weight grads straight into an fp32 sum: the same grads as autograd's, summed without bf16
rounding, in place, eager and through AOTAutograd's functionalization."""

import pytest
import torch
from helpers import SEQ, tiny_config
from torch import nn

from layerslide.executor.blocks import ModelBlocks
from layerslide.executor.compute import call_layer
from layerslide.executor.grad_into_sum import (
    SUM_BUFFER,
    SumLinear,
    attach_sums,
    detach_sums,
    route_linears,
)


def test_a_routed_linear_without_a_sum_is_nn_linear():
    torch.manual_seed(0)
    plain = nn.Linear(8, 5)
    routed = nn.Linear(8, 5)
    routed.load_state_dict(plain.state_dict())
    route_linears(routed)
    assert type(routed) is SumLinear
    x = torch.randn(3, 8)
    plain(x).square().sum().backward()
    routed(x).square().sum().backward()
    assert torch.equal(plain.weight.grad, routed.weight.grad)
    assert torch.equal(plain.bias.grad, routed.bias.grad)


@pytest.mark.parametrize("bias", [False, True])
def test_a_routed_linear_adds_its_weight_grad_into_the_sum(bias):
    torch.manual_seed(0)
    layer = nn.Linear(16, 6, bias=bias).to(torch.bfloat16)
    route_linears(layer)
    total = torch.full((6, 16), 0.5)  # it adds to what is there
    expected = total.double().clone()
    for _ in range(4):  # micro-batches
        x = torch.randn(2, 5, 16, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(2, 5, 6, dtype=torch.bfloat16)
        layer._buffers[SUM_BUFFER] = total
        layer(x).backward(dy)
        del layer._buffers[SUM_BUFFER]
        assert layer.weight.grad is None  # the grad went into the sum, not into .grad
        expected += dy.double().reshape(-1, 6).T @ x.detach().double().reshape(-1, 16)
        # the input's grad is autograd's own
        assert torch.equal(x.grad, dy @ layer.weight)
        if bias:
            assert torch.allclose(layer.bias.grad.float(), dy.float().sum((0, 1)), atol=0.05)
            layer.bias.grad = None
    assert torch.allclose(total.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_decoder_layer_sums_its_grads_as_autograd_would(family, backend):
    check_layer_sums_against_autograd(family, "cpu", backend)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_compiled_decoder_layer_on_the_gpu_sums_its_grads_in_place(family):
    """Inductor calls the accumulation in place on the sum views (the bf16 -> fp32 GEMM)."""
    check_layer_sums_against_autograd(family, "cuda", "inductor")


def check_layer_sums_against_autograd(family: str, device: str, backend: str) -> None:
    """Each projection's slot of the block's flat sum gets the sum of autograd's weight grads
    (to bf16's rounding of those); norms and biases keep autograd's grads; the input's grad is
    autograd's (bit for bit in eager, to compilation's rounding otherwise)."""
    config = tiny_config(family)
    config._attn_implementation = "sdpa"
    blocks = ModelBlocks(config)
    dev = torch.device(device)
    torch.manual_seed(0)
    with dev:
        layer = blocks.make_layer(0).to(torch.bfloat16)
    flat = torch.randn(blocks.numel(0), dtype=torch.bfloat16, device=dev) * 0.1
    blocks.bind(layer, 0, flat)
    rope = blocks.make_rotary(dev)(flat[:1], torch.arange(SEQ, device=dev)[None])
    owned = dict(layer.named_parameters())
    reference = torch.zeros(blocks.numel(0), dtype=torch.float64, device=dev)
    total = torch.zeros(blocks.numel(0), device=dev)
    call = call_layer if backend == "eager" else torch.compile(call_layer, backend=backend)
    x0 = torch.randn(2, SEQ, config.hidden_size, dtype=torch.bfloat16, device=dev)
    for micro in range(3):
        dy = torch.randn_like(x0)
        x = x0.detach().requires_grad_(True)
        call_layer(layer, x, rope).backward(dy)  # plain autograd, before routing
        for slot, view in blocks.views(0, reference):
            view += owned[slot.local_name].grad.double()
            owned[slot.local_name].grad = None
        plain_dx = x.grad
        if micro == 0:
            route_linears(layer)
        attach_sums(layer, blocks, 0, total)
        x = x0.detach().requires_grad_(True)
        call(layer, x, rope).backward(dy)
        detach_sums(layer)
        assert not any(SUM_BUFFER in sub._buffers for sub in layer.modules())
        if backend == "eager":
            assert torch.equal(x.grad, plain_dx)
        else:
            assert torch.allclose(x.grad.float(), plain_dx.float(), rtol=5e-2,
                                  atol=5e-2 * float(plain_dx.abs().max()))
        for slot, view in blocks.views(0, total):
            grad = owned[slot.local_name].grad
            assert (grad is None) == slot.local_name.endswith("proj.weight"), slot.local_name
            if grad is not None:
                view += grad.float()
                owned[slot.local_name].grad = None
    expected = {slot.local_name: view for slot, view in blocks.views(0, reference)}
    for slot, view in blocks.views(0, total):
        # the reference rounds each micro-batch's grad to bf16 (8 bits): so much apart at most;
        # compiled, the norms' and biases' grads (autograd's in both) come from fused kernels
        # that round the layer's inner grads otherwise (a bias: a sum over few tokens)
        into = slot.local_name.endswith("proj.weight")
        tol = 2e-2 if into or backend == "eager" else 1e-1
        ref = expected[slot.local_name]
        assert torch.allclose(view.double(), ref, rtol=tol, atol=tol * float(ref.abs().max())), \
            slot.local_name
