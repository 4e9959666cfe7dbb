"""Mutation fuzzing of heapwalk's engine inside gdb, on a real core (sourced by tests/tools/fuzz.py's gdb runs).

gdb loads a reproducer core; this script decodes it once, picks places in malloc's metadata (arena fields,
bin heads, fastbin and tcache heads, chunk sizes, fd/bk/next links, heap_info, mp_), and for each mutant
lays a patch over the target's memory (or hides everything past a point, as a truncated core would) and runs
what every command runs: discovery, the full decode with the chunk walk, check, the report, text, JSON and
XML rendering.  A mutant fails when anything raises (other than the one-line DiscoveryError a user sees) or
takes longer than the bound.  Parameters come from the JSON file named by $HEAPWALK_FUZZ_SPEC:
{"count": N, "seed": S, "bound": seconds, "out": path, "replay": [mutant, ...]}; the results (and the
address of every field it could mutate) go to "out".

A mutant is described by where it lands relative to the decoded heap ("bin_fd of arena 0, 3rd chunk"), not by
raw address, so one that failed once can be replayed on a fresh capture of the same reproducer.

Besides the random patches, nine kinds of damage are aimed where the sound decode says they hurt, and each
carries the place heapwalk must name (see DAMAGE): a chunk size set to 0, a size running into the middle of
the next chunk, a zeroed heap page, an arena's `next` overwritten, a core cut short, a tcache entry's `next`
pointed outside every heap (tcache poisoning: named at that entry), top's size written smaller (named at top),
`mp_.tcache_bins` set past what glibc allows (named at the field), and a chunk inside a free chunk of a bin
freed into a tcache (the same memory free twice: named at the entry inside).  For these a mutant also
fails when `check` calls the heap clean; whether the finding is at the exact address is counted per kind.
Every mutant fails when the report shows an impossible figure (tests/tools/figures.py).
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import struct
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gdb sets __file__ for a sourced script
import figures  # noqa: E402
from fuzz import RING_LINKS  # noqa: E402

from heapwalk.glibc.forensics import check
from heapwalk.glibc.show import documents, mallocinfo
from heapwalk.glibc.show import tables as glibc_tables
from heapwalk.output import jsondoc, tables
from heapwalk.analysis.inuse import in_use_of, leak_totals
from heapwalk.analysis.leakreport import describe
from heapwalk.analysis.leaks import leaks_of
from heapwalk.glibc.account.blocks import blocks_of
from heapwalk.output.htmlreport import report_html
from heapwalk.output.pngmaps import png_maps
from heapwalk.output.heapmaps import svg_maps, text_maps
from heapwalk.glibc.walk.chunks import extents
from heapwalk.glibc.decode import collect
from heapwalk.glibc.allocator import GlibcHeap
from heapwalk.glibc.locate.discovery import DiscoveryError, Overrides, discover
from heapwalk.gdb.adapter import GdbSymbols, gdb_memory, thread_registers
from heapwalk.gdb.addressspace import memory_map
from heapwalk.inferior.memory import ReadError
from heapwalk.inferior.roots import readonly_images
from heapwalk.output.leakdoc import leaks_group, leaks_json
from heapwalk.common.findings import Severity
from heapwalk.glibc.kinds import Kind

INTERESTING = (0, 1, 0x10, 0x21, 0xFFFFFFFFFFFFFFFF, 0x4141414141414141, 0x8000000000000000, 0x7FFFFFFFFFFFFFFF,
               0x100000000000)


class MutatedMemory:
    """BASE with PATCHES (address -> bytes) laid over it, and nothing readable in HIDE = (from, to): the rest
    of a heap (pages missing from a core), or everything above a point (a core cut short)."""

    def __init__(self, base, patches: dict[int, bytes], hide: tuple[int, int] | None = None):
        self.base, self.patches, self.hide = base, patches, hide

    def read(self, address: int, size: int) -> bytes:
        if self.hide and address < self.hide[1] and self.hide[0] < address + size:
            raise ReadError(address, size, "missing from the (truncated) core")
        data = self.base.read(address, size)
        for at, patch in self.patches.items():
            if at < address + size and address < at + len(patch):
                buf = bytearray(data)
                for i, b in enumerate(patch):
                    if address <= at + i < address + size:
                        buf[at + i - address] = b
                data = bytes(buf)
        return data


class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout()


def targets(state, disc, mem) -> list[tuple[str, int]]:
    """(name, address of an 8-byte field) for every kind of malloc metadata in the decoded heap."""
    lay = disc.layout
    out: list[tuple[str, int]] = []
    for a in state.arenas:
        tag = f"arena {a.number}"
        for field in ("off_top", "off_last_remainder", "off_next", "off_system_mem", "off_mutex", "off_binmap",
                      "off_next_free", "off_attached_threads"):
            off = getattr(lay, field, None)
            if off is not None:
                out.append((f"{tag} {field[4:]}", a.address + off))
        for b in a.fastbins:
            out.append((f"{tag} fastbin[{b.index}] head", b.head))
            out += [(f"{tag} fastbin[{b.index}] chunk {i} size", c + 8) for i, c in enumerate(b.chunks[:4])]
            out += [(f"{tag} fastbin[{b.index}] chunk {i} fd", c + 16) for i, c in enumerate(b.chunks[:4])]
        for b in (a.unsorted, *a.bins):
            if not b.chunks:
                continue
            out.append((f"{tag} bin[{b.index}] head fd", b.head + 16))
            out.append((f"{tag} bin[{b.index}] head bk", b.head + 24))
            for i, c in enumerate(b.chunks[:4]):
                for name, off in (("size", 8), ("fd", 16), ("bk", 24), ("fd_nextsize", 32)):
                    out.append((f"{tag} bin[{b.index}] chunk {i} {name}", c + off))
        for h in a.heaps[:2]:
            if not a.is_main:
                out += [(f"{tag} heap {h.address - a.heaps[0].address:#x} {n}", h.address + o)
                        for n, o in (("ar_ptr", 0), ("prev", 8), ("size", 16))]
        acc = state.accounts.get(a.address)
        if a.top:
            out.append((f"{tag} top size", a.top + 8))
        if acc is not None:
            for e in extents(a, lay)[:1]:
                at = e.first
                for i in range(12):  # the first chunks of the heap, by walking their sizes
                    try:
                        size = struct.unpack("<Q", mem.read(at + 8, 8))[0] & ~7
                    except ReadError:
                        break
                    out.append((f"{tag} chunk {i} size", at + 8))
                    out.append((f"{tag} chunk {i} prev_size", at))
                    if size < 16 or at + size >= e.end:
                        break
                    at += size
    for t in state.threads:
        if t.thread_pointer:  # the TCB's self pointer: damage here makes the thread's TLS look lost (tcache scan)
            out.append((f"thread {t.number} tcb", t.thread_pointer))
        if t.tcache is None:
            continue
        tag = f"thread {t.number} tcache"
        out.append((f"{tag} counts", t.tcache.address))
        for b in t.tcache.bins[:4]:
            out.append((f"{tag} bin {b.index} head", t.tcache.address + lay.tcache_off_entries + 8 * b.index))
            out += [(f"{tag} bin {b.index} entry {i} next", e) for i, e in enumerate(b.entries[:3])]
            out += [(f"{tag} bin {b.index} entry {i} key", e + 8) for i, e in enumerate(b.entries[:3])]
    if state.mp is not None:
        for name in ("sbrk_base", "n_mmaps", "mmapped_mem", "tcache_count", "hp_pagesize"):
            off = disc.layout.mp.get(name)
            if off is not None:
                out.append((f"mp_ {name}", state.mp.address + off))
    return out


#: the aimed damage kinds, each drawn this share of the time (the rest are random patches of TARGETS)
DAMAGE = {"size_zero": 0.08, "size_into_next": 0.08, "zero_page": 0.06, "ring": 0.06, "truncate": 0.08,
          "tcache_next": 0.05, "top_shrunk": 0.05, "mp_bins": 0.03, "tcache_inside": 0.04}


class Sound:
    """What the undamaged core holds, for aiming damage and judging what heapwalk says about it."""

    def __init__(self, state, disc, mem):
        self.mem, self.layout = mem, disc.layout
        self.fields_list = targets(state, disc, mem)
        self.fields = dict(self.fields_list)
        self.names = [n for n, _ in self.fields_list]
        self.arenas = [a.address for a in state.arenas]
        self.heaps = []  # (extent, [(chunk, size) ... in address order, top last when it lies there])
        self.owner = {}  # extent start -> its arena, for all but the main arena's sbrk heap (found by its chunks)
        self.entries = [e for _, tc in state.tcaches() for b in tc.bins if b.index < 64 for e in b.entries]
        self.tails = [b.entries[-1] for _, tc in state.tcaches() for b in tc.bins if b.index < 64 and b.entries]
        self.binned = [(c, n) for a in state.arenas for lst in (a.unsorted, *a.bins)
                       for c, n in zip(lst.chunks, lst.sizes) if n >= 0x60]  # room for a chunk inside
        self.safe_linking = disc.layout.safe_linking
        self.tops = [(a.top, a.top_size) for a in state.arenas if a.top and a.top_size >= 0x2000]
        self.mp_bins = state.mp.address + disc.layout.mp["tcache_bins"] \
            if state.mp is not None and "tcache_bins" in disc.layout.mp else None
        for a in state.arenas:
            for k, e in enumerate(extents(a, disc.layout)):
                self.heaps.append((e, self._chunks(e, a.top)))
                if k or not a.is_main:
                    self.owner[e.start] = a.address

    def _chunks(self, extent, top: int) -> list[tuple[int, int]]:
        out, at = [], extent.first
        while at + 16 <= extent.end and len(out) < 100_000:
            size = struct.unpack("<Q", self.mem.read(at + 8, 8))[0] & ~7
            if size < 32 or at + size > extent.end:
                break  # a fencepost, or the end
            out.append((at, size))
            if at == top:
                break
            at += size
        return out

    def chunk(self, heap: int, pick: float, room: int = 0) -> tuple[int, list[tuple[int, int]]] | None:
        """The index of the chunk PICK (0-1) of the way through heap HEAP's chunks, leaving ROOM after it."""
        if heap >= len(self.heaps):
            return None
        chunks = self.heaps[heap][1]
        if len(chunks) <= room:
            return None
        return min(int(pick * (len(chunks) - room)), len(chunks) - room - 1), chunks


