"""The kinds of findings only jemalloc has, beside those every allocator may meet (`heapwalk.common.findings`)."""

from __future__ import annotations

from heapwalk.common import findings

__all__ = ["Kind"]


class Kind(findings.Kind):
    """A kind of finding of jemalloc's state (the shared kinds are inherited)."""


Kind.NO_DECAY = Kind("no_decay", "dirty pages that never decay: no thread of the arena holds a decay ticker")
Kind.BIN_SHARDS = Kind("bin_shards", "bins that do not count what their slabs hold: sharded (opt.bin_shards) or "
                                   "damaged")
Kind.TSD = Kind("tsd", "a thread's tsd (jemalloc's thread state) holds what jemalloc never sets")
