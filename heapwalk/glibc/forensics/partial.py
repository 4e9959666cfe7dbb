"""Which numbers of the output rest on damaged or unread structures, as `heapwalk.view.Partial` notes that
`heapwalk.glibc.show.notes` turns into sentences."""

from __future__ import annotations

from heapwalk.findings import Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.model import HeapState, list_name, thread_numbers
from heapwalk.view import Partial

__all__ = ["partial"]


def partial(state: HeapState) -> tuple[Partial, ...]:
    """The notes for STATE, arena by arena, then its tcaches, threads, interruption, ring and mutexes (none
    when everything was read and walked)."""
    out: list[Partial] = []
    for arena in state.arenas:
        if any(f.kind is Kind.ARENA for f in arena.findings):
            out.append(Partial("arena_unreadable", arena.number))
            continue
        cut = [b for b in (*arena.fastbins, arena.unsorted, *arena.bins) if not b.complete]
        if cut:
            names = tuple(list_name(arena, b.kind, b.index).split(" of ")[0] for b in cut[:6])
            out.append(Partial("lists_cut", arena.number, names, more=max(0, len(cut) - 6)))
        acc = state.accounts.get(arena.address)
        if acc is not None and acc.unwalked:
            out.append(Partial("unwalked", arena.number, bytes=acc.unwalked))
    out += [Partial("tcache_cut", owner=owner) for owner, tcache in state.tcaches()
            if any(not b.complete for b in tcache.bins)]
    lost = [t.number for t in state.threads if t.tls_lost]
    if lost:
        out.append(Partial("tls_lost", threads=thread_numbers(lost), count=len(lost)))
    if state.lists_stopped:
        out.append(Partial("lists_stopped"))
    elif state.interrupted:
        out.append(Partial("walk_stopped"))
    if any(f.kind is Kind.ARENA_RING for f in state.findings):
        recovered = any(f.kind is Kind.ARENA_RING and f.severity is Severity.WARNING for f in state.findings)
        out.append(Partial("ring_recovered" if recovered else "ring_broken"))
    if any(f.kind is Kind.MUTEX_HELD for a in state.arenas for f in a.findings):
        out.append(Partial("mutex_held"))
    return tuple(out)