def make_mutant(rng: random.Random, names: list[str], heaps: int) -> dict:
    """A mutant spec: aimed damage (DAMAGE), or a patch of one field (a byte, a whole word, a bit)."""
    draw = rng.random()
    for kind, share in DAMAGE.items():
        if draw < share and heaps:
            heap = rng.randrange(heaps)
            if kind == "truncate":
                return {"op": kind, "heap": heap, "fraction": round(rng.random(), 3), "hole": rng.random() < 0.5}
            if kind == "ring":
                return {"op": kind, "arena": rng.randrange(8), "link": rng.choice(RING_LINKS)}
            if kind in ("tcache_next", "top_shrunk", "mp_bins"):
                return {"op": kind, "pick": round(rng.random(), 4)}
            if kind == "tcache_inside":
                return {"op": kind, "pick": round(rng.random(), 4), "inside": round(rng.random(), 4)}
            spec = {"op": kind, "heap": heap, "pick": round(rng.random(), 4)}
            if kind == "size_into_next":
                spec["into"] = round(rng.random(), 4)
            return spec
        draw -= share
    op = rng.choice(("byte", "byte", "word", "flip"))
    spec = {"op": op, "target": rng.choice(names)}
    if op == "byte":
        spec.update(offset=rng.randrange(8), value=rng.randrange(256))
    elif op == "flip":
        spec.update(bit=rng.randrange(64))
    else:
        spec.update(value=rng.choice(INTERESTING + ("near",)), delta=rng.choice((-32, -16, -8, 8, 16, 0x100)))
    return spec


