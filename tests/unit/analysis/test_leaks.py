"""The leak scan: which chunks in use nothing points to any more (`heapwalk leaks`).

On synthetic memory: roots, interior pointers, chains, rings, trees, pointers in free memory, what each
unreferenced block holds, the C search against numpy's, the stacks of several threads in one mapping (the
`reach` reproducer's cores against its ledger: test_leaks_cores.py).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from heapwalk.analysis import graph as graph_module
from heapwalk.analysis.graph import Graph
from heapwalk.analysis.leaks import find_leaks
from heapwalk.analysis.signed import begins_with_text, signatures
from heapwalk.analysis.reach import scan
from heapwalk.analysis.rows import SparseRows
from heapwalk.inferior.elf import Mapping
from heapwalk.inferior.image import ImageMemory
from heapwalk.inferior.roots import Root, RegisterRoot, image_data, root_regions
from heapwalk.inferior.space import MemoryMap
from heapwalk.inferior.threads import ThreadRegs
from heapwalk.common.view import Blocks

HEAP, DATA = 0x10000, 0x80000


def _image(chunks: dict[int, int], words: dict[int, int], data_words: dict[int, int] = None):
    """A heap at HEAP whose in-use chunks are CHUNKS (offset -> chunk size), WORDS written into it (address ->
    value), and a data page at DATA holding DATA_WORDS: the memory, the blocks, and the data root."""
    mem = ImageMemory({HEAP: bytearray(0x4000), DATA: bytearray(0x1000)})
    for address, value in {**words, **(data_words or {})}.items():
        mem.write_u64(address, value)
    offsets = sorted(chunks)
    starts = np.array([HEAP + o + 16 for o in offsets], dtype=np.uint64)
    ends = np.array([HEAP + o + chunks[o] + 8 for o in offsets], dtype=np.uint64)
    blocks = Blocks(starts, ends, np.zeros(len(offsets), dtype=np.int32), 16, 8, heaps=((HEAP, HEAP + 0x4000),))
    return mem, blocks, [Root(DATA, DATA + 0x1000, "data", "prog")]


def _random_chunks(rng) -> dict[int, int]:
    """In-use chunks (offset -> size) of 32 to 176 bytes over the heap's first 0x3800 bytes, three in ten left out
    (free gaps)."""
    chunks, offset = {}, 0
    while offset < 0x3800:
        size = int(rng.integers(2, 12)) * 16
        if rng.random() < 0.7:
            chunks[offset] = size
        offset += size
    return chunks


def _leaked(blocks, lk):
    return sorted(int(a) - HEAP for a in blocks.addresses(lk.leaked))


def test_roots_chains_and_interior_pointers_reach_their_blocks():
    chunks = {0x0: 0x40, 0x40: 0x40, 0x80: 0x40, 0xc0: 0x40}
    words = {HEAP + 0x10: HEAP + 0x50,          # block 0 -> block 1
             HEAP + 0x58: HEAP + 0x80 + 0x30}    # block 1 -> inside block 2
    mem, blocks, roots = _image(chunks, words, {DATA + 8: HEAP + 0x10})
    lk = find_leaks(scan(mem, blocks, roots, paths=True))
    assert _leaked(blocks, lk) == [0xc0]
    assert lk.reach.path(2) == [0, 1, 2]
    root, word = lk.reach.root_of(0)
    assert root.kind == "data" and word == DATA + 8


def test_a_ring_is_leaked_but_not_unreferenced_and_a_tree_is_held_by_its_root():
    chunks = {o: 0x40 for o in range(0, 0x400, 0x40)}
    ring = [0x000, 0x040, 0x080]
    words = {HEAP + a + 0x10: HEAP + ring[(i + 1) % 3] + 0x10 for i, a in enumerate(ring)}
    # a tree: 0x100 -> 0x140, 0x180; 0x140 -> 0x1c0
    words.update({HEAP + 0x110: HEAP + 0x150, HEAP + 0x118: HEAP + 0x190, HEAP + 0x150: HEAP + 0x1d0})
    mem, blocks, roots = _image(chunks, words, {DATA: HEAP + 0x210})
    lk = find_leaks(scan(mem, blocks, roots))
    assert _leaked(blocks, lk) == [o for o in range(0, 0x400, 0x40) if o != 0x200]
    unreferenced = {int(a) - HEAP for a in blocks.addresses(lk.unreferenced)}
    assert unreferenced == {o for o in range(0x240, 0x400, 0x40)} | {0xc0, 0x100}
    held = dict(zip((int(a) - HEAP for a in blocks.addresses(lk.unreferenced)), lk.holds_count.tolist()))
    assert held[0x100] == 4 and held[0x240] == 1
    assert lk.in_rings == 3 and lk.in_rings_bytes == 3 * 0x40


def test_free_memory_and_the_allocators_own_memory_are_not_roots():
    chunks = {0x0: 0x40, 0x100: 0x40}
    # the word at 0x60 lies in free memory between the blocks: it points to block 1, which stays leaked
    mem, blocks, roots = _image(chunks, {HEAP + 0x60: HEAP + 0x110})
    lk = find_leaks(scan(mem, blocks, roots))
    assert _leaked(blocks, lk) == [0x0, 0x100]


def test_a_pointer_just_past_a_block_reaches_nothing_and_the_next_header_is_the_blocks_own():
    chunks = {0x0: 0x40, 0x40: 0x40}
    # one past block 0's usable end (0x48) is block 1's size field: no block; 0x40 (block 1's prev_size)
    # belongs to block 0
    mem, blocks, roots = _image(chunks, {}, {DATA: HEAP + 0x48, DATA + 8: HEAP + 0x40})
    lk = find_leaks(scan(mem, blocks, roots))
    assert _leaked(blocks, lk) == [0x40]


def test_registers_are_roots():
    mem, blocks, roots = _image({0x0: 0x40, 0x40: 0x40}, {})
    lk = find_leaks(scan(mem, blocks, roots, [RegisterRoot(1, "rbx", HEAP + 0x58)], paths=True))
    assert _leaked(blocks, lk) == [0x0]
    root, value = lk.reach.root_of(1)
    assert root.label == "register rbx of thread 1" and value == HEAP + 0x58


def test_unreadable_memory_is_reported_not_skipped_silently():
    mem, blocks, roots = _image({0x0: 0x40}, {})
    lk = find_leaks(scan(mem, blocks, roots + [Root(0x200000, 0x202000, "anonymous")]))
    assert lk.reach.unread == ((0x200000, 0x202000),)


def test_the_c_search_and_numpys_visit_the_same_blocks():
    rng = np.random.default_rng(7)
    n = 5000
    sources = rng.integers(0, n, 12000).astype(np.int32)
    targets = rng.integers(0, n, 12000).astype(np.int32)
    chain = np.arange(n - 1, dtype=np.int32)           # and one long chain through all of them
    graph = Graph(n, np.concatenate([sources, chain]), np.concatenate([targets, chain + 1]))
    seeds = np.array([3, 17], dtype=np.int32)
    results = []
    for search in (graph.reach, graph._reach_numpy):
        seen, parent = np.zeros(n, dtype=np.uint8), np.full(n, -1, dtype=np.int32)
        visited = search(seeds, seen, parent)
        results.append((set(visited.tolist()), seen.copy()))
        assert all(parent[v] >= 0 for v in visited.tolist() if v not in (3, 17))
    assert results[0][0] == results[1][0] and (results[0][1] == results[1][1]).all()


def test_a_search_from_marked_seeds_is_the_search_from_the_seeds(monkeypatch):
    """`Graph.reach_marked` (the scan's: the blocks a root reached, marked by their root) in C and in numpy, and
    `reach` from those blocks listed: the same blocks visited by the same parents, the seeds' parent -1."""
    rng = np.random.default_rng(8)
    n = 4000
    graph = Graph(n, rng.integers(0, n, 9000).astype(np.int32), rng.integers(0, n, 9000).astype(np.int32))
    marks = np.where(rng.random(n) < 0.01, rng.integers(0, 5, n), -1).astype(np.int32)
    seeds = np.flatnonzero(marks >= 0).astype(np.int32)
    runs, lib = [], graph_module._LIB
    for how in ("c", "numpy", "listed"):
        seen, parent = np.zeros(n, dtype=np.uint8), np.full(n, -2, dtype=np.int32)
        monkeypatch.setattr(graph_module, "_LIB", None if how == "numpy" else lib)
        if how == "listed":
            parent[seeds] = -1
            order = graph.reach(seeds, seen, parent)
        else:
            order = graph.reach_marked(marks, seen, parent)
        runs.append((order.tolist(), seen.tolist(), parent.tolist()))
    assert runs[0] == runs[2] and (set(runs[1][0]), runs[1][1]) == (set(runs[2][0]), runs[2][1])
    assert all(runs[0][2][s] == -1 for s in seeds.tolist()) and 0 < sum(runs[0][1]) < n
    assert graph_module.NATIVE


@pytest.mark.parametrize("share", [0.0, 0.02, 0.5, 1.0])
def test_the_edges_from_leaked_blocks_are_found_from_their_rows(share):
    """`find_leaks` looks only at the leaked blocks' rows: the same edges as every edge looked at, in the dense
    rows (`Graph`) and in the rows a scan keeps (`SparseRows`, some blocks with none)."""
    rng = np.random.default_rng(int(share * 100))
    n = 3000
    sources, targets = rng.integers(0, n, 8000).astype(np.int32), rng.integers(0, n, 8000).astype(np.int32)
    graph = Graph(n, sources, targets)
    order = np.argsort(sources, kind="stable")
    keys, first = np.unique(sources[order], return_index=True)
    sparse = SparseRows(n, keys.astype(np.int32), np.append(first, len(order)).astype(np.int64), targets[order])
    assert np.array_equal(sparse.graph().offsets, graph.offsets) and np.array_equal(sparse.graph().targets,
                                                                                    graph.targets)
    leaked_mask = rng.random(n) < share
    leaked = np.flatnonzero(leaked_mask)
    for rows in (graph, sparse):
        found = rows.rows_of(leaked)
        assert sorted(zip(*(a.tolist() for a in found))) == sorted(zip(sources[leaked_mask[sources]].tolist(),
                                                                       targets[leaked_mask[sources]].tolist()))
        assert (len(found[0]) > 0) == (share > 0)


def test_the_rows_counted_in_c_and_in_numpy_are_the_same():
    """A graph's compressed rows (`Graph`, `hw_rows`), from edges in order (as the scan finds them) and not,
    none, and one: the same offsets and the same targets, a row's in the order they came."""
    rng = np.random.default_rng(5)
    n = 3000
    shuffled = (rng.integers(0, n, 9000).astype(np.int32), rng.integers(0, n, 9000).astype(np.int32))
    ordered = (np.sort(shuffled[0]), shuffled[1])
    for sources, targets in (shuffled, ordered, (np.zeros(0, np.int32),) * 2, (np.array([n - 1], np.int32),) * 2):
        fast, slow = Graph(n, sources, targets), Graph(n, sources, targets, native=False)
        assert np.array_equal(fast.offsets, slow.offsets) and np.array_equal(fast.targets, slow.targets)
        assert fast.offsets[-1] == len(sources) and np.array_equal(np.diff(fast.offsets), np.bincount(sources, minlength=n))


@pytest.mark.parametrize("seed", range(6))
def test_the_scan_finds_every_edge_a_word_by_word_search_finds(seed, monkeypatch):
    """Random chunks, free gaps and words (pointers to chunk starts, insides, ends, headers, free memory),
    scanned through windows of a few words that cut chunks anywhere: the same edges and reached set as a
    plain search word by word."""
    from heapwalk.analysis import reach as reach_module
    monkeypatch.setattr(reach_module, "WINDOW", 8 * (3 + seed))
    rng = np.random.default_rng(seed)
    chunks = _random_chunks(rng)
    targets = [HEAP + o + int(rng.integers(0, chunks[o] // 8 + 2)) * 8 for o in chunks] + [HEAP + 0x3ff8, HEAP]
    words = {HEAP + 8 * int(i): int(rng.choice(targets)) for i in rng.integers(0, 0x700, 400)}
    mem, blocks, roots = _image(chunks, words, {DATA + 8 * i: int(rng.choice(targets)) for i in range(3)})
    lk = find_leaks(scan(mem, blocks, roots, paths=True))      # every block's row kept
    deferred = find_leaks(scan(mem, blocks, roots))
    assert np.array_equal(deferred.reach.reached, lk.reach.reached)
    starts, ends = blocks.starts.tolist(), blocks.ends.tolist()

    def word(address: int) -> int:
        return int.from_bytes(mem.read(address, 8), "little")

    def block_of(address: int) -> int:
        return next((i for i, (lo, hi) in enumerate(zip(starts, ends)) if lo <= address < hi), -1)
    edges = set()
    for address in range(HEAP, HEAP + 0x4000, 8):
        source, target = block_of(address), block_of(word(address))
        if source >= 0 and target >= 0 and source != target:
            edges.add((source, target))
    assert set(zip(*(e.tolist() for e in lk.reach.graph.edges()))) == edges
    reached = {block_of(word(DATA + 8 * i)) for i in range(3)} - {-1}
    todo = list(reached)
    while todo:
        b = todo.pop()
        for s_, t in edges:
            if s_ == b and t not in reached:
                reached.add(t)
                todo.append(t)
    assert set(np.flatnonzero(lk.reach.reached).tolist()) == reached


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_the_signatures_the_rows_pass_reads_are_each_blocks_first_words(seed, split, monkeypatch):
    """The rows' C pass gives each block's first word for its signature, through windows that cut blocks anywhere,
    in batches of a few blocks (a container read whole among them; SPLIT: the heaps leave out blocks between them,
    whose signatures are none): every block's signature is its first word's, as numpy's scan gives it."""
    from heapwalk.analysis import lookup, reach as reach_module
    from heapwalk.analysis.signed import Signed
    monkeypatch.setattr(reach_module, "WINDOW", 8 * (3 + seed))
    monkeypatch.setattr(reach_module._FirstWords, "BATCH", (1, 7, 50, 1000)[seed % 4])
    monkeypatch.setattr(reach_module, "BIG", 0x60)
    rng = np.random.default_rng(seed)
    chunks = _random_chunks(rng)
    images = [(0x400000, 0x401000, "prog"), (0x500000, 0x502000, "lib")]
    kinds = [0, 0x400000, 0x400010, 0x500ff8, 0x501000, int.from_bytes(b"GET /ind", "little"), HEAP + 0x20]
    words = {HEAP + o + 16: int(rng.choice(kinds)) for o in chunks}
    targets = [HEAP + o + 16 for o in chunks]
    words.update({HEAP + o + 24: int(rng.choice(targets)) for o in chunks if chunks[o] > 0x20})
    mem, blocks, roots = _image(chunks, words, {DATA: targets[0], DATA + 8: targets[-1]})
    gap = (HEAP + 0x1800, HEAP + 0x2000) if split else (0, 0)
    if split:
        blocks = Blocks(blocks.starts, blocks.ends, np.zeros(blocks.count, dtype=np.int32), 16, 8,
                        heaps=((HEAP, gap[0]), (gap[1], HEAP + 0x4000)))
    first_words = np.array([0 if gap[0] <= a < gap[1] else words.get(a, 0) for a in blocks.starts.tolist()],
                           dtype=np.uint64)
    expected = Signed.of_words(first_words, images)
    expected = expected.values[expected.codes].tolist()
    assert lookup.NATIVE
    c = scan(mem, blocks, roots, images=images)
    monkeypatch.setattr(lookup, "_LIB", None)
    plain = scan(mem, blocks, roots, images=images)
    assert c.signed.values[c.signed.codes].tolist() == plain.signed.values[plain.signed.codes].tolist() == expected
    assert len(set(expected)) > 3


def test_signatures_are_read_only_pointers_or_text():
    images = [(0x400000, 0x401000, "prog")]
    words = np.array([0x400010, 0x402000, int.from_bytes(b"GET /ind", "little"),
                      int.from_bytes(b"abcd\0\0\0\0", "little"), 0], dtype=np.uint64)
    assert signatures(words, images).tolist() == [0x400010, 0, 1, 1, 0]


def test_several_threads_stacks_in_one_mapping_are_each_scanned_from_their_stack_pointer():
    threads = [ThreadRegs(2, 2, 0x20f6c0, sp=0x20e000), ThreadRegs(3, 3, 0x2206c0, sp=0x21f000)]
    space = MemoryMap([Mapping(0x300000, 0x301000, 0, "/usr/lib/libfoo.so")], [(0x200000, 0x221000),
                      (0x300000, 0x301000)], None, True, [(0x200000, 0x221000), (0x300000, 0x301000)])
    roots = root_regions(space, threads, owned=[])
    stacks = [(r.start, r.end, r.thread) for r in roots if r.kind == "stack"]
    assert stacks == [(0x20e000 - 128, 0x211000, 2), (0x21f000 - 128, 0x221000, 3)]
    assert [r.label for r in roots if r.kind == "data"] == ["data of libfoo.so"]


def test_a_threads_tls_cut_off_from_its_stack_by_the_allocators_words_is_still_a_root():
    """Words the allocator owns in thread 2's TLS (jemalloc's radix tree cache keys in its tsd) cut its stack
    mapping in two: the top of it (its TLS and thread descriptor) then lies below thread 3's stack in the
    next piece, yet it is that thread's TLS, not dead stack."""
    threads = [ThreadRegs(2, 2, 0x20f6c0, sp=0x20e000), ThreadRegs(3, 3, 0x2206c0, sp=0x21f000)]
    space = MemoryMap([], [(0x200000, 0x221000)], None, True, [(0x200000, 0x221000)])
    roots = root_regions(space, threads, owned=[(0x20f000, 0x20f008)])
    assert [(r.start, r.end, r.kind, r.thread) for r in roots if r.kind in ("stack", "tls")] == [
        (0x20e000 - 128, 0x20f000, "stack", 2), (0x20f008, 0x211000, "tls", 2), (0x21f000 - 128, 0x221000, "stack", 3)]


def test_a_root_of_one_word_is_scanned_alone():
    """A root shorter than the scan's least read (16 bytes) reaches through its own word only, never the
    next one."""
    chunks = {0x0: 0x40, 0x40: 0x40}
    mem, blocks, _ = _image(chunks, {}, {DATA: HEAP + 0x10, DATA + 8: HEAP + 0x50})
    lk = find_leaks(scan(mem, blocks, [Root(DATA, DATA + 8, "anonymous")]))
    assert _leaked(blocks, lk) == [0x40]


def _program(base: int) -> bytes:
    """The first page of a program whose headers put its code at BASE and its data (0x100 bytes from the
    file) and bss at BASE + 0x1000 to BASE + 0x3800."""
    ehdr = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 64, 0, 0, 64, 56, 2, 64, 0, 0)
    code = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, 0x1000, 0x1000, 0x1000)
    data = struct.pack("<IIQQQQQQ", 1, 6, 0x1000, 0x1000, 0x1000, 0x100, 0x2800, 0x1000)
    return (ehdr + code + data).ljust(0x1000, b"\0")


def test_a_programs_bss_next_to_a_threads_stack_is_a_root_whole():
    """glibc 2.42+ guards a thread's stack inside its mapping, so a stack mapped right above the program's
    bss makes one writable stretch with it: the bss is still a root, whole, and only the stack below its
    thread's stack pointer is dead."""
    base = 0x555555554000
    space = MemoryMap([Mapping(base, base + 0x2000, 0, "/opt/prog")], [(base, base + 0x20000)], None, True,
                      [(base + 0x1000, base + 0x20000)])
    thread = ThreadRegs(2, 2, base + 0x1f6c0, sp=base + 0x1e000)
    images = image_data(ImageMemory({base: _program(base)}), space)
    assert images == [(base + 0x1000, base + 0x4000, "prog")]
    roots = root_regions(space, [thread], owned=[], images=images)
    assert [(r.start - base, r.end - base, r.kind) for r in roots] == [
        (0x1000, 0x4000, "data"), (0x1e000 - 128, 0x20000, "stack")]
    assert roots[0].label == "data of prog"
    unaware = root_regions(space, [thread], owned=[])        # what the stack's rule alone would keep
    assert [(r.start - base, r.kind) for r in unaware] == [(0x1e000 - 128, "stack")]


def test_text_is_judged_alike_in_c_in_numpy_and_byte_by_byte():
    """`begins_with_text` in C, in numpy (eight bytes at once) and byte by byte agree, on every byte value in
    every position and on random words."""
    rng = np.random.default_rng(11)
    printable = int.from_bytes(b"abcdefgh", "little")
    edge = [printable & ~(0xFF << (8 * b)) | (c << (8 * b)) for b in range(8) for c in range(256)]
    words = np.concatenate([np.array(edge, dtype=np.uint64), rng.integers(0, 2 ** 64 - 1, 20000, dtype=np.uint64),
                            rng.integers(0x20, 0x7f, (20000, 8)).astype(np.uint8).view(np.uint64).ravel()])

    def by_bytes(w: int) -> bool:
        b = w.to_bytes(8, "little")
        return all(0x20 <= c <= 0x7E for c in b[:4]) and all(0x20 <= c <= 0x7E or c == 0 for c in b[4:])

    expected = [by_bytes(int(w)) for w in words]
    assert begins_with_text(words, native=False).tolist() == expected
    assert begins_with_text(words).tolist() == expected
    assert sum(expected) > 20000
