"""jemalloc's decoder from end to end on a target as the debugger shows it: discovery, then the state."""

from __future__ import annotations

import dataclasses

from heapwalk.jemalloc.decay import decay_findings
from heapwalk.jemalloc.decode import collect_jemalloc
from heapwalk.jemalloc.discovery import discover_jemalloc
from heapwalk.jemalloc.find import JemallocImage
from heapwalk.jemalloc.model import JeState
from heapwalk.inferior.space import Target

__all__ = ["load_jemalloc"]


def load_jemalloc(target: Target, found: JemallocImage | None = None) -> JeState:
    """TARGET's jemalloc state (held by FOUND when known), with the arenas whose dirty pages never decay named
    (JemallocNotFound, naming why, when it cannot be located)."""
    disc = discover_jemalloc(target.mem, target.space.mappings, [t.thread_pointer for t in target.threads if t.thread_pointer],
                             found)
    state = collect_jemalloc(target.mem, disc, target.threads, target.description)
    state = dataclasses.replace(state, clock_ns=target.clock_ns)
    return dataclasses.replace(state, findings=state.findings + decay_findings(state) + target.findings(),
                               residency=target.residency)
