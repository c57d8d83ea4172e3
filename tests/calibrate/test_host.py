import torch

from layerslide.calibrate import host


def test_repeated_randn_fill_any_size_with_one_scaled_pattern():
    numel = 2 * host.PATTERN_NUMEL + 5  # not a whole number of patterns
    values = host.repeated_randn(numel, 1e-3, torch.bfloat16)
    assert values.shape == (numel,) and values.dtype == torch.bfloat16
    # a view of the repeated patterns: less than one pattern more storage than asked
    assert values.untyped_storage().nbytes() < (numel + host.PATTERN_NUMEL) * values.element_size()
    pattern = values[:host.PATTERN_NUMEL]
    assert torch.equal(values[host.PATTERN_NUMEL:2 * host.PATTERN_NUMEL], pattern)
    assert torch.equal(values[-5:], pattern[:5])
    assert 0.5e-3 < pattern.float().std().item() < 2e-3  # random at the scale asked
    assert host.repeated_randn(3).shape == (3,)  # smaller than one pattern
