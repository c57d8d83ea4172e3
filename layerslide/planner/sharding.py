"""Which slice of each block's host state a rank owns, when a host's ranks share one copy.

A block's flat state (fp32 master, AdamW moments, bf16 upload copy, landed grads, NVMe file) is
cut into `gpus` equal slices, each a whole number of SHARD_ALIGN elements; the last slices may
hold padding past the block's end (zeros that stay zeros) or nothing real at all. Equal slices
are what all-gather and reduce-scatter into a flat buffer need, and whole scale blocks of 8-bit
moments are what the native AdamW needs. With one rank the slice is the whole block, unpadded.
"""

from __future__ import annotations

from dataclasses import dataclass

from layerslide.planner.settings import MOMENT_BLOCK_ELEMENTS

# Elements a slice is a whole number of: an 8-bit moment scale block, and 4 KiB pages of the
# bf16 weights and 8 KiB of fp32 master weights, so every slice starts page-aligned.
SHARD_ALIGN = MOMENT_BLOCK_ELEMENTS


@dataclass(frozen=True)
class Shards:
    """The slices of one block of `numel` elements over `ranks` ranks."""

    numel: int
    ranks: int

    def __post_init__(self) -> None:
        if self.numel < 0 or self.ranks < 1:
            raise ValueError(f"Shards(numel={self.numel}, ranks={self.ranks}): need numel >= 0 "
                             "and ranks >= 1")

    @property
    def slice_numel(self) -> int:
        """Elements of every rank's slice, padding included."""
        if self.ranks == 1:
            return self.numel
        per_rank = -(-self.numel // self.ranks)
        return -(-per_rank // SHARD_ALIGN) * SHARD_ALIGN

    @property
    def padded_numel(self) -> int:
        """Elements of the flat buffer the slices make together (a gather's output)."""
        return self.slice_numel * self.ranks

    def start(self, rank: int) -> int:
        """Where rank's slice starts in the block's flat layout."""
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank {rank} of {self.ranks}: choose 0..{self.ranks - 1}")
        return rank * self.slice_numel

    def real(self, rank: int) -> tuple[int, int]:
        """(start, stop) of the block's own elements in rank's slice (empty past its end)."""
        start = min(self.start(rank), self.numel)
        return start, min(start + self.slice_numel, self.numel)
