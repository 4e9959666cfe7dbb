"""An arena's account and trim estimate summed from its `Sweep`, without walking its memory again.

With every chunk's address and size field in arrays and each one's listing code (`indexlists`), what the
careful walk (`chunkwalk.account` with `trim.TrimSimulation`) computes chunk by chunk is a few operations on
whole arrays: the state of each chunk, the checks glibc relies on between neighbours (a binned chunk is
followed by a clear PREV_INUSE, any other chunk by a set one; a chunk the program or a tcache or fastbin
holds carries its arena's NON_MAIN_ARENA bit), the bytes and counts per state, and the runs of free chunks
malloc_trim would consolidate.  The result is used only when every check holds and the bytes add up to
system_mem: then the careful walk would have found nothing either, and gives the same numbers.  Anything
else gives None, and the careful walk takes the arena (and says what is wrong).
"""

from __future__ import annotations

import numpy as np

from heapwalk.glibc.walk.chunks import Tally
from heapwalk.analysis.tally import tally as count_and_sum
from heapwalk.glibc.bulk.indexlists import PLAIN
from heapwalk.glibc.bulk.native import free_runs
from heapwalk.glibc.locate.layout import NON_MAIN_ARENA, Layout
from heapwalk.glibc.model import Account, Arena, ChunkState, TrimEstimate
from heapwalk.glibc.bulk.sweep import TAIL_FENCEPOST, TAIL_LEFTOVER, TAIL_ZERO, Sweep
from heapwalk.glibc.walk.trim import PAGE, PagesSeen, TrimSimulation
from heapwalk.inferior.memory import Memory
from heapwalk.inferior.residency import Residency

__all__ = ["walk_of_sweep", "tally_of_sweep", "STATE_OF_CODE", "TCACHE_STRUCT_CODE", "TCACHE_CODE", "FENCEPOST_CODE"]

TCACHE_STRUCT_CODE, TCACHE_CODE, _FAST, _TOP, FENCEPOST_CODE = 0, 1, 2, 6, 7
#: each listing code's chunk state
STATE_OF_CODE = {PLAIN: ChunkState.IN_USE, 0: ChunkState.TCACHE_STRUCT, 1: ChunkState.TCACHE, 2: ChunkState.FAST,
                  3: ChunkState.UNSORTED, 4: ChunkState.SMALL, 5: ChunkState.LARGE, _TOP: ChunkState.TOP,
                  FENCEPOST_CODE: ChunkState.FENCEPOST}


def walk_of_sweep(mem: Memory, layout: Layout, arena: Arena, sweep: Sweep, codes: np.ndarray,
                  tcached: tuple[np.ndarray, np.ndarray], thp_pagesize: int, main_contiguous: bool,
                  residency: Residency | None = None, seen: PagesSeen | None = None, page: int = PAGE
                  ) -> tuple[Account, TrimEstimate] | None:
    """ARENA's account and trim estimate from SWEEP and CODES (each chunk's listing code, changed in place),
    with the tcache chunks TCACHED (sorted chunk addresses, and each one's code) and RESIDENCY (which pages
    were in RAM, when known) or else SEEN (the pages the sweep judged), the target's pages being PAGE bytes; None
    where the careful walk has something to say."""
    if not _mark_tcached(sweep, codes, tcached):
        return None
    sizes = sweep.sizes
    tally = tally_of_sweep(arena, sweep, codes, sizes)
    if tally is None:
        return None
    sim = TrimSimulation(mem, layout, arena, thp_pagesize, main_contiguous and not arena.noncontiguous, residency,
                         seen, page)
    _feed_runs(sim, sweep, codes, sizes, layout.has_fastbins, tally.bytes[ChunkState.TCACHE])
    return tally.account(), sim.result()


def tally_of_sweep(arena: Arena, sweep: Sweep, codes: np.ndarray, sizes: np.ndarray) -> Tally | None:
    """ARENA's bytes and counts per state from SWEEP, CODES (each chunk's listing code, tcache chunks marked
    already; top and fenceposts are marked here) and SIZES; None when top or a fencepost is not where glibc
    leaves it, neighbours disagree (`_neighbours_agree`) or the bytes do not add up to system_mem."""
    if not _mark_top_and_tails(sweep, codes, arena.top):
        return None
    if not _neighbours_agree(sweep, codes, 0 if arena.is_main else NON_MAIN_ARENA):
        return None
    tally = Tally(arena.address, arena.system_mem)
    tally.overhead = sum(s.extent.first - s.extent.start + s.tail for s in sweep.segments)
    present, total, _, _ = count_and_sum(sizes, codes.astype(np.int32), 256)
    for code in np.flatnonzero(present).tolist():
        state = STATE_OF_CODE[code]
        tally.counts[state] += int(present[code])
        tally.bytes[state] += int(total[code])
    return tally if tally.accounted == arena.system_mem else None


