"""Reads that pass the block cache by: a hop's word or a page's header comes from a block the cache holds, else is
read alone, exactly its bytes, and nothing is kept; memory that keeps no cache reads it plainly."""

from __future__ import annotations

import pytest

from heapwalk.inferior.image import ImageMemory
from heapwalk.inferior.memory import CachedMemory, ReadError, hop_read, hop_u64

BASE = 0x100000


def _counted():
    image = ImageMemory({BASE: bytes(range(256)) * 1024})          # 256 KiB: four blocks
    reads: list[tuple[int, int]] = []

    def raw(address: int, size: int) -> bytes:
        reads.append((address, size))
        return image.read(address, size)

    return image, CachedMemory(raw), reads


def test_a_hop_outside_the_cache_reads_its_own_bytes_and_keeps_nothing():
    image, mem, reads = _counted()
    assert hop_read(mem, BASE + 0x10005, 40) == image.read(BASE + 0x10005, 40)
    assert reads == [(BASE + 0x10005, 40)] and not mem._blocks
    assert hop_u64(mem, BASE + 0x20008) == int.from_bytes(image.read(BASE + 0x20008, 8), "little")
    assert reads[-1] == (BASE + 0x20008, 8) and not mem._blocks


def test_a_hop_inside_a_cached_block_reads_nothing():
    image, mem, reads = _counted()
    mem.read(BASE + 0x30000, 8)
    mem.read(BASE + 0x31000, 8)                                    # a second page wanted: the block whole
    asked = len(reads)
    assert hop_read(mem, BASE + 0x30100, 200) == image.read(BASE + 0x30100, 200)
    assert hop_u64(mem, BASE + 0x3FFF8) == int.from_bytes(image.read(BASE + 0x3FFF8, 8), "little")
    assert len(reads) == asked


def test_a_hop_past_the_memory_fails():
    _, mem, _ = _counted()
    with pytest.raises(ReadError):
        hop_read(mem, BASE + 256 * 1024 - 4, 8)
    with pytest.raises(ReadError):
        hop_read(mem, -8, 8)


def test_memory_without_a_cache_is_read_plainly():
    image = ImageMemory({BASE: bytes(range(64))})
    assert hop_read(image, BASE + 3, 5) == bytes([3, 4, 5, 6, 7])
    assert hop_u64(image, BASE + 8) == int.from_bytes(bytes(range(8, 16)), "little")
