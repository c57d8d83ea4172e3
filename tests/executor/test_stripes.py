"""A file striped over several folders: any byte range reads back what was written, a failed
write leaves the previous file whole, a checkpoint's stripes restore it."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from layerslide.executor.nvme import aligned_buffer, nvme_folders
from layerslide.executor.stripes import ALIGN, StripedFile, stripe_ranges


def test_stripes_cover_the_file_in_aligned_pieces_the_last_ones_short_or_empty():
    assert stripe_ranges(10 * ALIGN, 1) == [(0, 10 * ALIGN)]
    assert stripe_ranges(10 * ALIGN, 4) == [(0, 3 * ALIGN), (3 * ALIGN, 6 * ALIGN),
                                            (6 * ALIGN, 9 * ALIGN), (9 * ALIGN, 10 * ALIGN)]
    assert stripe_ranges(2 * ALIGN, 3) == [(0, ALIGN), (ALIGN, 2 * ALIGN),
                                           (2 * ALIGN, 2 * ALIGN)]


@pytest.mark.parametrize("folders", [1, 3])
def test_any_range_reads_back_what_was_written(tmp_path, folders):
    dirs = [tmp_path / f"drive{i}" for i in range(folders)]
    for d in dirs:
        d.mkdir()
    nbytes = 7 * ALIGN
    with ThreadPoolExecutor(folders) as reads, ThreadPoolExecutor(folders) as writes:
        striped = StripedFile(dirs, "state_0.bin", nbytes, [False] * folders, (reads, writes))
        striped.create()
        assert [p.stat().st_size for p in striped.paths] == [hi - lo for lo, hi in
                                                              striped.ranges]
        data = aligned_buffer(nbytes)
        data.copy_(torch.randint(0, 256, (nbytes,), dtype=torch.uint8))
        striped.write(data)
        for offset, size in ((0, nbytes), (ALIGN, 4 * ALIGN), (5 * ALIGN, 2 * ALIGN)):
            got = aligned_buffer(size)
            striped.read(got, offset, size)
            assert torch.equal(got[:size], data[offset:offset + size]), (offset, size)
    if folders > 1:
        assert [p.name for p in striped.paths] == [f"state_0.s{i}.bin" for i in range(folders)]
        assert all(p.parent == d for p, d in zip(striped.paths, dirs, strict=True))


def test_a_failed_write_leaves_every_stripe_as_it_was(tmp_path, monkeypatch):
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    pools = (ThreadPoolExecutor(2), ThreadPoolExecutor(2))  # the stripes at once, as the tier
    striped = StripedFile(dirs, "state_1.bin", 4 * ALIGN, [False, False], pools)
    old = aligned_buffer(4 * ALIGN)
    old.fill_(7)
    striped.write(old)
    writes = []
    real = os.pwritev

    def second_stripe_fails(fd, buffers, offset):
        writes.append(fd)
        if len(writes) > 1:
            raise OSError(28, "No space left on device")
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", second_stripe_fails)
    new = aligned_buffer(4 * ALIGN)
    new.fill_(9)
    with pytest.raises(OSError):
        striped.write(new)
    monkeypatch.setattr(os, "pwritev", real)
    got = aligned_buffer(4 * ALIGN)
    striped.read(got, 0, 4 * ALIGN)
    assert torch.equal(got, old)
    assert not any(p.with_suffix(".next").exists() for p in striped.paths)
    for pool in pools:
        pool.shutdown()


def test_a_read_does_not_wait_for_a_write_of_the_other_stripes(tmp_path, monkeypatch):
    """Reads and writes have a pool each: the NVMe read lane's read runs while the write lane
    writes every stripe (one pool would queue the read behind them)."""
    import threading

    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    pools = (ThreadPoolExecutor(2), ThreadPoolExecutor(2))
    striped = StripedFile(dirs, "state_2.bin", 4 * ALIGN, [False, False], pools)
    striped.create()
    release = threading.Event()
    real = os.pwritev

    def held_write(fd, buffers, offset):
        assert release.wait(10), "the read waited for the write"
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", held_write)
    writer = threading.Thread(target=striped.write, args=(aligned_buffer(4 * ALIGN),))
    writer.start()
    striped.read(aligned_buffer(4 * ALIGN), 0, 4 * ALIGN)  # both write stripes still held
    release.set()
    writer.join()
    for pool in pools:
        pool.shutdown()


def test_folders_come_as_a_list_or_comma_separated_and_each_once(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert nvme_folders(f"{a},{b}") == [a, b] == nvme_folders([a, str(b)])
    assert nvme_folders(f"{a}, {b} ") == [a, b]  # spaces after the commas are not the path's
    assert nvme_folders(a) == [a]
    with pytest.raises(ValueError, match="repeat"):
        nvme_folders(f"{a},{a}")
    with pytest.raises(ValueError, match="--nvme-dir"):
        nvme_folders(",")
