"""What the memory in use is: the program's blocks grouped by size (powers of two, in all and per arena) and
by signature (`signed.signatures`: a vtable, a type object, text), each group with how much of it is leaked
when a leak scan ran; and the scan's totals the report's verdict weighs.  The report shows these, its JSON
carries them, and `heapwalk diff` compares them between two snapshots."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from heapwalk.analysis.leakreport import text_at
from heapwalk.analysis.leaks import TEXT, Leaks, arena_rows, signature_name
from heapwalk.analysis.signed import TEXT_CODE, Signed
from heapwalk.analysis.tally import tally
from heapwalk.inferior.memory import Memory
from heapwalk.common.view import Blocks

__all__ = ["UsedBucket", "UsedSignature", "LeakTotals", "InUse", "in_use_of", "leak_totals", "size_buckets",
           "SIGNATURES_KEPT"]

#: the signature groups a report keeps (the biggest by bytes); the text shows fewer
SIGNATURES_KEPT = 1000


@dataclass(frozen=True)
class UsedBucket:
    """Blocks in use of sizes [low, high): how many and their bytes, and how many of them are leaked."""

    low: int
    high: int
    count: int
    bytes: int
    leaked_count: int = 0
    leaked_bytes: int = 0


@dataclass(frozen=True)
class UsedSignature:
    """Blocks in use that begin alike (NAME: the symbol or file+offset their first word points to, or
    "text"): how many, their bytes, how many are leaked, and one of them."""

    name: str
    count: int
    bytes: int
    leaked_count: int
    leaked_bytes: int
    example: int
    text: str = ""            # the text group's example: its first characters


@dataclass(frozen=True)
class LeakTotals:
    """What a leak scan found, in numbers: blocks in use and leaked (count, bytes), the unreferenced among
    the leaked, each arena's leaked (number -> count, bytes), and the bytes of roots and heaps it could not
    read (chunks reached only through them count as leaked)."""

    in_use_count: int
    in_use_bytes: int
    leaked_count: int
    leaked_bytes: int
    unreferenced_count: int
    per_arena: dict[int, tuple[int, int]] = field(default_factory=dict)
    unread_bytes: int = 0


@dataclass(frozen=True)
class InUse:
    """The blocks in use by size (in all, and per arena number) and by signature (the biggest
    SIGNATURES_KEPT groups; TRUNCATED when there were more).  Signatures are known only when the
    blocks' first words were read (by a leak scan)."""

    count: int
    bytes: int
    histogram: tuple[UsedBucket, ...]
    per_arena: dict[int, tuple[UsedBucket, ...]]
    signatures: tuple[UsedSignature, ...] | None = None
    truncated: bool = False


def leak_totals(lk: Leaks) -> LeakTotals:
    """LK's totals (see `LeakTotals`)."""
    unread = sum(hi - lo for lo, hi in lk.reach.unread)
    return LeakTotals(lk.in_use_count, lk.in_use_bytes, lk.leaked_count, lk.leaked_bytes, lk.unreferenced_count,
                      {a.number: (a.leaked_count, a.leaked_bytes) for a in lk.arenas}, unread)


def size_buckets(sizes: np.ndarray, leaked: np.ndarray | None = None) -> tuple[UsedBucket, ...]:
    """SIZES (int64) in power-of-two buckets (the smallest [32, 64)), each with how many of them LEAKED
    (a mask) holds."""
    return _bucketed(sizes, None, 1, leaked)[0]


def _bucketed(sizes: np.ndarray, group: np.ndarray | None, groups: int, leaked: np.ndarray | None
              ) -> list[tuple[UsedBucket, ...]]:
    """SIZES in power-of-two buckets for each of GROUPS groups (GROUP: each size's, 0 to GROUPS - 1; None: all
    0), counted at once (`tally`: one slot per group and exponent), with LEAKED's share."""
    if leaked is not None and not leaked.any():
        leaked = None
    counts, total, gone, gone_bytes = tally(sizes, group, 64 * groups, leaked, by_exponent=True)
    out: list[list[UsedBucket]] = [[] for _ in range(groups)]
    for k in np.flatnonzero(counts).tolist():
        e = k % 64
        out[k // 64].append(UsedBucket(1 << e, 2 << e, int(counts[k]), int(total[k]), int(gone[k]),
                                       int(gone_bytes[k])))
    return [tuple(rows) for rows in out]


