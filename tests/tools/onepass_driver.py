"""Decodes each core twice, through the one pass (`heapwalk.glibc.bulk.onepass`) and through the careful
walkers alone, and prints one JSON line per core saying whether the two agree (sourced by tests/cores/glibc/test_onepass.py).
The cores are the [program, core] pairs of the JSON list in $HEAPWALK_ONEPASS_CORES, opened one after the
other in this gdb; with none, the core gdb has loaded.

Agreeing means the same arenas (every list, chunk by chunk, and every finding), the same accounts and trim
estimates, and the same findings of the walk.  The line also says which arenas the one pass vouched for, so
the test can tell a sound core (all of them) from a damaged one (the careful walkers took it).  With
$HEAPWALK_ONEPASS_DAMAGE set, each core is also compared with one thread arena's heap damaged: the one pass
must then vouch for every other arena.  With $HEAPWALK_ONEPASS_AHEAD set, every arena is swept ahead on a thread
of heapwalk's own however small (`ahead.AHEAD_FROM`), as a big one is, by the decode and by `heapwalk chunks`.
"""

from __future__ import annotations

import json
import os
import sys

import gdb
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gdb sets __file__ for a sourced script
from fuzz_driver import MutatedMemory  # noqa: E402
from je_fuzz_driver import _word  # noqa: E402

from heapwalk.analysis import reach
from heapwalk.glibc.account.blocks import blocks_of
from heapwalk.analysis.leaks import find_leaks
from heapwalk.inferior.roots import image_data, register_roots, root_regions

from heapwalk.gdb.session import _target
from heapwalk.glibc.locate.discovery import Overrides
from heapwalk.glibc.forensics import chunkinfo
from heapwalk.glibc.bulk import ahead, native, onepass
from heapwalk.glibc.bulk.runs import FENCE_GAP, GAP
from heapwalk.glibc.decode import collect
from heapwalk.glibc.locate.discovery import discover


def _decode(target, disc, sweep: bool, walk: bool = True, keep_used: bool = False, mem=None,
            keep_chunks: bool = False):
    space = target.space
    return collect(target.mem if mem is None else mem, disc, target.threads, target.description, walk,
                   space.regions, sweep=sweep, keep_used=keep_used, keep_chunks=keep_chunks)


