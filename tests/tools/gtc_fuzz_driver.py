"""Mutation fuzzing of heapwalk's decoder of Google's tcmalloc inside gdb, on a real core (sourced by
tests/tools/fuzz.py's gdb runs, as tests/tools/musl_fuzz_driver.py is for musl).

gdb loads a core of cores/tcmalloc/rust_gtc; the script finds tcmalloc's static objects and its thread caches'
list, then decodes it once through a memory that records every read the decode makes (its static objects, the
spans on the central lists, the slabs, the thread caches, the page map's leaves; not the searches' reads of what
turned out to be something else), and keeps those that lie in writable memory.  Each mutant patches one word of them (a byte, a whole
word, a bit) or aims damage where it must be seen:
- transfer_used: a transfer cache's count of objects beyond its capacity: an error at that transfer cache;
- central_counter: a central free list's count of free objects off by one: an error at the counter;
- span_full: a span on a central list saying all its objects are in use: an error at its count;
- leaf_hidden: a page map leaf missing (a core that lacks it): an error at the leaf;
- slot_wild: a transfer cache's slot pointing 8 bytes into an object: an error at the slot;
- truncate: everything above a point inside one of the reads missing: refused in one line, or an error.
Then it runs what the commands run: finding tcmalloc and its static objects, the decode, check, every object's
place, the report and its document, the heap map's strips, the leak scan's blocks, the RSS claims.  A mutant fails when anything raises (other than the one-line refusal,
GtcUnknown), takes longer than the bound, shows an impossible figure (tests/tools/figures.py), or, for aimed
damage, is not seen.  Parameters and results as fuzz_driver.py's.
"""

from __future__ import annotations

import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gdb sets __file__ for a sourced script
from fuzz_driver import MutatedMemory  # noqa: E402
from je_fuzz_driver import RecordedSound, Recording, _word, drive, patched_read, shown  # noqa: E402

from heapwalk.arch import DEFAULT
from heapwalk.face import CannotDraw
from heapwalk.gtcmalloc.allocator import GtcHeap
from heapwalk.gtcmalloc.check import check_gtcmalloc
from heapwalk.gtcmalloc.decode import decode_gtcmalloc, thread_list
from heapwalk.gtcmalloc.find import GtcUnknown, locate
from heapwalk.gtcmalloc.image import find_google_tcmalloc
from heapwalk.gtcmalloc.pagemap import LEAF_SIZE

#: the aimed damage kinds, each drawn this share of the time (the rest are random patches of what was read)
DAMAGE = {"transfer_used": 0.06, "central_counter": 0.06, "span_full": 0.06, "leaf_hidden": 0.06, "slot_wild": 0.06,
          "truncate": 0.06}


def _tls(threads) -> list:
    return [(t.lwp, *DEFAULT.static_tls(t.thread_pointer, 8192)) for t in threads if t.thread_pointer]


def exercise(mem, space, threads):
    """Everything the commands do on MEM (of SPACE): (the state or None when refused, the check's findings, the
    report's JSON, 'ok' or 'refused: <the one line>')."""
    image = find_google_tcmalloc(mem, space.mappings)
    if image is None:
        return None, None, None, "refused: Google's tcmalloc is not mapped"
    try:
        located = locate(mem, image)
        state = decode_gtcmalloc(mem, located, image.path, "fuzz", thread_list(mem, located, _tls(threads)))
    except GtcUnknown as exc:
        return None, None, None, f"refused: {exc}"
    heap = GtcHeap(state, mem, len(threads), space.regions)
    findings = check_gtcmalloc(state, mem) + list(heap.objects.findings)
    try:
        heap.strips()
    except CannotDraw:
        pass                     # said in one line, as the front ends say it
    heap.blocks()
    return shown(heap, state, findings, ())


class Sound(RecordedSound):
    """What the undamaged core holds: the reads the decoder made in writable memory, its transfer caches, central
    lists and their first spans, its page map's leaves."""

    def __init__(self, base, space, threads):
        image = find_google_tcmalloc(base, space.mappings)
        located = locate(base, image)                   # searches: what it reads past the shapes is no dependency
        listed = thread_list(base, located, _tls(threads))
        rec = Recording(base)                           # what the decode and check read: each a dependency
        state = decode_gtcmalloc(rec, located, image.path, "fuzz", listed)
        check_gtcmalloc(state, rec)
        GtcHeap(state, rec, len(threads), space.regions).objects
        self.base = base
        writable = [(s.address, s.address + s.memsz) for s in image.writable()] + list(
            space.writable or space.regions)
        self.reads = [(a, n) for a, n in rec.reads if any(lo <= a < hi for lo, hi in writable)]
        L = located.layout
        self.layout = L
        self.entries = [(located.transfer + c.index * L.tc_stride, c) for c in state.classes]
        self.spans = []
        for entry, c in self.entries:
            for k in range(L.cfl_list_count):
                head = entry + L.tc_central + L.cfl_lists + 16 * k
                first = struct.unpack("<Q", base.read(head, 8))[0]
                if first not in (0, head):
                    self.spans.append((first, c))
        self.leaves = state.spans.leaves.tolist() if state.spans is not None else []
        self.slots = [struct.unpack("<Q", base.read(entry + L.tc_slots, 8))[0] for entry, c in self.entries
                      if c.transfer_objects]


def _pick(spec: dict, items: list):
    return items[int(spec["pick"] * len(items)) % len(items)] if items else None


def apply(spec: dict, sound: Sound):
    """(the memory of mutant SPEC, the address an error must name or 0 for any error, None for no demand),
    or None when this core has no place for it."""
    op, base, L = spec["op"], sound.base, sound.layout
    if op == "transfer_used":
        entry, c = _pick(spec, sound.entries) or (None, None)
        if entry is None:
            return None
        return MutatedMemory(base, {entry + L.tc_used: struct.pack("<ii", c.transfer_capacity + 7,
                                                                    c.transfer_capacity)}), entry
    if op == "central_counter":
        entry, c = _pick(spec, sound.entries) or (None, None)
        if entry is None:
            return None
        counter = entry + L.tc_central + L.cfl_counter
        return MutatedMemory(base, _word(counter, c.central_objects + 1)), counter
    if op == "span_full":
        span, c = _pick(spec, sound.spans) or (None, None)
        if span is None:
            return None
        return MutatedMemory(base, {span + L.span_allocated: struct.pack("<H", c.objects_per_span)}), \
            span + L.span_allocated
    if op == "leaf_hidden":
        leaf = _pick(spec, sound.leaves)
        if leaf is None:
            return None
        return MutatedMemory(base, {}, (leaf, leaf + LEAF_SIZE)), 0         # at the leaf, or at a page it holds
    if op == "slot_wild":
        slot = _pick(spec, sound.slots)
        if slot is None:
            return None
        return MutatedMemory(base, _word(slot, struct.unpack("<Q", base.read(slot, 8))[0] + 8)), slot
    return patched_read(spec, sound)


def main() -> None:
    drive(Sound, apply, exercise, DAMAGE)


if __name__ == "__main__":  # sourced by gdb
    main()
