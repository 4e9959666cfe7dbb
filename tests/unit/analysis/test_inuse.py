"""What the memory in use is, and the verdict that weighs the leak scan: on values, without gdb (the real
cores are in test_report.py, test_leaks.py and test_cli.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from heapwalk.analysis import inuse, signed, tally
from heapwalk.analysis.diff import ArenaTotals, Signatures, diff
from heapwalk.analysis.inuse import LeakTotals, in_use_of, size_buckets
from heapwalk.analysis.report import Bucket, build_report, scan_sentence
from heapwalk.glibc.account.verdict import verdict
from heapwalk.output import jsondoc
from heapwalk.glibc.show.reportlines import WORDS as GLIBC_WORDS
from heapwalk.output.difftext import diff_text
from heapwalk.common.view import ArenaView, Blocks, BlockSizes, HeapView

MiB = 1 << 20


def _blocks(chunks: list[tuple[int, int, int]]) -> Blocks:
    """Blocks of CHUNKS (address, chunk size, arena number), glibc's header and tail."""
    address = np.array([a for a, _, _ in chunks], dtype=np.uint64)
    size = np.array([s for _, s, _ in chunks], dtype=np.uint64)
    return Blocks(address + np.uint64(16), address + size + np.uint64(8),
                  np.array([n for _, _, n in chunks], dtype=np.int32), 16, 8, heaps=())


def test_size_buckets_are_powers_of_two_with_their_leaked_share():
    sizes = np.array([32, 48, 64, 1600, 4096, 4080], dtype=np.int64)
    leaked = np.array([True, False, False, True, False, True])
    got = [(b.low, b.high, b.count, b.bytes, b.leaked_count, b.leaked_bytes) for b in size_buckets(sizes, leaked)]
    assert got == [(32, 64, 2, 80, 1, 32), (64, 128, 1, 64, 0, 0), (1024, 2048, 1, 1600, 1, 1600),
                   (2048, 4096, 1, 4080, 1, 4080), (4096, 8192, 1, 4096, 0, 0)]
    assert size_buckets(np.zeros(0, dtype=np.int64)) == ()


IMAGES = [(0x400000, 0x401000, "prog"), (0x402000, 0x403000, "prog"), (0x7f0000, 0x7f1000, "libx.so")]


@pytest.mark.parametrize("leaks", [None, "some", "none"])
def test_the_tallies_in_c_are_numpys(leaks):
    """Counts and bytes by arena, and by arena and power of two, with the leaked share: the C loop and numpy's
    bincount agree, from sizes below 32 to sizes whose bucket a double's rounding decides."""
    rng = np.random.default_rng(3)
    sizes = np.concatenate([rng.integers(0, 40, 5000), rng.integers(32, 1 << 22, 200_000),
                            np.array([1 << 40, (1 << 53) + 1, 2 ** 62 - 1, 2 ** 62, -16])]).astype(np.int64)
    group = rng.integers(0, 9, len(sizes)).astype(np.int64)
    leaked = None if leaks is None else rng.random(len(sizes)) < (0.1 if leaks == "some" else 0.0)
    for by_exponent, slots in ((False, 9), (True, 64 * 9)):
        numpy = tally._tally_numpy(sizes, group, slots, leaked, by_exponent)
        assert tally.NATIVE
        for width in (np.int64, np.int32, np.uint16, np.uint8):     # view.Blocks keeps arenas as uint8 or uint16
            c = tally.tally(sizes, group.astype(width), slots, leaked, by_exponent)
            for got, expected in zip(c, numpy):
                assert got.dtype == np.int64 and np.array_equal(got, expected)
    assert int(c[0].sum()) == len(sizes) and (int(c[2].sum()) > 0) == (leaks == "some")
    assert int(c[1][64 * int(group[-2]) + 62]) == sum(int(s) for s, g in zip(sizes, group)    # a double's rounding:
                                                      if g == group[-2] and s >= 2 ** 62)  # 2**62 - 1 is 2**62