def _picked(items: list, pick: float):
    """The item PICK (0-1) of the way through ITEMS."""
    return items[min(int(pick * len(items)), len(items) - 1)]


def _word(address: int, value: int) -> dict[int, bytes]:
    return {address: struct.pack("<Q", value & (2**64 - 1))}


def aim(spec: dict, sound: Sound) -> tuple[MutatedMemory, int | None] | None:
    """The memory of an aimed-damage SPEC and the address heapwalk must name (None: any error will do),
    or None when this core has no place for it."""
    base, op = sound.mem, spec["op"]
    if op == "truncate":
        if spec["heap"] >= len(sound.heaps):
            return None
        e, chunks = sound.heaps[spec["heap"]]
        cut = max((e.start + int((e.end - e.start) * spec["fraction"])) & ~4095, e.start)
        first_lost = next((a for a, _ in chunks if a + 8 >= cut), None)  # the first chunk whose size is gone
        if first_lost is None and spec.get("hole"):
            return None  # the hole is inside top, past its header: nothing of malloc's is missing
        arena, ring = e.start + sound.layout.heap_info_size, sound.arenas
        if cut <= arena and arena in ring:  # the arena itself is gone: named where the ring links to it
            first_lost = ring[ring.index(arena) - 1]
        if sound.owner.get(e.start, 0) >= cut and not spec.get("hole"):
            first_lost = None  # the heap's arena is gone with the cut: nothing names its heaps, any error will do
        return MutatedMemory(base, {}, (cut, e.end if spec.get("hole") else 1 << 64)), first_lost
    if op == "ring":
        if spec["arena"] >= len(sound.arenas):
            return None
        i, ring = spec["arena"], sound.arenas
        here, after = ring[i], ring[(i + 1) % len(ring)]
        value = {"null": 0, "junk": 0x4141414141414141, "skip": ring[(i + 2) % len(ring)], "main": ring[0],
                 "self": here, "interior": after + 0x88}[spec["link"]]
        if value == after:
            return None  # the ring is too short for this link to change anything
        return MutatedMemory(base, _word(here + sound.layout.off_next, value)), here
    if op == "tcache_next":            # poisoned: the entry's next now leads to main_arena, in libc's data
        if not sound.entries:
            return None
        entry = _picked(sound.entries, spec["pick"])
        target = sound.arenas[0]
        return MutatedMemory(base, _word(entry, (entry >> 12) ^ target if sound.safe_linking else target)), entry
    if op == "tcache_inside":          # the last entry of a tcache list freed again inside a free chunk of a bin
        if not sound.tails or not sound.binned:
            return None
        tail = _picked(sound.tails, spec["pick"])
        outer, _ = _picked(sound.binned, spec["inside"])
        inner = outer + 0x30       # the user pointer of a chunk 0x20 into the free one: past its four links
        protect = (lambda at, v: (at >> 12) ^ v) if sound.safe_linking else (lambda at, v: v)
        return MutatedMemory(base, {**_word(tail, protect(tail, inner)), **_word(inner, protect(inner, 0))}), inner
    if op == "top_shrunk":
        if not sound.tops:
            return None
        top, size = _picked(sound.tops, spec["pick"])
        word = struct.unpack("<Q", base.read(top + 8, 8))[0]
        return MutatedMemory(base, _word(top + 8, 0x1000 | (word & 7))), top
    if op == "mp_bins":
        if sound.mp_bins is None:
            return None
        return MutatedMemory(base, _word(sound.mp_bins, 0x7FFFFFFFFFFF)), sound.mp_bins
    picked = sound.chunk(spec["heap"], spec["pick"], room=2)  # two sound chunks after: one damage, not two
    if picked is None:
        return None
    j, chunks = picked
    c, size = chunks[j]
    word = struct.unpack("<Q", base.read(c + 8, 8))[0]
    if op == "size_zero":
        return MutatedMemory(base, _word(c + 8, 0)), c
    if op == "size_into_next":
        nxt_size = chunks[j + 1][1]
        steps = nxt_size // 16 - 1  # landing 16 .. nxt_size - 16 bytes into the next chunk
        if steps < 1:
            return None
        return MutatedMemory(base, _word(c + 8, word + 16 * (1 + min(int(spec["into"] * steps), steps - 1)))), c
    if op == "zero_page":
        extent = sound.heaps[spec["heap"]][0]
        page = (c + 8) & ~4095
        first = next((a for a, _ in chunks if a + 8 >= page), None)
        if page <= extent.start < page + 4096 and extent.start != extent.first:  # heap_info (and its arena)
            arena = extent.start + sound.layout.heap_info_size
            named = arena if arena in sound.arenas else extent.start
        else:
            named = first if first is not None and first + 8 < page + 4096 else None
        return MutatedMemory(base, {page: bytes(4096)}), named
    raise ValueError(op)


