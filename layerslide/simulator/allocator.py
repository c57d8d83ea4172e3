"""What the framework's caching GPU allocator reserves for a sequence of allocations and frees.

The executor runs PyTorch's CUDA caching allocator with expandable segments. Per stream and size
class it keeps one virtual address range, maps physical pages onto its end as it grows and never
unmaps them while training (only empty_cache does). A request takes the smallest free block that
fits, leaving the free block at the mapped end for last (the allocator counts that one as large
as it could grow); with none, it takes the free end plus new pages. So a block freed in the
middle of the range that is too small for the next big request stays mapped beside it, and the
reserve outgrows the allocated peak. Replaying the requests recorded in nine H200 runs through
this model gave every stream's reserve exactly (16 of 16; benchmarks/allocator_replay.py,
dev/HISTORY.md, session 8).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

MIB = 2**20
SMALL_REQUEST_BYTES = 1 * MIB  # requests up to this size go to the small-block pool
SMALL_PAGE_BYTES = 2 * MIB  # pages mapped onto a small-block segment
LARGE_PAGE_BYTES = 20 * MIB  # pages mapped onto a large-block segment
MIN_BLOCK_BYTES = 512  # every request rounds up to a multiple of this


def round_request(nbytes: int) -> int:
    """The block size the allocator hands out for a request of nbytes."""
    if nbytes < 0:
        raise ValueError(f"a request of {nbytes} bytes: sizes are >= 0")
    return max(MIN_BLOCK_BYTES, -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES)


@dataclass(kw_only=True)
class _Block:
    start: int
    size: int
    free: bool


def _start(block: _Block) -> int:
    return block.start


class ExpandableSegment:
    """One stream's address range for one size class: blocks in address order, the last page
    boundary mapped at `mapped_bytes`."""

    def __init__(self, *, page_bytes: int, min_split_bytes: int):
        self.page_bytes = page_bytes
        # a free block's rest becomes a block of its own only when larger than this (with
        # expandable segments torch splits off any rest of at least 512 bytes, in both pools;
        # without them a large block keeps a rest of up to 1 MiB)
        self.min_split_bytes = min_split_bytes
        self.blocks: list[_Block] = []
        self.mapped_bytes = 0

    def _fitting_block(self, size: int) -> int | None:
        """Index of the smallest free block of at least size (the lowest address among equal
        ones), any before the free block at the mapped end; None when none fits."""
        blocks = self.blocks
        last = len(blocks) - 1
        best, best_size = None, 0
        for i in range(last):  # blocks are in address order: the first of a size is the lowest
            b = blocks[i]
            if b.free and b.size >= size and (best is None or b.size < best_size):
                best, best_size = i, b.size
        if best is None and last >= 0 and blocks[last].free and blocks[last].size >= size:
            return last
        return best

    def _grow(self, size: int) -> int:
        """Map pages onto the end until a free block there holds size; its index."""
        tail = self.blocks[-1] if self.blocks and self.blocks[-1].free else None
        missing = size - (tail.size if tail else 0)
        grow = -(-missing // self.page_bytes) * self.page_bytes
        if tail:
            tail.size += grow
        else:
            self.blocks.append(_Block(start=self.mapped_bytes, size=grow, free=True))
        self.mapped_bytes += grow
        return len(self.blocks) - 1

    def allocate(self, size: int) -> int:
        """Hand out a block of size (already rounded); its start address."""
        i = self._fitting_block(size)
        if i is None:
            i = self._grow(size)
        block = self.blocks[i]
        rest = block.size - size
        if rest > self.min_split_bytes:
            self.blocks.insert(i + 1, _Block(start=block.start + size, size=rest, free=True))
            block.size = size
        block.free = False
        return block.start

    def free(self, start: int) -> None:
        """Return the block at start, merging it with free neighbours."""
        i = bisect_left(self.blocks, start, key=_start)  # blocks are in address order
        if i == len(self.blocks) or self.blocks[i].start != start or self.blocks[i].free:
            raise ValueError(f"no allocated block starts at {start}")
        self.blocks[i].free = True
        if i + 1 < len(self.blocks) and self.blocks[i + 1].free:
            self.blocks[i].size += self.blocks.pop(i + 1).size
        if i > 0 and self.blocks[i - 1].free:
            self.blocks[i - 1].size += self.blocks.pop(i).size


class CachingAllocatorModel:
    """Segments per (pool, size class); a pool is what the allocator keeps apart (a stream).
    Blocks are named by the caller's keys."""

    def __init__(self) -> None:
        self._segments: dict[tuple[str, bool], ExpandableSegment] = {}
        self._blocks: dict[object, tuple[tuple[str, bool], int]] = {}

    def allocate(self, pool: str, key: object, nbytes: int) -> None:
        if key in self._blocks:
            raise ValueError(f"{key!r} is already allocated: free it first")
        size = round_request(nbytes)
        where = (pool, size <= SMALL_REQUEST_BYTES)
        segment = self._segments.get(where)
        if segment is None:
            small = where[1]
            segment = self._segments[where] = ExpandableSegment(
                page_bytes=SMALL_PAGE_BYTES if small else LARGE_PAGE_BYTES,
                min_split_bytes=MIN_BLOCK_BYTES - 1)
        self._blocks[key] = (where, segment.allocate(size))

    def free(self, key: object) -> None:
        if key not in self._blocks:
            raise ValueError(f"{key!r} is not allocated")
        where, start = self._blocks.pop(key)
        self._segments[where].free(start)

    def reserved_bytes(self) -> dict[str, int]:
        """Bytes mapped per pool, both size classes together."""
        reserved: dict[str, int] = {}
        for (pool, _), segment in self._segments.items():
            reserved[pool] = reserved.get(pool, 0) + segment.mapped_bytes
        return reserved