def _one_arena_damaged(target, disc, vouched: list[int]) -> dict:
    """The same comparison with one thread arena damaged, two ways: a chunk's size halfway through its heap
    made 0 ("damaged"), and the first chunk of one of its bins linked to a chunk another arena holds in use
    ("crossed": that arena must then be walked carefully too).  The one pass must vouch for every other
    arena and give what the careful walkers give for all of them."""
    sound = _decode(target, disc, True, keep_chunks=True)
    thread_arenas = [a for a in sound.arenas if not a.is_main and a.address in sound.walk.chunks]
    if len(thread_arenas) < 2:
        return {}
    arena = thread_arenas[len(thread_arenas) // 2]
    addresses, codes = _kept_chunks(sound.walk.chunks[arena.address])
    in_use = np.flatnonzero(codes == onepass.PLAIN)
    chunk = int(addresses[in_use[len(in_use) // 2]])
    line = _damaged_line("damaged", target, disc, vouched, MutatedMemory(target.mem, _word(chunk + 8, 0)), {chunk})
    other = thread_arenas[len(thread_arenas) // 2 - 1]
    mine = next((b for b in arena.bins if b.count >= 2), None)
    theirs, their_codes = _kept_chunks(sound.walk.chunks[other.address])
    held = np.flatnonzero(their_codes == onepass.PLAIN)
    if mine is not None and len(held):
        first, foreign = int(mine.chunks[0]), int(theirs[held[len(held) // 2]])
        line.update(_damaged_line("crossed", target, disc, vouched, MutatedMemory(target.mem, _word(first + 16, foreign)),
                                  {first, foreign}))
    return line


def _kept_chunks(runs: dict) -> tuple[np.ndarray, np.ndarray]:
    """The chunks the one pass kept of an arena for its map (its heaps' `runs.HeapRuns`): each run's start and
    listing code, the runs between chunks (`runs.GAP`, `runs.FENCE_GAP`) left out."""
    starts = [r.bounds[1:len(r.labels) + 1] for r in runs.values()]
    labels = [r.labels for r in runs.values()]
    addresses, codes = np.concatenate(starts), np.concatenate(labels)
    chunk = (codes != GAP) & (codes != FENCE_GAP)
    return addresses[chunk], codes[chunk]


def _damaged_line(name: str, target, disc, vouched: list[int], mem, named: set[int]) -> dict:
    """NAME's counts: arenas, arenas vouched for, the differences against the careful walkers (the decode and
    the leak scan's blocks), whether the careful walkers name the damage at one of NAMED, and how many arenas
    gave the scan their in-use chunks from the pass."""
    vouched.clear()
    fast = _decode(target, disc, True, mem=mem, keep_used=True, keep_chunks=True)
    vouched_arenas = len(vouched)
    slow = _decode(target, disc, False, mem=mem)
    found = [f for f in slow.all_findings() if f.address in named]
    differences = _differences(fast, slow)
    kept, walked = blocks_of(mem, disc.layout, fast), blocks_of(mem, disc.layout, slow)
    for field in ("starts", "ends", "arena", "heaps", "unknown"):
        if not np.array_equal(np.asarray(getattr(kept, field)), np.asarray(getattr(walked, field))):
            differences.append(f"the leak scan's blocks ({field}) differ")
    scan_differences, covered = _scan_pair(target, disc, mem, fast, slow)
    return {f"{name}_arenas": len(fast.arenas), f"{name}_vouched": vouched_arenas,
            f"{name}_differences": differences + scan_differences, f"{name}_found": bool(found),
            f"{name}_used_kept": len(fast.walk.used or {}), f"{name}_rows_deferred": covered}


def _scans(target, disc) -> tuple[list[str], int]:
    """Whether the leak scan `report` runs (the rows of blocks reached when read not kept) on the blocks the one
    pass kept finds what the scan that keeps every row finds: the same reached blocks, signatures, leaked blocks
    and their rows; and how many edges it did not keep."""
    state = _decode(target, disc, True, keep_used=True)
    return _scan_pair(target, disc, target.mem, state, state)


def _scan_pair(target, disc, mem, fast, slow) -> tuple[list[str], int]:
    """The deferred scan of MEM with the blocks of decode FAST against the scan of SLOW's blocks that keeps every
    row and path: the differences, and how many edges the deferred scan did not keep."""
    blocks = blocks_of(mem, disc.layout, fast)
    roots = root_regions(target.space, target.threads, list(blocks.heaps) + list(blocks.private), blocks.large,
                         blocks.unknown, images=image_data(target.mem, target.space))
    registers = register_roots(target.threads)
    once = find_leaks(reach.scan(mem, blocks, roots, registers))
    twice = find_leaks(reach.scan(mem, blocks if slow is fast else blocks_of(mem, disc.layout, slow), roots,
                                  registers, paths=True))
    out = [] if np.array_equal(once.reach.reached, twice.reach.reached) else ["the leak scan's reached differ"]
    every = np.arange(blocks.count)
    if not np.array_equal(once.reach.signed.of(every), twice.reach.signed.of(every)):
        out.append("the leak scan's signatures differ")
    out += [f"the leaks' {name} differ" for name in ("leaked", "unreferenced", "holds_count", "holds_bytes")
            if not np.array_equal(getattr(once, name), getattr(twice, name))]
    if _leaked_rows(once) != _leaked_rows(twice):
        out.append("the leaked blocks' rows differ")
    return out, len(twice.reach.graph.targets) - len(once.reach.graph.targets)


def _leaked_rows(lk) -> list[tuple[int, int]]:
    return list(zip(*(part.tolist() for part in lk.reach.graph.rows_of(lk.leaked))))


def _differences(fast, slow) -> list[str]:
    out = []
    if fast.arenas != slow.arenas:
        for a, b in zip(fast.arenas, slow.arenas):
            if a != b:
                out.append(f"arena {a.number} differs")
        if len(fast.arenas) != len(slow.arenas):
            out.append("arena counts differ")
    if dict(fast.walk.accounts) != dict(slow.walk.accounts):
        out += [f"account of {k:#x} differs: {fast.walk.accounts.get(k)} != {slow.walk.accounts.get(k)}"
                for k in slow.walk.accounts if fast.walk.accounts.get(k) != slow.walk.accounts[k]]
    if dict(fast.walk.trims) != dict(slow.walk.trims):
        out += [f"trim of {k:#x} differs: {fast.walk.trims.get(k)} != {slow.walk.trims[k]}"
                for k in slow.walk.trims if fast.walk.trims.get(k) != slow.walk.trims[k]]
    for name in ("findings", "mmapped", "interrupted"):
        if getattr(fast.walk, name) != getattr(slow.walk, name):
            out.append(f"walk.{name} differs")
    if fast.all_findings() != slow.all_findings():
        out.append("findings differ")
    return out


def _compare(vouched: list[int]) -> dict:
    target = _target()
    disc = discover(target.mem, target.symbols, Overrides(), target.space.mappings,
                    [t.thread_pointer for t in target.threads if t.thread_pointer], core=target.space.core,
                    regions=target.space.regions)
    scan_differences, covered = _scans(target, disc)
    vouched.clear()
    fast = _decode(target, disc, True)
    slow = _decode(target, disc, False)
    differences = _differences(fast, slow) + scan_differences
    # the lists alone, every arena swept however small (a decode without the walk sweeps only big ones)
    onepass.LISTS_SWEPT_FROM, kept = 0, onepass.LISTS_SWEPT_FROM
    try:
        lists = _decode(target, disc, True, walk=False)
    finally:
        onepass.LISTS_SWEPT_FROM = kept
    unswept = _decode(target, disc, False, walk=False)
    if lists.arenas != unswept.arenas or lists.all_findings() != unswept.all_findings():
        differences.append("the lists alone differ")
    swept_arenas = 0
    for flt in (chunkinfo.ChunkFilter(), chunkinfo.ChunkFilter(free=True, min_size=0x30, max_size=0x400)):
        rows, swept_arenas = _chunk_rows(target, disc, unswept, flt, sweep=True)
        if rows != _chunk_rows(target, disc, unswept, flt, sweep=False)[0]:
            differences.append(f"heapwalk chunks differs ({flt})")
    line = {"arenas": len(slow.arenas), "vouched": len(vouched), "differences": differences,
            "chunks_swept": swept_arenas, "rows_deferred": covered}
    if os.environ.get("HEAPWALK_ONEPASS_DAMAGE"):
        line.update(_one_arena_damaged(target, disc, vouched))
    return line


def _chunk_rows(target, disc, state, flt, sweep: bool) -> tuple[tuple, int]:
    """What `heapwalk chunks` lists of STATE (every arena's chunks FLT admits, the batch counts and sums, the
    walk's findings), with arenas swept where they can be or all walked carefully; and how many were swept."""
    real, swept = chunkinfo.swept_chunks, []

    def spy(*args):
        result = real(*args) if sweep else None
        swept.extend([] if result is None else [1])
        return result

    chunkinfo.swept_chunks = spy
    try:
        findings: list = []
        batches = [(m.arena.address, m.count, m.total, tuple(m.chunks()), tuple(m.chunks(2)))
                   for m in chunkinfo.matching(target.mem, disc.layout, state, flt, findings)]
        counts = [(address, sum(b[1] for b in batches if b[0] == address),
                   sum(b[2] for b in batches if b[0] == address)) for address in dict.fromkeys(b[0] for b in batches)]
        rows = tuple(c for b in batches for c in b[3])
        firsts = all(b[4] == b[3][:2] and b[1] == len(b[3]) and b[2] == sum(c.size for c in b[3])
                     for b in batches)
        return (rows, tuple(counts), firsts, tuple(findings)), len(swept)
    finally:
        chunkinfo.swept_chunks = real


def main() -> None:
    vouched: list[int] = []
    real = onepass.OnePass.results

    def spy(self, arenas):
        result = real(self, arenas)
        vouched.extend(sorted(result) if result else [])
        return result

    onepass.OnePass.results = spy
    if os.environ.get("HEAPWALK_ONEPASS_AHEAD"):
        ahead.AHEAD_FROM = 0
    pairs = json.loads(os.environ.get("HEAPWALK_ONEPASS_CORES", "[]")) or [None]
    for pair in pairs:
        if pair is not None:
            gdb.execute(f"file {pair[0]}", to_string=True)
            gdb.execute(f"core-file {pair[1]}", to_string=True)
        try:
            line = _compare(vouched)
        except Exception as exc:  # the test shows it, with the core it came from
            line = {"error": f"{type(exc).__name__}: {exc}"}
        line["core"] = pair[1] if pair else ""
        line["native"] = native.NATIVE
        print("heapwalk-onepass " + json.dumps(line))


main()
