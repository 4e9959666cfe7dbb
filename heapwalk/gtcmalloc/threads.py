"""The thread caches of Google's tcmalloc (where its per-CPU caches are off): its list, found from a cache a
thread's static TLS points at and held by a static word with the list's length beside it, walked."""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass

from heapwalk.common.findings import Finding, Severity, Kind
from heapwalk.gtcmalloc.find import Located
from heapwalk.gtcmalloc.layout import GtcLayout
from heapwalk.gtcmalloc.pageheaps import KIND
from heapwalk.inferior.elf import readable_runs
from heapwalk.inferior.memory import Memory, ReadError, u64

__all__ = ["ThreadCache", "thread_list", "read_threads"]


@dataclass(frozen=True)
class ThreadCache:
    """One thread cache: where it is, its thread (pthread_t), the bytes it holds, the LWP whose TLS points at it."""

    address: int
    thread: int
    bytes: int
    lwp: int | None


def thread_list(mem: Memory, located: Located, tls: list[tuple[int, int, int]]) -> tuple[int | None, dict]:
    """The thread caches' list: (its head or None, which LWP's static TLS points at each cache).  TLS: each
    thread's (LWP, start, end) of static TLS.  The head is found from a cache a thread's TLS points at (checked by
    its links), walked back, and taken where a static word holds it with the list's length beside it; no such
    word: no list (the per-CPU caches on, a thread's TLS still pointing at the cache it gave up)."""
    L, seen = located.layout, []
    for lwp, lo, hi in tls:
        for at, data in readable_runs(mem, lo, hi - lo):
            for k, word in enumerate(struct.unpack(f"<{len(data) // 8}Q", bytes(data[:len(data) // 8 * 8]))):
                if word > 1 << 16 and not word % 8 and _linked(mem, L, word):
                    seen.append((hi - at - 8 * k, lwp, word))
    # every thread keeps its pointer at the same place in its static TLS: that place's pointers first
    common = Counter(offset for offset, _, _ in seen).most_common(1)
    owners: dict[int, int] = {}
    for offset, lwp, word in sorted(seen, key=lambda s: s[0] != (common[0][0] if common else None)):
        owners.setdefault(word, lwp)
    for head in {_head(mem, L, at) for at in owners} - {None}:
        length = len(_list(mem, L, head, []))
        for at in located.holders(head):
            try:
                if struct.unpack("<i", mem.read(at + L.thread_count, 4))[0] == length:
                    return head, owners
            except ReadError:
                continue
    return None, owners


def read_threads(mem: Memory, located: Located, threads: tuple[int | None, dict], findings: list) -> list[ThreadCache]:
    """The thread caches on the list from its head."""
    head, owners = threads
    L = located.layout
    if head is None:
        if located.cpu_cache is None:
            findings.append(Finding(Severity.WARNING, located.transfer, "the thread caches", "the per-CPU caches "
                                    "are off and no thread's TLS leads to tcmalloc's list of thread caches: what "
                                    "they hold is counted as in use", KIND))
        return []
    out = []
    for at in _list(mem, L, head, findings):
        try:
            out.append(ThreadCache(at, u64(mem, at + L.thread_tid), u64(mem, at + L.thread_size), owners.get(at)))
        except ReadError:
            findings.append(Finding(Severity.ERROR, at, "a thread cache", "it cannot be read", Kind.UNMAPPED))
            break
    return out


def _head(mem: Memory, L: GtcLayout, at: int) -> int | None:
    """The first cache of the list AT is on."""
    seen = {at}
    try:
        while (prev := u64(mem, at + L.thread_next + 8)) and prev not in seen:
            seen.add(prev)
            at = prev
    except ReadError:
        return None
    return at


def _list(mem: Memory, L: GtcLayout, head: int, findings: list) -> list[int]:
    """The caches of the list from HEAD on."""
    out, at, seen = [], head, set()
    while at and at not in seen and len(seen) < 1 << 16:
        seen.add(at)
        out.append(at)
        try:
            at = u64(mem, at + L.thread_next)
        except ReadError:
            findings.append(Finding(Severity.ERROR, at, "a thread cache", "its next thread cache cannot be read",
                                    KIND))
            break
    return out


def _linked(mem: Memory, L: GtcLayout, at: int) -> bool:
    """Whether AT looks like a thread cache: a thread, and links whose far ends point back."""
    try:
        thread, nxt, prev = u64(mem, at + L.thread_tid), u64(mem, at + L.thread_next), u64(mem, at + L.thread_next + 8)
        return bool(thread) and (not nxt or u64(mem, nxt + L.thread_next + 8) == at) and \
            (not prev or u64(mem, prev + L.thread_next) == at) and u64(mem, at + L.thread_size) < 1 << 40
    except ReadError:
        return False