def apply(spec: dict, sound: Sound) -> tuple[MutatedMemory, int | None] | None:
    """The memory of mutant SPEC (and, for aimed damage, the address to be named), or None when SPEC names
    something this core does not have."""
    if spec["op"] in DAMAGE:
        return aim(spec, sound)
    base = sound.mem
    at = sound.fields.get(spec["target"])
    if at is None:
        return None
    try:
        word = struct.unpack("<Q", base.read(at, 8))[0]
    except ReadError:
        return None
    if spec["op"] == "byte":
        return MutatedMemory(base, {at + spec["offset"]: bytes([spec["value"]])}), None
    if spec["op"] == "flip":
        new = word ^ (1 << spec["bit"])
    elif spec["value"] == "near":
        new = word + spec["delta"]
    else:
        new = spec["value"]
    return MutatedMemory(base, _word(at, new)), None


def exercise(mem, symbols, maps, threads, regs, target: str, space=None):
    """Everything the commands do, on MEM: (the state or None when refused, the check result, the report's
    JSON document, 'ok' or 'refused: <the one line a user sees>').  With SPACE (the target's MemoryMap), the
    report's leak scan too, and 'heapwalk leaks' laid out; and the heap maps, as text, SVG and PNG, and the report's page."""
    try:
        disc = discover(mem, symbols, Overrides(), maps, [t.thread_pointer for t in threads if t.thread_pointer], regions=regs)
        state = collect(mem, disc, threads, target, True, regs, keep_used=space is not None)
    except DiscoveryError as exc:
        return None, None, None, f"refused: {exc}"
    result = check.check(state, mem, disc.layout)
    scanned = _leak_scan(mem, disc.layout, state, space, threads)
    heap = GlibcHeap(state, mem, disc.layout)
    rep = heap.report(*scanned[:2])
    strips = heap.strips(leaked=scanned[2] if scanned else None)
    tables.make_console(io.StringIO(), False).print(text_maps(strips, 80, False))
    svg_maps(strips, 256)
    png_maps(strips, 128)
    sink = io.StringIO()
    console = tables.make_console(sink, False)
    console.print(heap.header())
    for part in [*heap.report_parts(rep, False), *heap.arenas(False).parts, *heap.threads(False).parts,
                 *heap.check(50, False).parts]:
        console.print(part)
    console.print(glibc_tables.bins_tables(state, list(state.arenas), set(documents.KINDS), False, True))
    console.print(glibc_tables.tcache_tables(state, list(state.threads), False, True, state.scanned_tcaches))
    document = documents.state_to_json(state)
    document["report"] = jsondoc.report_json(rep)
    json.dumps(document)
    page = {**document, "report": {**document["report"], "partial": []}}
    report_html(page, heap.html_header(page), heap.html(page, strips))
    json.dumps(documents.check_document(state, result, check.scope(state)))
    mallocinfo.malloc_info_xml(state)
    return state, result, document["report"], "ok" if result.clean else f"ok, {len(result.errors)} errors"