def in_use_of(blocks: Blocks, leaked: np.ndarray | None = None, signed: Signed | None = None,
              images: Sequence[tuple[int, int, str]] = (), symbol: Callable[[int], str | None] | None = None,
              mem: Memory | None = None) -> InUse:
    """BLOCKS grouped by size and (when their signatures, SIGNED, are given) by signature, with the LEAKED mask's share of
    each group; IMAGES are the loaded files' read-only mappings, SYMBOL names an address, MEM gives the text
    group's example its first characters."""
    sizes = blocks.sizes()
    numbers, arena = arena_rows(blocks)
    per_arena = dict(zip(numbers.tolist(), _bucketed(sizes, arena, len(numbers), leaked)))
    sigs, truncated = None, False
    if signed is not None:
        sigs, truncated = _signature_groups(blocks, signed, sizes, leaked, images, symbol)
        if mem is not None:
            sigs = tuple(_with_text(g, mem, blocks.header) for g in sigs)
    return InUse(blocks.count, int(sizes.sum()), _merged(per_arena.values()), per_arena, sigs, truncated)


def _merged(parts) -> tuple[UsedBucket, ...]:
    """The buckets of every arena's PARTS added up."""
    out: dict[int, list[int]] = {}
    for rows in parts:
        for b in rows:
            row = out.setdefault(b.low, [0, 0, 0, 0])
            for i, v in enumerate((b.count, b.bytes, b.leaked_count, b.leaked_bytes)):
                row[i] += v
    return tuple(UsedBucket(low, 2 * low, *row) for low, row in sorted(out.items()))


def _with_text(g: UsedSignature, mem: Memory, header: int) -> UsedSignature:
    return replace(g, text=text_at(mem, g.example + header)) if g.name == TEXT else g


def _signature_groups(blocks: Blocks, signed: Signed, sizes: np.ndarray, leaked: np.ndarray | None,
                      images: Sequence[tuple[int, int, str]], symbol: Callable[[int], str | None] | None
                      ) -> tuple[tuple[UsedSignature, ...], bool]:
    """The BLOCKS with a signature (SIGNED's) grouped by it, most bytes first, the biggest SIGNATURES_KEPT of
    them named; and whether there were more."""
    values, counts, total, gone, gone_bytes, first = _by_signature(signed, sizes, leaked)
    n = len(values)
    order = np.lexsort((values, -total))[:SIGNATURES_KEPT]
    out = []
    for i in order.tolist():
        key = TEXT if int(values[i]) == 1 else int(values[i])
        out.append(UsedSignature(signature_name(key, images, symbol), int(counts[i]), int(total[i]), int(gone[i]),
                                 int(gone_bytes[i]), int(blocks.addresses(first[i]))))
    return tuple(out), n > SIGNATURES_KEPT


def _by_signature(signed: Signed, sizes: np.ndarray, leaked: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """Each signature (1 for text, first), its blocks' count and bytes, LEAKED's count and bytes among them, and
    its first block.  The text group, often most blocks, is summed on masks; the others are grouped with
    np.unique (by code, then named by the value each code stands for)."""
    sigs = signed.codes
    rows = np.flatnonzero(sigs > TEXT_CODE)
    kinds, first, inverse = np.unique(sigs[rows], return_index=True, return_inverse=True)
    values = signed.values[kinds]
    first = rows[first]
    n = len(values)
    counts = np.bincount(inverse, minlength=n)
    total = np.bincount(inverse, weights=sizes[rows], minlength=n).astype(np.int64)
    if leaked is not None:
        mask = leaked[rows]
        gone = np.bincount(inverse[mask], minlength=n)
        gone_bytes = np.bincount(inverse[mask], weights=sizes[rows][mask], minlength=n).astype(np.int64)
    else:
        gone = gone_bytes = np.zeros(n, dtype=np.int64)
    text = sigs == TEXT_CODE
    if text.any():
        text_gone = text & leaked if leaked is not None else np.zeros(len(sigs), dtype=bool)
        values = np.concatenate(([1], values)).astype(np.uint64)
        first = np.concatenate(([int(np.argmax(text))], first))
        counts = np.concatenate(([int(np.count_nonzero(text))], counts))
        total = np.concatenate(([int(sizes.sum(where=text))], total))
        gone = np.concatenate(([int(np.count_nonzero(text_gone))], gone))
        gone_bytes = np.concatenate(([int(sizes.sum(where=text_gone))], gone_bytes))
    return values, counts, total, gone, gone_bytes, first