def _mark_tcached(sweep: Sweep, codes: np.ndarray, tcached: tuple[np.ndarray, np.ndarray]) -> bool:
    """Gives the tcache chunks (and tcache structs) in the sweep's extents their codes; False when one is not
    a chunk the sweep met, or a list holds it too."""
    chunks, their_codes = tcached
    if not len(chunks):
        return True
    address = sweep.address
    for segment in sweep.segments:
        lo = np.searchsorted(chunks, np.uint64(segment.extent.first))
        hi = np.searchsorted(chunks, np.uint64(segment.extent.end))
        if lo == hi:
            continue
        inside, code = chunks[lo:hi], their_codes[lo:hi]
        at = np.searchsorted(address, inside)
        if np.any(at >= len(address)) or np.any(address[at] != inside) or np.any(codes[at] != PLAIN):
            return False
        codes[at] = code
    return True


def _mark_top_and_tails(sweep: Sweep, codes: np.ndarray, top: int) -> bool:
    """Codes for top and for the fenceposts that end an old heap; False where they are not as glibc leaves
    them (top not the last chunk of its heap, a list holding a fencepost)."""
    for segment in sweep.segments:
        if segment.lo == segment.hi:
            return False
        last = segment.hi - 1
        code = int(codes[last])
        if segment.kind == TAIL_FENCEPOST or segment.kind == TAIL_LEFTOVER and code == PLAIN:
            if code != PLAIN:
                return False
            codes[last] = FENCEPOST_CODE
        elif segment.kind == TAIL_ZERO or segment.kind == TAIL_LEFTOVER:
            if 3 <= code <= 5:
                return False             # a binned chunk before a fencepost whose PREV_INUSE is set
        elif int(sweep.address[last]) != top or code != PLAIN:
            return False
        else:
            codes[last] = _TOP
    return True


def _neighbours_agree(sweep: Sweep, codes: np.ndarray, want_bit: int) -> bool:
    """Whether every chunk but a heap's last is followed by a chunk whose PREV_INUSE says what it is (clear
    after a binned chunk, set after any other), and every held chunk has the arena's NON_MAIN_ARENA bit."""
    fields = sweep.field
    binned = (codes >= 3) & (codes <= 5)
    inuse_after = (fields[1:] & np.uint64(1)).astype(bool)
    agree = inuse_after != binned[:-1]
    for segment in sweep.segments[:-1]:
        agree[segment.hi - 1] = True     # the last chunk of a heap has no neighbour after it
    if not bool(agree.all()):
        return False
    held = (codes <= _FAST) | (codes == PLAIN)
    bits = (fields & np.uint64(NON_MAIN_ARENA)).astype(bool)
    return not bool(np.any(held & (bits != bool(want_bit))))


def _feed_runs(sim: TrimSimulation, sweep: Sweep, codes: np.ndarray, sizes: np.ndarray, consolidate: bool,
               tcache: int) -> None:
    """Gives SIM the runs of free chunks consolidation would merge, heap by heap (see `TrimSimulation`), and the
    TCACHE bytes."""
    run_lo = _FAST if consolidate else 3
    runs: list[tuple[int, int]] = []
    sub_page = 0
    for segment in sweep.segments:
        lo, hi = segment.lo, segment.hi
        found = free_runs(codes, sizes, lo, hi, run_lo, 6, _FAST)
        starts, ends, run_sizes, has_fast = _free_runs(codes, sizes, lo, hi, run_lo) if found is NotImplemented \
            else found
        if not len(starts):
            continue
        merged = np.zeros(len(starts), dtype=bool)
        if ends[-1] < hi and codes[ends[-1]] == _TOP and has_fast[-1]:
            merged[-1] = True            # consolidation takes the run into top
            sim.top_start, sim.top_size = int(sweep.address[starts[-1]]), sim.top_size + int(run_sizes[-1])
        small = (run_sizes <= sim.sub_page) & ~merged
        sub_page += int(run_sizes[small].sum())
        large = np.flatnonzero(~small & ~merged)
        runs.extend(zip(sweep.address[starts[large]].tolist(), run_sizes[large].tolist()))
    sim.take(runs, sub_page, tcache)


def _free_runs(codes: np.ndarray, sizes: np.ndarray, lo: int, hi: int, run_lo: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`native.free_runs` of the binned codes from RUN_LO on, in numpy."""
    runnable = (codes[lo:hi] >= run_lo) & (codes[lo:hi] <= 5)
    edges = np.diff(np.concatenate(([0], runnable.view(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    total = np.concatenate(([0], np.cumsum(sizes[lo:hi])))
    fasts = np.concatenate(([0], np.cumsum(codes[lo:hi] == _FAST)))
    return starts + lo, ends + lo, total[ends] - total[starts], fasts[ends] > fasts[starts]
