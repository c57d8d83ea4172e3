"""The head's chunked linear cross-entropy against PyTorch's materialised logits + autograd."""

from __future__ import annotations

import pytest
import torch

from layerslide.executor.compute import IGNORE_INDEX, chunked_linear_cross_entropy


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
