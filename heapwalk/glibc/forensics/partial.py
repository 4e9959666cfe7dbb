"""Which numbers of the output rest on damaged or unread structures, as `Partial` notes that
`heapwalk.glibc.show.notes` turns into sentences."""

from __future__ import annotations

from dataclasses import dataclass

from heapwalk.common.findings import Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.model import HeapState, list_name, thread_numbers

__all__ = ["Partial", "partial"]


@dataclass(frozen=True)
class Partial:
    """A number of the output that rests on damaged or unread structures: WHAT happened (a word
    `heapwalk.glibc.show.notes` turns into a sentence), and where."""

    what: str                    # arena_unreadable, lists_cut, unwalked, tcache_cut, tls_lost, lists_stopped,
    #                              walk_stopped, ring_recovered, ring_broken, mutex_held
    arena: int | None = None     # the arena's number
    names: tuple[str, ...] = ()  # the lists cut (the first few)
    more: int = 0                # how many more lists are cut
    bytes: int = 0               # bytes the walk could not pass
    owner: str = ""              # whose tcache
    threads: str = ""            # which threads ("2-9")
    count: int = 0               # how many threads


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
