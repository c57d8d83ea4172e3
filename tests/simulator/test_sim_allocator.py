"""The caching allocator's model: rounding, best fit that leaves the mapped end for last, growth
by whole pages onto a free end, splitting and merging."""

import pytest

from layerslide.simulator.allocator import (
    LARGE_PAGE_BYTES,
    MIB,
    SMALL_PAGE_BYTES,
    CachingAllocatorModel,
    ExpandableSegment,
    round_request,
)


def large_segment() -> ExpandableSegment:
    return ExpandableSegment(page_bytes=LARGE_PAGE_BYTES, min_split_bytes=511)


def test_requests_round_up_to_512_bytes():
    assert round_request(0) == 512
    assert round_request(1) == 512
    assert round_request(512) == 512
    assert round_request(513) == 1024
    with pytest.raises(ValueError, match=">= 0"):
        round_request(-1)


def test_a_segment_grows_by_whole_pages_and_reuses_its_free_end():
    seg = large_segment()
    assert seg.allocate(30 * MIB) == 0
    assert seg.mapped_bytes == 40 * MIB  # two 20 MiB pages, 10 MiB free at the end
    assert seg.allocate(10 * MIB) == 30 * MIB  # fits the free end: no growth
    assert seg.mapped_bytes == 40 * MIB
    assert seg.allocate(15 * MIB) == 40 * MIB
    assert seg.mapped_bytes == 60 * MIB


def test_growth_takes_the_free_end_and_maps_only_what_is_missing():
    seg = large_segment()
    seg.allocate(30 * MIB)  # 10 MiB free at the end
    seg.allocate(25 * MIB)  # needs 15 more: one page
    assert seg.mapped_bytes == 60 * MIB


def test_best_fit_leaves_the_free_end_for_last():
    seg = large_segment()
    a = seg.allocate(100 * MIB)
    seg.allocate(40 * MIB)
    seg.allocate(10 * MIB)  # 150 MiB in use of 160 mapped: 10 MiB free at the end
    seg.free(a)  # a 100 MiB hole at the start
    # 8 MiB fits both; the end could grow, so the hole is taken first, and split
    assert seg.allocate(8 * MIB) == 0
    assert seg.allocate(8 * MIB) == 8 * MIB
    assert seg.mapped_bytes == 160 * MIB


def test_a_hole_too_small_for_a_request_stays_mapped_beside_new_pages():
    # the fragmentation that made the reserve outgrow the allocated peak on the H200
    seg = large_segment()
    a = seg.allocate(60 * MIB)
    seg.allocate(20 * MIB)
    seg.free(a)
    seg.allocate(70 * MIB)  # the 60 MiB hole does not hold it
    assert seg.mapped_bytes == 160 * MIB  # 80 + 70 rounded up to 80


def test_frees_merge_with_free_neighbours():
    seg = large_segment()
    a, b, c = (seg.allocate(20 * MIB) for _ in range(3))
    seg.free(a)
    seg.free(c)
    seg.free(b)  # all three merge into one free 60 MiB block
    assert len(seg.blocks) == 1 and seg.blocks[0].free and seg.blocks[0].size == 60 * MIB
    assert seg.allocate(60 * MIB) == 0
    assert seg.mapped_bytes == 60 * MIB


def test_any_rest_of_512_bytes_or_more_is_split_off():
    seg = large_segment()
    a = seg.allocate(20 * MIB)
    seg.allocate(20 * MIB)
    seg.free(a)
    seg.allocate(20 * MIB - 512)  # with expandable segments torch splits off even 512 bytes
    assert [(b.size, b.free) for b in seg.blocks] == [
        (20 * MIB - 512, False), (512, True), (20 * MIB, False)]
    rest_too_small = ExpandableSegment(page_bytes=LARGE_PAGE_BYTES, min_split_bytes=MIB)
    rest_too_small.allocate(20 * MIB - 512)  # a 1 MiB threshold keeps the rest in the block
    assert [(b.size, b.free) for b in rest_too_small.blocks] == [(20 * MIB, False)]


def test_equal_free_blocks_go_lowest_address_first():
    seg = large_segment()
    a, _, c, _ = (seg.allocate(20 * MIB) for _ in range(4))
    seg.free(c)
    seg.free(a)
    assert seg.allocate(20 * MIB) == a


def test_the_small_pool_splits_its_2_mib_pages():
    model = CachingAllocatorModel()
    for i in range(4):
        model.allocate("gpu", i, 512 * 1024)  # four 0.5 MiB blocks share one 2 MiB page
    assert model.reserved_bytes() == {"gpu": SMALL_PAGE_BYTES}
    model.allocate("gpu", "fifth", 512)
    assert model.reserved_bytes() == {"gpu": 2 * SMALL_PAGE_BYTES}


def test_freeing_what_is_not_allocated_says_so():
    seg = large_segment()
    with pytest.raises(ValueError, match="no allocated block"):
        seg.free(0)
    model = CachingAllocatorModel()
    with pytest.raises(ValueError, match="not allocated"):
        model.free("x")
    model.allocate("gpu", "x", MIB)
    with pytest.raises(ValueError, match="already allocated"):
        model.allocate("gpu", "x", MIB)


def test_pools_and_size_classes_keep_their_own_pages():
    model = CachingAllocatorModel()
    model.allocate("gpu", "small", MIB)  # up to 1 MiB: the small-block pool, 2 MiB pages
    model.allocate("gpu", "large", MIB + 1)
    model.allocate("h2d", "other", 5 * MIB)
    assert model.reserved_bytes() == {"gpu": SMALL_PAGE_BYTES + LARGE_PAGE_BYTES,
                                      "h2d": LARGE_PAGE_BYTES}
    model.free("large")
    model.allocate("h2d", "again", 18 * MIB)  # the 20 MiB block freed on gpu is not h2d's
    assert model.reserved_bytes()["h2d"] == 2 * LARGE_PAGE_BYTES
    model.allocate("gpu", "reuse", 20 * MIB)  # gpu's own freed pages are
    assert model.reserved_bytes()["gpu"] == SMALL_PAGE_BYTES + LARGE_PAGE_BYTES
