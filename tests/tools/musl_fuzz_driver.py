"""Mutation fuzzing of heapwalk's decoder of musl's malloc inside gdb, on a real core (sourced by tests/tools/fuzz.py's
gdb runs, as tests/tools/tc_fuzz_driver.py is for tcmalloc).

gdb loads a core of a process on musl; the script decodes it once through a memory that records every read the
decoder makes (the context, the meta areas, the groups' headers, the slots' headers), and keeps those that lie in
writable memory.  Each mutant patches one word of them (a byte, a whole word, a bit) or aims damage where it must
be seen:
- area_check: a meta area's check word changed: an error at the area;
- group_back: a group's header pointing elsewhere than its meta: an error at the group;
- slot_index: the index byte of an allocation's header changed: an error at that header;
- area_hidden: a meta area's page missing (a core that lacks it): an error at the area;
- truncate: everything above a point inside one of the reads missing: refused in one line, or an error.
Then it runs what the commands run: finding musl and its context, the decode, check, the report and its page's
document, the heap map's strips, the leak scan's blocks, the RSS claims.  A mutant fails when anything raises
(other than the one-line refusal, MuslUnknown), takes longer than the bound, shows an impossible figure
(tests/tools/figures.py), or, for aimed damage, is not seen.  Parameters and results as fuzz_driver.py's.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gdb sets __file__ for a sourced script
from fuzz_driver import MutatedMemory  # noqa: E402
from je_fuzz_driver import RecordedSound, Recording, _word, drive, patched_read, shown  # noqa: E402

from heapwalk.musl.allocator import MuslHeap
from heapwalk.musl.check import check_musl
from heapwalk.musl.decode import decode_musl
from heapwalk.musl.discovery import MuslUnknown, locate_context
from heapwalk.musl.find import find_musl
from heapwalk.musl.layout import IB
from heapwalk.musl.model import IN_USE

#: the aimed damage kinds, each drawn this share of the time (the rest are random patches of what was read)
DAMAGE = {"area_check": 0.07, "group_back": 0.07, "slot_index": 0.07, "area_hidden": 0.07, "truncate": 0.07}


def exercise(mem, space, threads):
    """Everything the commands do on MEM (of SPACE's mappings): (the state or None when refused, the check's
    findings, the report's JSON, 'ok' or 'refused: <the one line>')."""
    found = find_musl(mem, space.mappings)
    if found is None:
        return None, None, None, "refused: musl is not mapped"
    try:
        address, how = locate_context(mem, found, lambda name: None)
    except MuslUnknown as exc:
        return None, None, None, f"refused: {exc}"
    state = decode_musl(mem, address, how, found.path, found.version, 4096, "fuzz")
    heap = MuslHeap(state, mem)
    findings = check_musl(state, mem)
    heap.strips()
    heap.blocks()
    return shown(heap, state, findings, ())


class Sound(RecordedSound):
    """What the undamaged core holds: the reads the decoder made in writable memory, its meta areas, groups and
    allocations."""

    def __init__(self, base, space, threads):
        rec = Recording(base)
        maps = space.mappings
        found = find_musl(rec, maps)
        address, how = locate_context(rec, found, lambda name: None)
        state = decode_musl(rec, address, how, found.path, found.version, 4096, "fuzz")
        check_musl(state, rec)
        self.base = base
        writable = [(s.address, s.address + s.memsz) for s in found.image.writable()] + list(
            space.writable or space.regions)
        self.reads = [(a, n) for a, n in rec.reads if any(lo <= a < hi for lo, hi in writable)]
        self.areas = list(state.meta_areas)
        self.groups = [(g.mem, g.meta) for g in state.groups]
        self.allocations = [int(a) for a in state.used_addr[:2000]]
        self.in_use = sum(1 for g in state.groups for i in range(g.slots) if g.state(i) == IN_USE)


def _pick(spec: dict, items: list):
    return items[int(spec["pick"] * len(items)) % len(items)] if items else None


def apply(spec: dict, sound: Sound):
    """(the memory of mutant SPEC, the address an error must name or 0 for any error, None for no demand),
    or None when this core has no place for it."""
    op, base = spec["op"], sound.base
    if op in ("area_check", "area_hidden"):
        area = _pick(spec, sound.areas)
        if area is None:
            return None
        if op == "area_hidden":
            return MutatedMemory(base, {}, (area, area + 4096)), area
        return MutatedMemory(base, _word(area, 0x5151515151515151)), area
    if op == "group_back":
        group = _pick(spec, sound.groups)
        if group is None:
            return None
        mem, meta = group
        return MutatedMemory(base, _word(mem, meta + 40)), mem
    if op == "slot_index":
        p = _pick(spec, sound.allocations)
        if p is None:
            return None
        header = int.from_bytes(base.read(p - 8, 8), "little")
        index = (header >> 40) & 0xFF
        changed = (header & ~(0x1F << 40)) | ((((index & 31) + 1) % 32) << 40)     # its reserved bits kept
        return MutatedMemory(base, _word(p - 8, changed)), p - IB
    return patched_read(spec, sound)


def main() -> None:
    drive(Sound, apply, exercise, DAMAGE)


if __name__ == "__main__":  # sourced by gdb
    main()

