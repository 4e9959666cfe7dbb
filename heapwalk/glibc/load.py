"""glibc's decoder from end to end: discovery, then the state, on a target as the debugger shows it; with
what the target itself says (a truncated core, another allocator mapped) as findings or as the reason it
cannot be decoded."""

from __future__ import annotations

import dataclasses

from heapwalk.common.findings import Finding, Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.decode import collect
from heapwalk.glibc.locate.discovery import Discovery, DiscoveryError, Overrides, discover, foreign_allocator
from heapwalk.glibc.model import HeapState
from heapwalk.inferior.space import Target

__all__ = ["load"]


def load(target: Target, overrides: Overrides, walk_chunks: bool = False, progress=None, keep_used: bool = False,
         keep_chunks: bool = False, keep_pages: bool = False) -> tuple[HeapState, Discovery]:
    """TARGET's glibc heap, decoded (every chunk walked if WALK_CHUNKS, the in-use chunks kept for the leak scan
    if KEEP_USED; PROGRESS hears the walk), and the discovery it rests on; DiscoveryError, naming why, when there is no glibc heap to decode."""
    space = target.space
    other = foreign_allocator(space.mappings)
    try:
        disc = discover(target.mem, target.symbols, overrides, space.mappings,
                        [t.thread_pointer for t in target.threads if t.thread_pointer], core=space.core, regions=space.regions)
        disc = dataclasses.replace(disc, page_size=target.page_size)
        state = collect(target.mem, disc, target.threads, target.description, walk_chunks, space.regions, progress,
                        residency=target.residency, keep_used=keep_used, keep_chunks=keep_chunks,
                        keep_pages=keep_pages and target.residency is None and target.present is not None,
                        arch=target.arch)
    except DiscoveryError as exc:
        if space.core and target.missing:
            raise DiscoveryError(f"heapwalk: the core is truncated, and what heapwalk needs lies in the part that "
                                 f"is missing: {exc}") from None
        if other is not None:
            raise type(exc)(f"heapwalk: this process allocates with {other[0]} ({other[1]}), not glibc's "
                                 f"malloc: glibc's arenas hold nothing of interest ({exc})") from None
        raise
    return dataclasses.replace(state, target_findings=_target_findings(target, other), cpus=target.cpus), disc


def _target_findings(target: Target, other: tuple[str, str] | None) -> tuple[Finding, ...]:
    """What the target says of itself: another allocator beside glibc's, and the memory a truncated core lacks."""
    out = []
    if other is not None:
        out.append(Finding(Severity.WARNING, 0, "allocator", f"{other[0]} is in this process ({other[1]}), and "
                           "heapwalk has not decoded it", Kind.NOT_DECODED))
    return tuple(out) + target.findings()
