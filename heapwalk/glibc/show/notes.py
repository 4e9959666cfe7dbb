"""The sentences that say which numbers are partial (`heapwalk.glibc.forensics.partial.Partial`), the same in every command's
text and JSON."""

from __future__ import annotations

from heapwalk.glibc.forensics.partial import Partial

__all__ = ["partial_sentence", "partial_sentences"]


def partial_sentence(p: Partial) -> str:
    """One note as the sentence the output shows."""
    arena = f"arena {p.arena}"
    if p.what == "arena_unreadable":
        return f"{arena}: could not be read; none of its numbers are known"
    if p.what == "lists_cut":
        more = f" and {p.more} more" if p.more else ""
        return f"{arena}: free bytes of {', '.join(p.names)}{more} cover only the part before the damage"
    if p.what == "unwalked":
        return f"{arena}: {p.bytes} bytes of its heaps could not be walked; in-use and free bytes leave them out"
    if p.what == "tcache_cut":
        return f"{p.owner}: its tcache lists are cut at damage"
    if p.what == "tls_lost":
        many = p.count > 1
        return (f"thread{'s' if many else ''} {p.threads}: TLS not in the core, so {'their' if many else 'its'} "
                "arena is unknown and tcaches found by scanning the arenas belong to no known thread")
    if p.what == "lists_stopped":
        return ("reading the free lists was interrupted (Ctrl-C): the arenas from there on are left out, and no "
                "chunk was walked")
    if p.what == "walk_stopped":
        return "the chunk walk was interrupted (Ctrl-C): the arenas it did not finish count as unwalked"
    if p.what == "ring_recovered":
        return ("the arena ring is broken: the arenas after the break were found by their heaps, and are "
                "numbered after the ring (not as malloc_info numbers them)")
    if p.what == "ring_broken":
        return "the arena ring is broken: arenas after the break are missing (none was found by its heap)"
    if p.what == "mutex_held":
        return "an arena mutex was held: that arena's lists may be mid-update"
    raise ValueError(f"no sentence for the partial note {p.what!r}")


def partial_sentences(notes) -> list[str]:
    """Every note's sentence, in order."""
    return [partial_sentence(p) for p in notes]