def test_the_signatures_in_c_are_numpys(monkeypatch):
    """A word in an image (but for a file's first byte), text, or nothing, word for word the same in C and in
    numpy: at the images' edges, between them, and among words of every kind."""
    rng = np.random.default_rng(4)
    edges = [v for lo, hi, _ in IMAGES for v in (lo - 8, lo, lo + 8, hi - 8, hi, hi + 8)]
    words = np.concatenate([np.array(edges + [0, 1, 0x401800], dtype=np.uint64),
                            rng.integers(0x3F0000, 0x800000, 100_000, dtype=np.uint64),
                            rng.integers(0, 2 ** 63, 100_000, dtype=np.uint64),
                            np.frombuffer(rng.integers(0x20, 0x7F, 8 * 20_000, dtype=np.uint8).tobytes(), "<u8")])
    c = signed.signatures(words, IMAGES)
    monkeypatch.setattr(tally, "_LIB", None)
    monkeypatch.setattr(signed, "text_words", lambda w: None)
    numpy = signed.signatures(words, IMAGES)
    assert np.array_equal(c, numpy)
    assert {0, 1} < set(np.unique(c).tolist()) and (c > 1).sum() > 100
    assert c[edges.index(0x400000)] == 0 and c[edges.index(0x402000)] == 0x402000
    kept = signed.Signed(len(words), IMAGES)
    for at in range(0, len(words), 7_000):            # a window at a time, as the scan gives them
        kept.add(at, words[at:at + 7_000])
    assert np.array_equal(kept.of(np.arange(len(words))), c)
    assert len(kept.values) == len(np.unique(c[c > 1])) + 2
    assert kept.codes.dtype == np.min_scalar_type(len(kept.values) - 1)


def test_the_codes_widen_at_the_255th_and_the_65535th_signature():
    """A byte a block until a program has more signatures than it numbers, then two, then four: the codes given
    before are kept."""
    images = [(0x400000, 0x400000 + (1 << 24), "/bin/many")]
    words = (np.uint64(0x400008) + np.arange(70_000, dtype=np.uint64) * np.uint64(16))[::-1].copy()
    kept = signed.Signed(len(words), images)
    for at in range(0, len(words), 30_000):
        kept.add(at, words[at:at + 30_000])
        assert kept.codes.dtype == (np.uint16 if at + 30_000 < 65_534 else np.uint32)
    assert np.array_equal(kept.of(np.arange(len(words))), words)
    few = signed.Signed(300, images)
    few.add(0, words[:254])
    assert few.codes.dtype == np.uint8
    few.add(254, words[254:300])
    assert few.codes.dtype == np.uint16 and np.array_equal(few.of(np.arange(300)), words[:300])


def test_in_use_groups_by_size_arena_and_signature():
    blocks = _blocks([(0x1000, 48, 0), (0x1030, 48, 0), (0x1060, 96, 0), (0x2000, 64, 1), (0x2040, 1040, 1)])
    first = np.array([0x402010, 0x402010, int.from_bytes(b"hello wo", "little"), 0x400000, 0x7f0020],
                     dtype=np.uint64)
    leaked = np.array([False, True, False, False, True])
    names = {0x402010: "vtable for Shape + 16"}
    got = in_use_of(blocks, leaked, signed.Signed.of_words(first, IMAGES), IMAGES, names.get)
    assert (got.count, got.bytes) == (5, 48 + 48 + 96 + 64 + 1040)
    assert {n: sum(b.bytes for b in rows) for n, rows in got.per_arena.items()} == {0: 192, 1: 1104}
    assert [(g.name, g.count, g.bytes, g.leaked_count, g.leaked_bytes, g.example) for g in got.signatures] == [
        ("libx.so+0x20", 1, 1040, 1, 1040, 0x2040), ("text", 1, 96, 0, 0, 0x1060),
        ("vtable for Shape + 16", 2, 96, 1, 48, 0x1000)]   # 0x400000, the program's first byte, is no type
    assert not got.truncated
    assert in_use_of(blocks).signatures is None


def test_only_the_biggest_signatures_are_kept(monkeypatch):
    monkeypatch.setattr(inuse, "SIGNATURES_KEPT", 2)
    blocks = _blocks([(0x1000 + 0x100 * i, 32 + 16 * i, 0) for i in range(4)])
    first = np.array([0x402000 + 8 * i for i in range(4)], dtype=np.uint64)
    got = in_use_of(blocks, None, signed.Signed.of_words(first, IMAGES), IMAGES)
    assert [g.bytes for g in got.signatures] == [80, 64] and got.truncated


