import torch

from layerslide.executor.device import LaneDevice
from layerslide.executor.runner import checkpoint_views


def test_the_layers_checkpoints_are_views_of_one_buffer_without_rounding():
    # 28 checkpoints of 48 MiB would take 64 MiB each from torch's pinned allocator; one
    # buffer holds exactly 28 x 48 MiB (here: 5 layers x 2 copies x 7 elements)
    views = checkpoint_views(LaneDevice("cpu"), 5, 2, 7, torch.bfloat16)
    assert sorted(views) == [(i, c) for i in range(5) for c in range(2)]
    base = views[(0, 0)].untyped_storage().data_ptr()
    assert all(v.untyped_storage().data_ptr() == base for v in views.values())
    assert views[(0, 0)].untyped_storage().nbytes() == 5 * 2 * 7 * 2
    for n, key in enumerate(sorted(views)):  # disjoint, in (layer, copy) order
        views[key].fill_(n)
    assert [int(views[key][0]) for key in sorted(views)] == list(range(10))
    assert all(v.numel() == 7 and v.is_contiguous() for v in views.values())
