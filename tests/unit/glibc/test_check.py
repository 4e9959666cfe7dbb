"""The whole-heap checks' pieces that need no core: where a listed chunk may lie."""

from __future__ import annotations

import pytest

from heapwalk.glibc.forensics.check import _misplaced

HEAPS = [(0x7F0000100000, 0x7F0004000000), (0x555555559000, 0x55555557A000)]
TOP = (0x555555570000, 0x55555557A000)


def test_chunks_inside_their_heaps_and_clear_of_top_need_no_closer_look():
    chunks = [0x555555559010, 0x7F0000200000, 0x55555556FFE0]      # the last ends right where top starts
    assert list(_misplaced(chunks, [0x90, 0x30, 0x20], HEAPS, [TOP])) == []


def test_chunks_outside_the_heaps_across_their_end_or_into_top_are_named():
    chunks = [0x555555550000, 0x7F0003FFFFF0, 0x55555556FFF0, 0x555555572000, 0x555555560000]
    assert list(_misplaced(chunks, [0x90, 0x20, 0x20, 0x40, 0x0], HEAPS, [TOP])) == [
        (0x555555550000, 0x90),    # below every heap
        (0x7F0003FFFFF0, 0x20),    # runs past its heap's end
        (0x55555556FFF0, 0x20),    # runs into top
        (0x555555572000, 0x40),    # inside top
        (0x555555560000, 0x0),     # a size no chunk has
    ]


def test_two_tops_in_one_heap_send_every_chunk_to_the_closer_look():
    tops = [TOP, (0x555555560000, 0x555555561000)]
    assert list(_misplaced([0x555555559010], [0x90], HEAPS, tops)) == [(0x555555559010, 0x90)]


def test_heap_bounds_past_the_address_space_send_every_chunk_to_the_closer_look():
    """A damaged sbrk_base (all ones) puts the main heap's bounds past 2**64: no error, every chunk looked at."""
    heaps = HEAPS + [((1 << 64) - 1, (1 << 64) + 0x21000)]
    assert list(_misplaced([0x555555559010], [0x90], heaps, [TOP])) == [(0x555555559010, 0x90)]


@pytest.mark.parametrize("step", [1, 2, 3, 1 << 18])
def test_free_chunks_inside_other_free_chunks_are_named_in_their_lists_order(step, monkeypatch):
    """Entries of fastbins, bins and tcaches, in no address order across the lists, two of them inside a bin's
    chunk (a tcache entry by its user pointer, a fastbin chunk): each named, list by list and in each list's
    order, with the chunk it lies in; the bins' own chunks, side by side, are not.  The same whatever number of
    chunks is judged at a time (STEP)."""
    from array import array
    from types import SimpleNamespace
    from heapwalk.glibc.forensics import check
    from heapwalk.glibc.forensics.check import _Every, _inside_free
    monkeypatch.setattr(check, "_STEP", step)
    from heapwalk.glibc.model import BinKind, BinList, Tcache, TcacheBin
    base = 0x555555560000

    def listed(kind, index, chunks, size):
        return BinList(kind, index, 0, array("Q", chunks), array("Q", [size | 1] * len(chunks)))
    small = listed(BinKind.SMALL, 5, [base + 0x5000, base + 0x100, base + 0x3000], 0x100)
    large = listed(BinKind.LARGE, 70, [base + 0x8000], 0x1000)
    fast = listed(BinKind.FAST, 1, [base + 0x9000, base + 0x8400, base + 0x20], 0x30)
    arena = SimpleNamespace(number=0, unsorted=listed(BinKind.UNSORTED, 1, [], 0x20), bins=(small, large),
                            fastbins=(fast,))
    tcache = Tcache(0x555555559010, (TcacheBin(3, 0x50, 2, (base + 0x3050 + 16, base + 0xA000 + 16)),))
    state = SimpleNamespace(arenas=(arena,), tcaches=lambda: [("thread 1", tcache)])
    found = [(f.address, f.structure) for f in _inside_free(state, _Every(state))]
    assert found == [(base + 0x8400, "fastbin[1] of arena 0"), (base + 0x3050 + 16, "tcache bin 3 of thread 1")]
    twice = Tcache(0x555555559010, (TcacheBin(3, 0x50, 3, (base + 0x3050 + 16, base + 0xA000 + 16,
                                                           base + 0x5000 + 16)),))
    state = SimpleNamespace(arenas=(arena,), tcaches=lambda: [("thread 1", twice)])
    every = _Every(state)                # a chunk in a bin and in a tcache: no longer one sort's order alone
    assert every.twice
    assert [(f.address, f.structure) for f in _inside_free(state, every)] == found