def _leak_scan(mem, layout, state, space, threads) -> tuple:
    """The report's in-use groups and leak totals, as 'heapwalk report' makes them, and the leaked chunks (for
    the maps), with 'heapwalk leaks' laid out and written as JSON on the way; () without SPACE."""
    if space is None:
        return ()
    blocks = blocks_of(mem, layout, state)
    lk = leaks_of(mem, blocks, space, threads)
    images = readonly_images(space)
    laid_out = describe(lk, mem, images, None, 20)
    tables.make_console(io.StringIO(), False).print(leaks_group(laid_out, False))
    json.dumps(leaks_json(documents.header(state), laid_out))
    return (in_use_of(blocks, ~lk.reach.reached, lk.reach.signed, images, None, mem), leak_totals(lk),
            lk.leaked_chunks())


def judge(spec: dict, named: int | None, sound: Sound, state, result, rep) -> tuple[str | None, dict]:
    """Whether heapwalk's answer on a mutant keeps its promises: (why it fails or None, what it detected).
    Every mutant: no impossible figure.  Aimed damage: never called clean, and every arena of the sound
    core still listed; 'exact' says whether an error names the damaged place itself."""
    if result is None:  # refused with the one line: said, not hidden
        return None, {"detected": True, "exact": False, "refused": True} if spec["op"] in DAMAGE else {}
    wrong = figures.impossible(rep)
    if wrong:
        return "impossible figures: " + "; ".join(wrong[:3]), {}
    if spec["op"] not in DAMAGE:
        return None, {}
    if result.clean:
        return "the damage was called clean", {"detected": False, "exact": False}
    errors = [f for f in result.findings if f.severity is Severity.ERROR]
    exact = any(f.address == named for f in errors) if named is not None else bool(errors)
    if spec["op"] == "ring":
        lost = set(sound.arenas) - {a.address for a in state.arenas}
        exact = exact and any(f.kind is Kind.ARENA_RING for f in errors if f.address == named)
        if lost:
            return f"arenas lost with the ring: {', '.join(hex(a) for a in sorted(lost))}", {}
    seen = {} if exact else {"errors": [str(f) for f in errors[:3]]}
    return None, {"detected": True, "exact": exact, **seen}


