"""Which thread of the target each tcmalloc thread cache belongs to: up to 2.15 the cache keeps its thread's
pthread_t (`tid_`), which is the thread's TCB, its thread pointer; from 2.16 it does not, and the thread's own
thread-local pointer to its cache, in the static TLS just below its TCB, says it instead."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from heapwalk.inferior.elf import readable_runs
from heapwalk.inferior.memory import Memory

__all__ = ["cache_owners", "TLS_WINDOW"]

#: bytes of static TLS below a thread's TCB searched for its pointer to its cache
TLS_WINDOW = 64 << 10


def cache_owners(mem: Memory, caches: Sequence[tuple[int, int | None]], threads: Sequence) -> dict[int, object]:
    """Cache address -> the target thread (a `heapwalk.inferior.threads` thread) it belongs to, for CACHES given
    as (address, tid_ or None); caches whose thread is not found are left out."""
    by_tcb = {t.thread_pointer: t for t in threads if t.thread_pointer}
    out = {at: by_tcb[tid] for at, tid in caches if tid is not None and tid in by_tcb}
    wanted = np.array([at for at, tid in caches if tid is None], dtype=np.uint64)
    if not len(wanted):
        return out
    for thread in by_tcb.values():
        found: set[int] = set()
        low = max(thread.thread_pointer - TLS_WINDOW, 0)
        for at, data in readable_runs(mem, low, thread.thread_pointer - low):
            words = np.frombuffer(bytes(data[:len(data) // 8 * 8]), dtype=np.uint64)
            found.update(int(w) for w in words[np.isin(words, wanted)].tolist())
        if len(found) == 1:
            out.setdefault(found.pop(), thread)
    return out
