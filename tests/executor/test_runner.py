import torch

from layerslide.executor.device import LaneDevice
from layerslide.executor.runner import checkpoint_views


def test_the_layers_checkpoints_are_views_of_one_buffer_without_rounding():
    # 28 checkpoints of 48 MiB would take 64 MiB each from torch's pinned allocator; one
    # buffer holds exactly 28 x 48 MiB (here: 5 x 7 elements)
    views = checkpoint_views(LaneDevice("cpu"), 5, 7, torch.bfloat16)
    assert sorted(views) == [0, 1, 2, 3, 4]
    base = views[0].untyped_storage().data_ptr()
    assert all(v.untyped_storage().data_ptr() == base for v in views.values())
    assert views[0].untyped_storage().nbytes() == 5 * 7 * 2
    for i in range(5):  # disjoint, in layer order
        views[i].fill_(i)
    assert [int(views[i][0]) for i in range(5)] == [0, 1, 2, 3, 4]
    assert all(v.numel() == 7 and v.is_contiguous() for v in views.values())
