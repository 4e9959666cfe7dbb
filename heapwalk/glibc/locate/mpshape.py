"""mp_ (malloc_par) in memory without symbols: a malloc_par whose fields are all in range, near main_arena,
ranked by what else agrees with it (sbrk_base where the main arena's memory starts, malloc_stats's code reading
its mmapped_mem); no field is expected to hold glibc's default, since programs and tunables change every one of
them.  A tcache field no setting can give (a stray write over mp_) is kept on strong evidence and named."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from heapwalk.arch import USER_SPACE_END
from heapwalk.glibc.locate.heuristics import read_segment
from heapwalk.glibc.locate.layout import MP_INT_FIELDS, Layout, layout_for
from heapwalk.inferior.elf import ElfImage
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["MpAnchors", "MpCandidate", "MP_SETTABLE", "mp_plausible", "mp_impossible", "mp_evidence", "find_mp",
           "mp_variant_at"]

_PAGE = 4096


def _mp_values(raw: bytes, layout: Layout, at: int) -> dict[str, int]:
    return {name: struct.unpack_from("<i" if name in MP_INT_FIELDS else "<Q", raw, at + off)[0]
            for name, off in layout.mp.items()}


def _pow2_or_zero(v: int) -> bool:
    return v == 0 or (v >= _PAGE and v & (v - 1) == 0)


@dataclass(frozen=True)
class MpAnchors:
    """What the rest of memory says mp_ must hold, so that a candidate is pinned down by agreement instead of
    by default values (which programs, mallopt, tunables and glibc's dynamic threshold all change).

    MAIN_START: where the main arena's contiguous memory begins (its top's end minus system_mem), which is
    mp_.sbrk_base; 0 when the main arena never grew; None when it is not contiguous or unreadable.
    MAIN_TOP: main_arena's top pointer.  STATS_LOADS: the addresses malloc_stats's code reads with 64-bit
    loads, one of which is mp_.mmapped_mem (empty when libc's code is not readable).
    """

    main_start: int | None = None
    main_top: int | None = None
    stats_loads: frozenset[int] = frozenset()


def mp_plausible(v: dict[str, int], top: int = USER_SPACE_END) -> bool:
    """Could V be a malloc_par of any program whose addresses end below TOP?  Only what no parameter can change
    is required: field types and ranges, and the invariants between the mmap counters (glibc 2.43 counts 16
    bytes too many in mmapped_mem for each mremap'd chunk, so it need not be page-granular)."""
    if not (1 <= v["arena_test"] < 1 << 40 and v["arena_max"] < 1 << 40 and v["mmap_threshold"] <= 1 << 33):
        return False
    if not (0 <= v["n_mmaps"] <= v["max_n_mmaps"] and v["no_dyn_threshold"] in (0, 1)):
        return False
    if v["mmapped_mem"] % 16 or v["max_mmapped_mem"] % 16 or not v["mmapped_mem"] <= v["max_mmapped_mem"] < top:
        return False
    if v["mmapped_mem"] < v["n_mmaps"] * _PAGE or v["sbrk_base"] >= top:
        return False
    if "hp_pagesize" in v and not (_pow2_or_zero(v["hp_pagesize"]) and _pow2_or_zero(v["thp_pagesize"])
                                   and v["hp_flags"] >= 0):
        return False
    return "thp_mode" not in v or 0 <= v["thp_mode"] <= 3


#: the tcache fields of malloc_par and the most glibc lets them hold (TCACHE_MAX_BINS with 2.42's large bins;
#: the largest tcache_max the tunable takes; MAX_TCACHE_COUNT): past these, a stray write put the value there
MP_SETTABLE = {"tcache_bins": 76, "tcache_max_bytes": (1 << 32) - 1, "tcache_count": 0xFFFF}


def mp_impossible(v: dict[str, int]) -> tuple[str, ...]:
    """The fields of the malloc_par V that hold what no setting of glibc's can put there."""
    return tuple(name for name, most in MP_SETTABLE.items() if name in v and not 0 <= v[name] <= most)


def mp_evidence(v: dict[str, int], address: int, layout: Layout, anchors: MpAnchors) -> tuple[str, ...] | None:
    """What else in memory agrees with the malloc_par V at ADDRESS under LAYOUT, strongest first; None when
    something contradicts it (its sbrk_base is not where the main arena's memory starts)."""
    out = []
    if address + layout.mp["mmapped_mem"] in anchors.stats_loads:
        out.append("malloc_stats reads its mmapped_mem")
    if anchors.main_start is not None:
        if v["sbrk_base"] != anchors.main_start:
            return None
        out.append("its sbrk_base is where the main arena's memory starts" if anchors.main_start
                   else "its sbrk_base is 0 and the main arena never grew")
    elif anchors.main_top and v["sbrk_base"] and v["sbrk_base"] <= anchors.main_top < v["sbrk_base"] + (1 << 40):
        out.append("its sbrk_base lies below main_arena's top")
    return tuple(out)


#: how much each kind of agreement counts when candidates are ranked
_EVIDENCE_WEIGHT = {"malloc_stats": 4, "its sbrk_base is where": 4, "its sbrk_base is 0": 2, "its sbrk_base lies": 1}


#: the weight of evidence that keeps a malloc_par with an impossible field (a code reference or the main arena's
#: start, not a top that merely lies above its sbrk_base)
_STRONG = 4


def _weight(evidence: tuple[str, ...]) -> int:
    return sum(w for e in evidence for prefix, w in _EVIDENCE_WEIGHT.items() if e.startswith(prefix))


@dataclass(frozen=True)
class MpCandidate:
    """A malloc_par that fits, the mp_ layout it fits under, and what agrees with it."""

    address: int
    variant: tuple[int, int]
    evidence: tuple[str, ...]
    impossible: tuple[str, ...] = ()    # fields no setting can give (a stray write): kept on strong evidence only


def find_mp(mem: Memory, image: ElfImage, main_arena: int, variants: list[tuple[int, int]],
            anchors: MpAnchors, window: int = 0x4000) -> MpCandidate | None:
    """The malloc_par within WINDOW bytes of main_arena that most of memory agrees with; among equals, the
    nearest to main_arena (glibc defines them side by side) and the first of VARIANTS."""
    best: tuple[tuple[int, int, int], MpCandidate] | None = None
    for seg in image.writable():
        lo = max(seg.address, main_arena - window) & ~7
        hi = min(seg.end, main_arena + window)
        if lo >= hi:
            continue
        raw = read_segment(mem, lo, hi - lo)
        for rank, variant in enumerate(variants):
            layout = layout_for(variant)
            for at in range(0, len(raw) - layout.mp_size + 1, 8):
                address = lo + at
                if address <= main_arena < address + layout.mp_size:
                    continue
                v = _mp_values(raw, layout, at)
                if not mp_plausible(v, image.arch.user_space_end):
                    continue
                evidence = mp_evidence(v, address, layout, anchors)
                if evidence is None:
                    continue
                bad = mp_impossible(v)
                if bad and (_weight(evidence) < _STRONG or rank):    # only the version's own layout, on strong
                    continue                                            # evidence: else a misreading
                key = (_weight(evidence), -len(bad), -abs(main_arena - address), -rank)
                if best is None or key > best[0]:
                    best = (key, MpCandidate(address, variant, evidence, bad))
    return best[1] if best else None


def mp_variant_at(mem: Memory, address: int, variants, anchors: MpAnchors) -> MpCandidate | None:
    """Which of VARIANTS (mp_ layouts) the malloc_par at ADDRESS fits best (first wins a tie); None if none fits."""
    best = None
    for rank, variant in enumerate(variants):
        layout = layout_for(variant)
        try:
            raw = mem.read(address, layout.mp_size)
        except ReadError:
            continue
        v = _mp_values(raw, layout, 0)
        if not mp_plausible(v):
            continue
        evidence = mp_evidence(v, address, layout, anchors)
        bad = mp_impossible(v)
        key = (-1 if evidence is None else _weight(evidence), -len(bad), -rank)
        if best is None or key > best[0]:
            best = (key, MpCandidate(address, variant, evidence or (), bad))
    return best[1] if best else None