def _view(system: int, in_use: int, free: int, top: int) -> HeapView:
    arena = ArenaView(0, 0x7f00, "main", 1, 1, system, in_use, {"small": free}, top, system - in_use - free - top,
                      0, True)
    return HeapView("glibc", (arena,), {0: Counter({free: 1}) if free else Counter()}, ())


def _leaks(in_use: int, leaked: int, count: int = 10) -> LeakTotals:
    return LeakTotals(1000, in_use, count if leaked else 0, leaked, count // 2 if leaked else 0,
                      {0: (count if leaked else 0, leaked)})


@pytest.mark.parametrize("view,leaked,first", [
    ((40 * MiB, 36 * MiB, 2 * MiB, 2 * MiB), 20 * MiB, "A leak, not fragmentation: 36 MiB"),
    ((40 * MiB, 36 * MiB, 2 * MiB, 2 * MiB), 1 * MiB, "Live data, neither a leak nor fragmentation: 36 MiB"),
    ((40 * MiB, 36 * MiB, 2 * MiB, 2 * MiB), None, "Memory in use, not fragmentation: 36 MiB"),
    ((40 * MiB, 20 * MiB, 18 * MiB, 2 * MiB), 8 * MiB, "Fragmentation and a leak: 20 MiB"),
    ((40 * MiB, 20 * MiB, 18 * MiB, 2 * MiB), 512 << 10, "Fragmentation, not a leak: 20 MiB"),
    ((40 * MiB, 28 * MiB, 2 * MiB, 2 * MiB), 4 * MiB, "A leak, not fragmentation: 4 MiB of the 28 MiB"),
    ((40 * MiB, 28 * MiB, 2 * MiB, 2 * MiB), 0, "28 MiB in use and 4 MiB free of the 40 MiB malloc holds: neither "
                                                "fragmentation nor a leak stands out."),
])
def test_the_verdict_weighs_the_leak_scan(view, leaked, first):
    rep = build_report(_view(*view), None, None if leaked is None else _leaks(view[1], leaked), verdict=verdict)
    assert rep.verdict[0].startswith(first), rep.verdict
    if leaked is None:
        assert not any("leak scan" in v for v in rep.verdict)
    elif leaked == 0:
        assert rep.verdict[1] == "The leak scan reached every chunk in use from the program's roots: nothing leaked."
    else:
        assert rep.verdict[1].startswith("The leak scan found ") and "10 chunks" in rep.verdict[1]
        assert ("lists them by size and signature" in rep.verdict[1]) == rep.leaking


def test_the_leak_sentence_says_what_could_not_be_read():
    lt = LeakTotals(10, 4 * MiB, 3, 2 * MiB, 1, {0: (3, 2 * MiB)}, unread_bytes=8192)
    rep = build_report(_view(8 * MiB, 4 * MiB, 2 * MiB, 2 * MiB), None, lt, verdict=verdict)
    assert "(8 KiB of memory could not be read: chunks reached only through it count as leaked)" in rep.verdict[1]


def _arena(in_use: int, used: tuple[tuple[int, int, int, int], ...] | None) -> ArenaTotals:
    return ArenaTotals(0x10, 0, 100 + in_use, in_use, 0, 0, (), in_use_histogram=None if used is None else
                       tuple(Bucket(*b) for b in used))


def test_the_diff_compares_chunks_in_use_by_size_and_signature():
    a = [_arena(96, ((32, 64, 2, 96),))]
    b = [_arena(2096, ((32, 64, 2, 96), (1024, 2048, 1, 2000)))]
    sa = Signatures({"vtable for Shape + 16": (2, 96), "text": (5, 500), "gone": (1, 32)})
    sb = Signatures({"vtable for Shape + 16": (40, 1920), "text": (5, 500)})
    d = diff(a, b, sa, sb)
    assert [(c.low, c.count, c.bytes_growth) for c in d.arenas[0].in_use_classes] == [(1024, (0, 1), 2000)]
    assert [(c.name, c.count, c.bytes_growth) for c in d.signatures] == [
        ("vtable for Shape + 16", (2, 40), 1824), ("gone", (1, 0), -32)]
    text = diff_text(d, jsondoc.words_json("glibc", GLIBC_WORDS))
    assert "arena 0: chunks in use grew in 1024-2048 B (0 -> 1 chunks, +2 KiB)" in text
    assert "chunks in use grew by signature: vtable for Shape + 16 (2 -> 40 chunks, +2 KiB)" in text
    doc = jsondoc.diff_json(d)
    assert doc["arenas"][0]["in_use_classes"][0]["bytes"] == [0, 2000]
    assert doc["signatures"][0] == {"signature": "vtable for Shape + 16", "count": [2, 40], "bytes": [96, 1920],
                                    "bytes_growth": 1824}
    # a signature a truncated list leaves out is unknown there; a snapshot without groups compares none
    d = diff(a, b, Signatures(sa.groups, truncated=True), Signatures({"new": (1, 64)}, truncated=True))
    assert d.signatures == ()
    d = diff([_arena(96, None)], b, None, sb)
    assert d.arenas[0].in_use_classes == () and d.signatures == ()