def _run(m: dict, mem, named, sound: Sound, symbols, maps, threads, regs, space=None) -> tuple[str, dict]:
    """Mutant M's outcome and what it detected (see `judge`)."""
    state, result, rep, outcome = exercise(mem, symbols, maps, threads, regs, "fuzz", space)
    broken, verdict = judge(m, named, sound, state, result, rep)
    return (f"FAILED: {broken} ({outcome})" if broken else outcome), verdict


def run_mutants(mutants: list[dict], make, bound: float, run) -> list[dict]:
    """Each of MUTANTS made by MAKE (its memory and the address to be named, or None when the core has no
    place for it) and judged by RUN(mutant, memory, named) -> (outcome, verdict) within BOUND seconds; any
    exception or overrun is a failed outcome.  The results, one per mutant."""
    signal.signal(signal.SIGALRM, _alarm)
    results = []
    for m in mutants:
        made = make(m)
        if made is None:
            results.append({"mutant": m, "outcome": "not applicable", "seconds": 0})
            continue
        mem, named = made
        started = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, bound)
        verdict = {}
        try:
            outcome, verdict = run(m, mem, named)
        except Timeout:
            outcome = f"FAILED: took more than {bound} s, stopped in:\n" + traceback.format_exc()
        except Exception:  # the point: anything here is a bug
            outcome = "FAILED: " + traceback.format_exc()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        results.append({"mutant": m, "outcome": outcome, "named": named, **verdict,
                        "seconds": round(time.monotonic() - started, 3)})
    return results


def main() -> None:
    with open(os.environ["HEAPWALK_FUZZ_SPEC"], encoding="utf-8") as fh:
        spec = json.load(fh)
    rng = random.Random(spec["seed"])
    space = memory_map()
    base = gdb_memory(space.readable)
    symbols = GdbSymbols()
    maps = space.mappings
    threads = thread_registers()
    regs = space.regions
    disc = discover(base, symbols, Overrides(), maps, [t.thread_pointer for t in threads if t.thread_pointer])
    sound = Sound(collect(base, disc, threads, "", True, regs), disc, base)
    mutants = list(spec.get("replay", []))
    mutants += [make_mutant(rng, sound.names, len(sound.heaps)) for _ in range(spec["count"])]
    results = run_mutants(mutants, lambda m: apply(m, sound), spec["bound"], lambda m, mem, named: _run(
        m, mem, named, sound, symbols, maps, threads, regs, space))
    with open(spec["out"], "w", encoding="utf-8") as fh:
        json.dump({"fields": sound.fields_list, "results": results}, fh, indent=1)


if __name__ == "__main__":  # sourced by gdb; tests/tools/je_fuzz_driver.py imports its pieces
    main()
