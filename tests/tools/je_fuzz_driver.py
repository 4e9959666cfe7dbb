"""Mutation fuzzing of heapwalk's jemalloc decoder inside gdb, on a real core (sourced by tests/tools/fuzz.py's gdb
runs, as tests/tools/fuzz_driver.py is for glibc).

gdb loads a core of a process on jemalloc; the script decodes it once through a memory that records every
read the decoder makes (discovery, arenas, bins, bases, thread caches, the radix tree), and keeps the words
of those reads that lie in writable memory (jemalloc's own data, its arenas, bases and tsds): the fields a
damaged process or core can change.  Each mutant patches one of them (a byte, a whole word, a bit) or aims
damage where it must be seen:
- arena_hidden: the pages of an arena's structure missing (a core that lacks them): an error at the arena;
- cache_twice: a thread cache slot holding its neighbour's region: a double free named at that region;
- cache_wild: a slot holding a pointer into nothing: an error at that pointer;
- truncate: everything above a point inside one of the reads missing: refused in one line, or an error.
Then it runs what the commands run: discovery, decoding, decay findings, check, the report, the tables and
the JSON.  A mutant fails when anything raises (other than the one-line refusal, JemallocNotFound), takes
longer than the bound, shows an impossible figure (tests/tools/figures.py), or, for aimed damage, is not seen.
Parameters and results as tests/tools/fuzz_driver.py's; a mutant is described by the index of the read and the
offset in it, so that a failed one replays on a fresh capture of the same reproducer.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gdb sets __file__ for a sourced script
import figures  # noqa: E402
from fuzz_driver import INTERESTING, MutatedMemory, run_mutants  # noqa: E402

from heapwalk.common.findings import Kind, Severity
from heapwalk.jemalloc import check as je_check
from heapwalk.jemalloc.decay import decay_findings
from heapwalk.jemalloc.decode import collect_jemalloc
from heapwalk.jemalloc.discovery import JemallocNotFound, discover_jemalloc
from heapwalk.jemalloc.find import find_jemalloc
from heapwalk.jemalloc.heapmap import extent_strips
from heapwalk.jemalloc.allocator import JemallocHeap
from heapwalk.jemalloc.tcache import _array_spans, bin_counts
from heapwalk.jemalloc import shown as jedoc
from heapwalk.output import tables
from heapwalk.output.heapmaps import svg_maps, text_maps
from heapwalk.output.htmlreport import report_html
from heapwalk.output.jsondoc import report_json
from heapwalk.output.pngmaps import png_maps

from heapwalk.analysis.inuse import in_use_of, leak_totals
from heapwalk.analysis.leaks import leaks_of
from heapwalk.gdb.adapter import gdb_memory, thread_registers
from heapwalk.inferior.roots import readonly_images
from heapwalk.gdb.addressspace import memory_map

_CACHE_BIN = 24
#: the aimed damage kinds, each drawn this share of the time (the rest are random patches of what was read)
DAMAGE = {"arena_hidden": 0.06, "cache_twice": 0.08, "cache_wild": 0.06, "truncate": 0.08}


class Recording:
    """BASE, with every read that succeeds recorded as (address, size), once each, in order."""

    def __init__(self, base):
        self.base, self.reads, self._seen = base, [], set()

    def read(self, address: int, size: int) -> bytes:
        data = self.base.read(address, size)
        if (address, size) not in self._seen:
            self._seen.add((address, size))
            self.reads.append((address, size))
        return data


def exercise(mem, maps, threads, space=None):
    """Everything the commands do on MEM: (the state or None when refused, the check's findings, the report's
    JSON, 'ok' or 'refused: <the one line>'); the maps of its extents and the report's page drawn too, and with
    SPACE (the process's memory map) the report's leak scan over the blocks its extents hold."""
    try:
        disc = discover_jemalloc(mem, maps)
    except JemallocNotFound as exc:
        return None, None, None, f"refused: {exc}"
    state = collect_jemalloc(mem, disc, threads, "fuzz")
    state = dataclasses.replace(state, findings=state.findings + decay_findings(state))
    findings = je_check.check_jemalloc(state)
    heap = JemallocHeap(state, mem)
    rep = heap.report(*_leak_scan(mem, heap, space, threads))
    console = tables.make_console(io.StringIO(), False)
    box = tables.box_for(False)
    for part in (jedoc.jemalloc_arenas_table(state, box), jedoc.jemalloc_threads_table(state, box),
                 jedoc.jemalloc_slabs_table(state, box), *heap.report_parts(rep, False), *heap.threads(False).parts,
                 jedoc.jemalloc_check_text(findings, je_check.scope(state), 50)):
        if part is not None:
            console.print(part)
    document = jedoc.jemalloc_report_document(state, rep)
    json.dumps(document)
    json.dumps(jedoc.jemalloc_check_document(state, findings, je_check.scope(state)))
    if state.extents is not None:
        strips = extent_strips(state.extents)
        console.print(text_maps(strips, 80, False))
        svg_maps(strips, 256)
        png_maps(strips, 128)
        report_html(document, heap.html_header(document), heap.html(document, strips))
    errors = [f for f in findings if f.severity is Severity.ERROR]
    return state, findings, report_json(rep), "ok" if not errors else f"ok, {len(errors)} errors"


def _leak_scan(mem, heap, space, threads) -> tuple:
    """The report's in-use groups and leak totals, as 'heapwalk report' makes them from the blocks HEAP's extents
    hold; () without SPACE or extents."""
    if space is None or not heap.scans_leaks:
        return ()
    blocks = heap.blocks()
    lk = leaks_of(mem, blocks, space, threads)
    return in_use_of(blocks, ~lk.reach.reached, lk.reach.signed, readonly_images(space), None, mem), \
        leak_totals(lk)


class Sound:
    """What the undamaged core holds: the reads the decoder made in writable memory, the arenas, and the
    slots of every thread cache's stacks."""

    def __init__(self, base, maps, threads):
        rec = Recording(base)
        disc = discover_jemalloc(rec, maps)
        state = collect_jemalloc(rec, disc, threads)
        je_check.check_jemalloc(state)
        self.base, self.layout = base, disc.layout
        writable = _writable(base, maps)
        self.reads = [(a, n) for a, n in rec.reads if any(lo <= a < hi for lo, hi in writable)]
        self.arenas = [a.address for a in state.arenas]
        self.slots = []   # (slot address, the region it holds, the previous slot's region or None)
        for t in state.threads:
            if t.tsd is not None and t.tcache_arena is not None:
                self.slots += _stack_slots(base, disc.layout, t.tsd)

    def field(self, read: int, offset: int) -> int | None:
        """The address of the word OFFSET (a fraction) of the way through recorded read READ."""
        if not self.reads:
            return None
        address, size = self.reads[read % len(self.reads)]
        return address + (int(offset * max(size - 8, 0)) & ~7)


def _writable(base, maps) -> list[tuple[int, int]]:
    """Where a process writes: every mapping but the files' read-only and code segments (jemalloc's own
    writable segment stays in)."""
    out = []
    found = find_jemalloc(base, maps)
    image = found.image if found else None
    for m in maps:
        if m.path and ("/" in m.path) and not (image and m.path == image.path):
            continue
        if image and m.path == image.path:
            out += [(s.address, s.address + s.memsz) for s in image.writable()]
            continue
        out.append((m.start, m.end))
    return out


def _stack_slots(mem, layout, tsd: int) -> list[tuple[int, int, int | None]]:
    """The slots of the cache stacks of the tcache in the tsd at TSD, with the region each holds."""
    out = []
    for array, (first, last) in zip((tsd + off for off in layout.tsd_tcache_bins),
                                    _array_spans(layout, layout.cache_bins)):
        raw = mem.read(array + _CACHE_BIN * first, _CACHE_BIN * (last - first))
        for slot, count in enumerate(bin_counts(layout, raw, last - first)):
            if not 0 < count < 10000:
                continue
            if layout.stack_cache_bins:
                stack = struct.unpack_from("<Q", raw, _CACHE_BIN * slot)[0]
            else:
                stack = struct.unpack_from("<Q", raw, _CACHE_BIN * slot + 16)[0] - 8 * count
            regions = struct.unpack("<%dQ" % count, mem.read(stack, 8 * count))
            out += [(stack + 8 * i, r, regions[i - 1] if i else None) for i, r in enumerate(regions)]
    return out


def draw_mutants(rng: random.Random, reads: int, count: int, damage: dict) -> list[dict]:
    """COUNT mutants over READS recorded reads: one of each aimed kind of DAMAGE (its shares), so that every
    run aims each kind at least once, then aimed ones by their shares and random patches."""
    def aimed(kind: str) -> dict:
        return {"op": kind, "pick": round(rng.random(), 4), "read": rng.randrange(max(reads, 1)),
                "offset": round(rng.random(), 4)}

    def one() -> dict:
        draw = rng.random()
        for kind, share in damage.items():
            if draw < share:
                return aimed(kind)
            draw -= share
        return random_patch(rng, reads)

    first = [aimed(kind) for kind in damage][:count]
    return first + [one() for _ in range(count - len(first))]


def random_patch(rng: random.Random, reads: int) -> dict:
    """A random patch of one word of the recorded reads: a byte, a whole word (an interesting value, or near
    the old one), or a bit."""
    op = rng.choice(("byte", "word", "word", "flip"))
    spec = {"op": op, "read": rng.randrange(max(reads, 1)), "offset": round(rng.random(), 4)}
    if op == "byte":
        spec.update(at=rng.randrange(8), value=rng.randrange(256))
    elif op == "flip":
        spec.update(bit=rng.randrange(64))
    else:
        spec.update(value=rng.choice(INTERESTING + ("near",)), delta=rng.choice((-4096, -8, 8, 64, 0x100000)))
    return spec


def _word(address: int, value: int) -> dict[int, bytes]:
    return {address: struct.pack("<Q", value & (2**64 - 1))}


def apply(spec: dict, sound: Sound):
    """(the memory of mutant SPEC, the address an error must name or 0 for any error, None for no demand),
    or None when this core has no place for it."""
    op, base = spec["op"], sound.base
    if op == "arena_hidden":
        if not sound.arenas:
            return None
        arena = sound.arenas[int(spec["pick"] * len(sound.arenas)) % len(sound.arenas)]
        return MutatedMemory(base, {}, (arena & ~4095, arena + sound.layout.arena_size)), arena
    if op in ("cache_twice", "cache_wild"):
        usable = [s for s in sound.slots if op == "cache_wild" or s[2] is not None]
        if not usable:
            return None
        slot, region, previous = usable[int(spec["pick"] * len(usable)) % len(usable)]
        value = previous if op == "cache_twice" else 0x414141414140
        return MutatedMemory(base, _word(slot, value)), value
    at = sound.field(spec["read"], spec["offset"])
    if at is None:
        return None
    return patched(spec, base, at)


def patched(spec: dict, base, at: int):
    """BASE with patch SPEC (`random_patch`, or truncate) laid at AT: (the memory, the demand on errors)."""
    op = spec["op"]
    if op == "truncate":
        return MutatedMemory(base, {}, (at, 1 << 64)), 0
    word = struct.unpack("<Q", base.read(at, 8))[0]
    if op == "byte":
        return MutatedMemory(base, {at + spec["at"]: bytes([spec["value"]])}), None
    new = word ^ (1 << spec["bit"]) if op == "flip" else word + spec["delta"] if spec["value"] == "near" \
        else spec["value"]
    return MutatedMemory(base, _word(at, new)), None


def judge(spec: dict, named: int | None, state, findings, rep) -> tuple[str | None, dict]:
    """Why heapwalk's answer on a mutant breaks a promise (None: it keeps them), and what it detected."""
    if state is None:
        return None, ({"detected": True, "exact": False, "refused": True} if named is not None else {})
    wrong = figures.impossible(rep)
    if wrong:
        return "impossible figures: " + "; ".join(wrong[:3]), {}
    if named is None:
        return None, {}
    errors = [f for f in findings if f.severity is Severity.ERROR]
    if not errors:
        return "the damage was not seen", {"detected": False, "exact": False}
    if spec["op"] == "arena_hidden":
        exact = any(named <= f.address < named + 0x20000 and f.kind is Kind.ARENA for f in errors)
    else:
        exact = not named or any(f.address == named for f in errors)
    return None, {"detected": True, "exact": exact, **({} if exact else {"errors": [str(f) for f in errors[:3]]})}


def shown(heap, state, findings, parts: tuple = ()):
    """What a driver's exercise ends with: HEAPWALK's report printed with PARTS (more of its commands' output) and
    its check, its document and RSS claims made; (STATE, FINDINGS, the report's JSON, the outcome)."""
    rep = heap.report()
    console = tables.make_console(io.StringIO(), False)
    for part in (*heap.report_parts(rep, False), *parts, *heap.check(50, False).parts):
        console.print(part)
    json.dumps(heap.report_document(rep))
    heap.claims()
    errors = [f for f in findings if f.severity is Severity.ERROR]
    return state, findings, report_json(rep), "ok" if not errors else f"ok, {len(errors)} errors"


class RecordedSound:
    """What a driver keeps of the undamaged core: the decoder's reads in writable memory (READS: (address,
    size)), which the random mutants patch."""

    reads: list = []

    def field(self, read: int, offset: float) -> int | None:
        """The address of the word OFFSET (a fraction) of the way through recorded read READ."""
        if not self.reads:
            return None
        address, size = self.reads[read % len(self.reads)]
        return address + (int(offset * max(size - 8, 0)) & ~7)


def patched_read(spec: dict, sound: RecordedSound):
    """Random mutant SPEC on one of SOUND's reads (`patched`), or None when it has none."""
    at = sound.field(spec["read"], spec["offset"])
    return None if at is None else patched(spec, sound.base, at)


def drive(make_sound, apply, exercise, damage: dict) -> None:
    """The whole run of a driver over the decoder's recorded reads (this one's, and tcmalloc's, mimalloc's and
    musl's): the spec from HEAPWALK_FUZZ_SPEC, the sound core (MAKE_SOUND(base, space, threads): its `reads`),
    the mutants drawn with DAMAGE's aimed kinds and made by APPLY(spec, sound), each judged on what
    EXERCISE(mem, space, threads) gives (the state, the findings, the report's JSON, the outcome), the results
    written where the spec says."""
    with open(os.environ["HEAPWALK_FUZZ_SPEC"], encoding="utf-8") as fh:
        spec = json.load(fh)
    rng = random.Random(spec["seed"])
    space = memory_map()
    base = gdb_memory(space.readable)
    threads = thread_registers()
    sound = make_sound(base, space, threads)
    mutants = list(spec.get("replay", [])) + draw_mutants(rng, len(sound.reads), spec["count"], damage)

    def run(m: dict, mem, named) -> tuple[str, dict]:
        state, findings, rep, outcome = exercise(mem, space, threads)
        broken, verdict = judge(m, named, state, findings, rep)
        return (f"FAILED: {broken} ({outcome})" if broken else outcome), verdict

    results = run_mutants(mutants, lambda m: apply(m, sound), spec["bound"], run)
    fields = [(f"read {i}", a) for i, (a, _) in enumerate(sound.reads)]
    with open(spec["out"], "w", encoding="utf-8") as fh:
        json.dump({"fields": fields, "results": results}, fh, indent=1)


def main() -> None:
    drive(lambda base, space, threads: Sound(base, space.mappings, threads), apply,
          lambda mem, space, threads: exercise(mem, space.mappings, threads, space), DAMAGE)


if __name__ == "__main__":  # sourced by gdb
    main()