def test_the_reader_takes_back_in_use_groups_and_signatures():
    doc = {"arenas": [{"address": 0x10, "heaps": []}],
           "report": {"arenas": [{"address": 0x10, "number": 0, "system": 200, "in_use": 96, "free": {}, "top": 0}],
                      "in_use": {"histogram_by_arena": {"0": [{"low": 32, "high": 64, "count": 2, "bytes": 96,
                                                               "leaked_count": 0, "leaked_bytes": 0}]},
                                 "by_signature": [{"signature": "text", "count": 2, "bytes": 96}],
                                 "signatures_truncated": False}}}
    arenas = jsondoc.read_snapshot(doc)
    assert arenas[0].in_use_histogram == (Bucket(32, 64, 2, 96),)
    assert jsondoc.read_signatures(doc) == Signatures({"text": (2, 96)}, False)
    doc["report"]["in_use"] = None
    assert jsondoc.read_snapshot(doc)[0].in_use_histogram is None and jsondoc.read_signatures(doc) is None
    doc["report"]["in_use"] = {"histogram_by_arena": {}, "by_signature": [{"count": 1}]}
    with pytest.raises(jsondoc.DocumentError):
        jsondoc.read_signatures(doc)


def test_the_scan_sentence_speaks_of_one_block_in_the_singular():
    """One leaked allocation is "1 allocation", unreferenced or held only by leaked memory, and "lists it";
    several keep the plural and their count of unreferenced ones."""
    one = scan_sentence(LeakTotals(10, 1 << 20, 1, 65536, 1), "allocation")
    assert "64 KiB in 1 allocation nothing reachable points to (6% of the memory in use), unreferenced" in one
    assert one.endswith("'heapwalk leaks' lists it.")
    ring = scan_sentence(LeakTotals(10, 1 << 20, 1, 65536, 0), "chunk")
    assert "in 1 chunk nothing reachable points to (6% of the memory in use), referenced only from leaked" in ring
    many = scan_sentence(LeakTotals(10, 1 << 20, 3, 65536, 2), "chunk")
    assert "in 3 chunks nothing reachable points to (6% of the memory in use), 2 of them unreferenced" in many
    assert many.endswith("lists them.")


def test_sizes_made_from_the_blocks_lengths_are_the_sizes_and_tally_alike():
    """`view.BlockSizes` (no array of a block each): rows, sums (masked too) and lists as from the int64 array,
    and `tally` reading the lengths in C gives what it gives on the array."""
    rng = np.random.default_rng(8)
    lengths = rng.integers(0, 1 << 20, 100_000).astype(np.uint32)
    lengths[:3] = [0, 1, (1 << 32) - 1]
    sizes = BlockSizes(lengths, 8)
    whole = (lengths.astype(np.int64) << 3) + 8
    mask = rng.random(len(lengths)) < 0.3
    assert np.array_equal(np.asarray(sizes), whole) and sizes.tolist() == whole.tolist() and len(sizes) == len(whole)
    assert np.array_equal(sizes[mask], whole[mask]) and int(sizes[2]) == int(whole[2])
    assert sizes.sum() == int(whole.sum()) and sizes.sum(where=mask) == int(whole.sum(where=mask))
    group = rng.integers(0, 9, len(lengths)).astype(np.uint8)
    for by_exponent, slots in ((False, 9), (True, 64 * 9)):
        for got, expected in zip(tally.tally(sizes, group, slots, mask, by_exponent),
                                 tally.tally(whole, group, slots, mask, by_exponent)):
            assert np.array_equal(got, expected)
