"""The head's chunked linear cross-entropy against PyTorch's materialised logits + autograd, and
the compiled decoder-layer call against the eager one."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from layerslide.executor.blocks import ModelBlocks
from layerslide.executor.compute import (
    IGNORE_INDEX,
    call_layer,
    chunked_linear_cross_entropy,
    layer_call,
)


@pytest.mark.parametrize("chunk_tokens", [1, 7, 16, 64])
def test_loss_and_grads_match_autograd(chunk_tokens):
    gen = torch.Generator().manual_seed(0)
    tokens, hidden, vocab = 40, 16, 50
    x = torch.randn(tokens, hidden, generator=gen, dtype=torch.float64)
    weight = torch.randn(vocab, hidden, generator=gen, dtype=torch.float64) * 0.3
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    labels[::5] = IGNORE_INDEX
    scale = torch.tensor(1.0 / 35 / 2, dtype=torch.float64)
    loss, d_x, d_weight = chunked_linear_cross_entropy(x, weight, labels, scale, chunk_tokens)

    x_ref, w_ref = x.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    ref = torch.nn.functional.cross_entropy(x_ref @ w_ref.T, labels, ignore_index=IGNORE_INDEX,
                                            reduction="sum")
    (ref * scale).backward()
    # the function forms the softmax in fp32 (as it does for bf16 inputs): fp32 tolerances
    torch.testing.assert_close(loss.double(), ref.detach(), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(d_x, x_ref.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(d_weight, w_ref.grad, rtol=1e-5, atol=1e-7)
    assert d_x[::5].abs().sum() == 0  # ignored tokens get no gradient


def _bound_layers(count: int):
    """`count` tiny Llama decoder layers, each bound to its own flat buffer (as cache units are)."""
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    blocks = ModelBlocks(config)
    layers = []
    for seed in range(count):
        with torch.device("meta"):
            layer = blocks.make_layer(0)
        blocks.bind(layer, 0, blocks.init_block(0, seed))
        layers.append(layer)
    return blocks, layers


def test_compiled_layer_call_matches_eager_and_serves_every_unit():
    # aot_eager: Dynamo's tracing and AOTAutograd's joint graph, the parts that meet our
    # rebound parameters, without Inductor's code generation (compile time on a CPU)
    torch._dynamo.reset()
    blocks, layers = _bound_layers(3)
    compiled = layer_call("compiled", torch.device("cpu"), backend="aot_eager")
    assert compiled is not call_layer
    rope = blocks.make_rotary(torch.device("cpu"))(torch.empty(1), torch.arange(8)[None])
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(0))
    for layer in layers:
        outputs, grads = [], []
        for fn in (call_layer, compiled):
            xi = x.clone().requires_grad_(True)
            y = fn(layer, xi, rope)
            y.square().sum().backward()
            outputs.append(y.detach())
            grads.append([xi.grad, *(p.grad.clone() for p in layer.parameters())])
            for p in layer.parameters():
                p.grad = None
        torch.testing.assert_close(outputs[1], outputs[0])
        for got, want in zip(grads[1], grads[0], strict=True):
            torch.testing.assert_close(got, want)
    # one graph for all three modules: guards are on shapes, not on which module it is
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_layer_call_runs_eager_where_inductor_would_only_cost_compile_time():
    assert layer_call("compiled", torch.device("cpu")) is call_layer
    assert layer_call("eager", torch.device("cpu")) is call_layer
    with pytest.raises(ValueError, match="choose one of compiled, eager"):
        layer_call("fast", torch.device("cpu"))


def test_embedding_rows_added_into_the_tied_grad_equal_the_dense_embedding_grad_added():
    """A tied model's embedding backward adds its rows into the head's [V, h] LM-weight grad
    instead of making a dense [V, h] embedding grad: the same bf16 values (torch.equal: the
    sign of a zero may differ in rows no id hits), repeated ids and the first and last rows
    included, and with fewer tokens than the vocabulary as with more."""
    from layerslide.executor.compute import add_embedding_grad

    gen = torch.Generator().manual_seed(5)
    for vocab, ids in ((50, torch.tensor([[0, 3, 3, 49, 7], [3, 0, 12, 49, 49]])),
                       (6, torch.randint(0, 6, (4, 64), generator=gen))):
        hidden = 8
        dgrad = torch.randn(*ids.shape, hidden, generator=gen).to(torch.bfloat16)
        head = torch.randn(vocab, hidden, generator=gen).to(torch.bfloat16)
        dense = torch.ops.aten.embedding_dense_backward(dgrad, ids, vocab, -1, False)
        got = add_embedding_grad(head.clone(), dgrad, ids)
        assert torch.equal(got, dense + head)
        untouched = [r for r in range(vocab) if r not in ids.unique().tolist()]
        assert torch.equal(got[untouched], head[untouched])
