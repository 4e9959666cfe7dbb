"""mimalloc's bitmaps read as Python integers (bit I: slice, block or segment I): their set bits counted, and
their runs of set bits."""

from __future__ import annotations

__all__ = ["bit_runs", "bits_in"]


def bits_in(bits: int, first: int, count: int) -> int:
    """How many of BITS' bits FIRST to FIRST + COUNT are set."""
    return bin((bits >> first) & ((1 << count) - 1)).count("1")


def bit_runs(bits: int) -> list[tuple[int, int]]:
    """The runs of set bits of BITS, as (first, one past the last)."""
    out, i = [], 0
    while bits:
        skip = (bits & -bits).bit_length() - 1
        i += skip
        bits >>= skip
        n = (~bits & (bits + 1)).bit_length() - 1
        out.append((i, i + n))
        i += n
        bits >>= n
    return out
