"""Mutation fuzzing of heapwalk's tcmalloc decoder inside gdb, on a real core (sourced by tests/tools/fuzz.py's gdb
runs, as tests/tools/je_fuzz_driver.py is for jemalloc).

gdb loads a core of a process on gperftools' tcmalloc; the script decodes it once through a memory that
records every read the decoder makes (discovery, the page heap's statistics, the central lists, the thread
caches, the page map and its spans), and keeps those that lie in writable memory: the fields a damaged process
or core can change.  Each mutant patches one word of them (a byte, a whole word, a bit) or aims damage where it
must be seen:
- cache_loop: the last thread cache's next link pointing back to the first: an error at the first;
- cache_hidden: a thread cache's pages missing (a core that lacks them): an error at that cache;
- object_loop: the second free object of a thread cache's list linking back to the first: an error at the first;
- tail_loop: the last object a thread cache's list counts linking back to the first (a loop seen only past the
  count, where a sound list ends with a null link): an error at the first;
- truncate: everything above a point inside one of the reads missing: refused in one line, or an error.
Then it runs what the commands run: discovery, decoding, check (every free list walked), the report, the
thread caches' table, the RSS claims, the heap map's strips, the leak scan's objects, 'chunk' at the first
span, and the JSON.  A mutant fails when anything raises (other than the one-line refusals,
TcmallocUnknown), takes longer than the bound, shows an impossible figure (tests/tools/figures.py), or, for aimed
damage, is not seen.  Parameters and results as tests/tools/fuzz_driver.py's.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gdb sets __file__ for a sourced script
from fuzz_driver import MutatedMemory  # noqa: E402
from je_fuzz_driver import RecordedSound, Recording, _word, drive, patched_read, shown  # noqa: E402

from heapwalk.tcmalloc.allocator import TcmallocHeap
from heapwalk.tcmalloc.check import check_tcmalloc
from heapwalk.tcmalloc.decode import decode_tcmalloc
from heapwalk.tcmalloc.discovery import TcmallocUnknown, discover_tcmalloc
from heapwalk.tcmalloc.find import find_tcmalloc
from heapwalk.tcmalloc.owners import cache_owners
from heapwalk.tcmalloc.verbs import locate

#: the aimed damage kinds, each drawn this share of the time (the rest are random patches of what was read)
DAMAGE = {"cache_loop": 0.07, "cache_hidden": 0.07, "object_loop": 0.07, "tail_loop": 0.07, "truncate": 0.07}


def exercise(mem, maps, threads):
    """Everything the commands do on MEM: (the state or None when refused, the check's findings, the report's
    JSON, 'ok' or 'refused: <the one line>')."""
    found = find_tcmalloc(mem, maps)
    if found is None:
        return None, None, None, "refused: tcmalloc is not mapped"
    try:
        disc = discover_tcmalloc(mem, found)
    except TcmallocUnknown as exc:
        return None, None, None, f"refused: {exc}"
    state = decode_tcmalloc(mem, disc, "fuzz")
    owners = cache_owners(mem, [(t.address, t.tid) for t in state.threads], threads)
    heap = TcmallocHeap(state, mem, owners)
    findings = check_tcmalloc(state, mem, heap.span_table, heap.cached)
    heap.strips()
    heap.blocks()
    if state.spans:
        locate(heap, state.spans[0].page * state.page_size)
    return shown(heap, state, findings, tuple(heap.threads(False).parts))


class Sound(RecordedSound):
    """What the undamaged core holds: the reads the decoder made in writable memory, and the thread caches."""

    def __init__(self, base, maps, threads):
        rec = Recording(base)
        found = find_tcmalloc(rec, maps)
        disc = discover_tcmalloc(rec, found)
        state = decode_tcmalloc(rec, disc, "fuzz")
        TcmallocHeap(state, rec).cached                # the caches' free lists, object by object
        self.base, self.layout = base, disc.layout
        writable = [(s.address, s.address + s.memsz) for s in found.image.writable()] + [
            (m.start, m.end) for m in maps if not (m.path and "/" in m.path)]
        self.reads = [(a, n) for a, n in rec.reads if any(lo <= a < hi for lo, hi in writable)]
        self.caches = [t.address for t in state.threads]
        self.lists = [(head, length) for t in state.threads for _, head, length in t.lists if length >= 2]


def apply(spec: dict, sound: Sound):
    """(the memory of mutant SPEC, the address an error must name or 0 for any error, None for no demand),
    or None when this core has no place for it."""
    op, base, caches = spec["op"], sound.base, sound.caches
    if op == "cache_loop":
        if len(caches) < 2:
            return None
        return MutatedMemory(base, _word(caches[-1] + sound.layout.thread_next, caches[0])), caches[0]
    if op == "cache_hidden":
        if not caches:
            return None
        cache = caches[int(spec["pick"] * len(caches)) % len(caches)]
        return MutatedMemory(base, {}, (cache, cache + sound.layout.thread_prev + 8)), cache
    if op in ("object_loop", "tail_loop"):
        if not sound.lists:
            return None
        head, length = sound.lists[int(spec["pick"] * len(sound.lists)) % len(sound.lists)]
        last = _word_at(base, head)
        for _ in range(length - 2 if op == "tail_loop" else 0):
            last = _word_at(base, last)
        return MutatedMemory(base, _word(last, head)), head
    return patched_read(spec, sound)


def _word_at(mem, address: int) -> int:
    return int.from_bytes(mem.read(address, 8), "little")


def main() -> None:
    drive(lambda base, space, threads: Sound(base, space.mappings, threads), apply,
          lambda mem, space, threads: exercise(mem, space.mappings, threads), DAMAGE)


if __name__ == "__main__":  # sourced by gdb
    main()
