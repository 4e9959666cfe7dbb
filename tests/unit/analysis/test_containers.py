"""The leak scan reads big reached blocks first (`reach._Scanner.containers`): on a heap whose small blocks each
point to the one below them and whose container, above them all, points to most of them, the scan keeps no row
for the blocks the container reaches (it kept one for each before), and what it finds is what it finds without
reading containers first: the same reached blocks, leaked blocks, and rows of the leaked blocks; in C and in
numpy."""

from __future__ import annotations

import numpy as np
import pytest

from heapwalk.analysis import graph as graph_module, lookup, reach, rows as rows_module
from heapwalk.analysis.leaks import find_leaks
from heapwalk.common.view import Blocks
from heapwalk.inferior.image import ImageMemory
from heapwalk.inferior.roots import Root

HEAP, ROOTS = 0x10000000, 0x600000
SMALL, COUNT, LEAKED = 48, 3000, 40


def _heap() -> tuple[ImageMemory, Blocks, list[Root]]:
    """COUNT small blocks, each pointing to the one below it but the first of the last COUNT - LEAKED; a container of
    128 KiB above them pointing to those (the first LEAKED: a chain nothing else reaches, leaked); a root pointing
    to the container."""
    small = [HEAP + i * SMALL for i in range(COUNT)]
    heap = bytearray(COUNT * SMALL)
    for i in (i for i in range(1, COUNT) if i != LEAKED):
        heap[i * SMALL:i * SMALL + 8] = small[i - 1].to_bytes(8, "little")
    container = HEAP + COUNT * SMALL
    words = bytearray(128 << 10)
    for j, address in enumerate(small[LEAKED:]):
        words[8 * j:8 * j + 8] = address.to_bytes(8, "little")
    mem = ImageMemory({HEAP: bytes(heap) + bytes(words), ROOTS: container.to_bytes(8, "little")})
    starts = np.array(small + [container], dtype=np.uint64)
    ends = starts + np.array([SMALL] * COUNT + [len(words)], dtype=np.uint64)
    blocks = Blocks(starts, ends, np.zeros(COUNT + 1, dtype=np.int32), 0, 0,
                    heaps=((HEAP, container + len(words)),))
    return mem, blocks, [Root(ROOTS, ROOTS + 8, "data", "synthetic")]


def _leaked_rows(lk) -> dict[int, list[int]]:
    sources, targets = lk.reach.graph.rows_of(lk.leaked)
    out: dict[int, list[int]] = {int(b): [] for b in lk.leaked}
    for s, t in zip(sources.tolist(), targets.tolist()):
        out[s].append(t)
    return out


@pytest.mark.parametrize("native", [True, False])
def test_containers_first_keep_no_rows_and_change_nothing_found(native, monkeypatch):
    if not native:
        for module in (lookup, graph_module, rows_module):
            monkeypatch.setattr(module, "_LIB", None)
    mem, blocks, roots = _heap()
    monkeypatch.setattr(reach, "BIG_SHARE", 1)                  # the container is half this small heap
    passed = _passed_by(monkeypatch)
    first = find_leaks(reach.scan(mem, blocks, roots))
    assert passed == ([[COUNT]] if native else [])              # the heaps' windows do not follow it again
    monkeypatch.setattr(reach, "BIG", 1 << 40)                  # no block is a container
    plain = find_leaks(reach.scan(mem, blocks, roots))
    assert np.array_equal(first.reach.reached, plain.reach.reached)
    assert first.reach.reached.sum() == COUNT + 1 - LEAKED
    for name in ("leaked", "unreferenced", "holds_count", "holds_bytes"):
        assert np.array_equal(getattr(first, name), getattr(plain, name)), name
    assert _leaked_rows(first) == _leaked_rows(plain) and len(first.leaked) == LEAKED
    if native:     # numpy's form keeps every row either way
        assert len(first.reach.graph.keys) == LEAKED - 1             # the leaked chain's, and no other
        assert len(plain.reach.graph.keys) == COUNT - 2              # every block with a pointer, read unreached


def _passed_by(monkeypatch) -> list[list[int]]:
    """The blocks the heaps' windows are told to pass by (those `containers` followed), as they are told."""
    told: list[list[int]] = []
    window = rows_module.Rows.window

    def recorded(self, locate, base, words, seen, followed=None, firsts=None):
        if followed is not None and len(followed) and locate.native:
            told.append(followed.tolist())
        return window(self, locate, base, words, seen, followed, firsts)
    monkeypatch.setattr(rows_module.Rows, "window", recorded)
    return told


def test_a_container_read_in_part_is_followed_again_by_the_heaps_windows(monkeypatch):
    """A container whose last page cannot be read is not passed by: the heaps' windows read what they can of it,
    and what is found is what is found without containers first."""
    mem, blocks, roots = _heap()
    container = HEAP + COUNT * SMALL
    whole = mem.read(HEAP, container - HEAP + (128 << 10))
    mem = ImageMemory({HEAP: whole[:-4096], ROOTS: container.to_bytes(8, "little")})
    monkeypatch.setattr(reach, "BIG_SHARE", 1)
    passed = _passed_by(monkeypatch)
    first = find_leaks(reach.scan(mem, blocks, roots))
    assert passed == []
    monkeypatch.setattr(reach, "BIG", 1 << 40)
    plain = find_leaks(reach.scan(mem, blocks, roots))
    assert np.array_equal(first.reach.reached, plain.reach.reached) and first.reach.reached.sum() == COUNT + 1 - LEAKED
    assert np.array_equal(first.leaked, plain.leaked) and len(first.leaked) == LEAKED


def test_containers_read_no_more_than_their_share(monkeypatch):
    mem, blocks, roots = _heap()
    monkeypatch.setattr(reach, "BIG_SHARE", 4)                  # a quarter of the heap: less than the container
    lk = find_leaks(reach.scan(mem, blocks, roots))
    assert len(lk.reach.graph.keys) == COUNT - 2 and lk.reach.reached.sum() == COUNT + 1 - LEAKED


def test_heaps_and_unknown_memory_past_the_targets_memory_are_read_only_where_it_is():
    """Damage (an arena's system_mem of all ones) may put a heap's end, and memory whose chunks damage hides, past
    every mapping or past 2**64: the scan reads them only where the target has memory (INSIDE, and the roots
    `root_regions` makes), and finds what it finds on the heap as it is."""
    from heapwalk.inferior.roots import root_regions
    from heapwalk.inferior.space import MemoryMap
    mem, blocks, roots = _heap()
    plain = reach.scan(mem, blocks, roots)
    (lo, hi), = blocks.heaps
    huge = Blocks(blocks.starts, blocks.ends, np.zeros(COUNT + 1, dtype=np.int32), 0, 0,
                  heaps=((lo, lo + (1 << 64) - 1),), unknown=((hi + 4096, hi + (1 << 50)),))
    inside = [(lo, hi), (ROOTS, ROOTS + 8)]
    space = MemoryMap((), inside, inside, True, [(ROOTS, ROOTS + 8)])
    found = root_regions(space, [], huge.heaps, unknown=huge.unknown)
    assert [(r.start, r.end) for r in found] == [(ROOTS, ROOTS + 8)]
    damaged = reach.scan(mem, huge, roots, inside=inside)
    assert np.array_equal(damaged.reached, plain.reached) and damaged.reached.sum() == COUNT + 1 - LEAKED
