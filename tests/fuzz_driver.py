"""Mutation fuzzing of heapwalk's engine inside gdb, on a real core (sourced by tests/fuzz.py's gdb runs).

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
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import struct
import time
import traceback


from heapwalk import check, jsonout, mallocinfo, render, report
from heapwalk.chunkwalk import extents
from heapwalk.collect import collect
from heapwalk.commands import _overrides
from heapwalk.discovery import DiscoveryError, discover
from heapwalk.gdbtarget import GdbSymbols, gdb_memory, memory_map, thread_registers
from heapwalk.memory import ReadError

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
        if t.fs_base:  # the TCB's self pointer: damage here makes the thread's TLS look lost (tcache scan)
            out.append((f"thread {t.number} tcb", t.fs_base))
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


def make_mutant(rng: random.Random, names: list[str], heaps: list[tuple[int, int]]) -> dict:
    """A mutant spec: a patch of one field (a byte, or a whole word) or a truncation."""
    if rng.random() < 0.1 and heaps:
        i = rng.randrange(len(heaps))
        return {"op": "truncate", "heap": i, "fraction": round(rng.random(), 3), "hole": rng.random() < 0.5}
    op = rng.choice(("byte", "byte", "word", "flip"))
    spec = {"op": op, "target": rng.choice(names)}
    if op == "byte":
        spec.update(offset=rng.randrange(8), value=rng.randrange(256))
    elif op == "flip":
        spec.update(bit=rng.randrange(64))
    else:
        spec.update(value=rng.choice(INTERESTING + ("near",)), delta=rng.choice((-32, -16, -8, 8, 16, 0x100)))
    return spec


def apply(spec: dict, base, fields: dict[str, int], heaps: list[tuple[int, int]]) -> MutatedMemory | None:
    """The memory of mutant SPEC, or None when SPEC names something this core does not have."""
    if spec["op"] == "truncate":
        if spec["heap"] >= len(heaps):
            return None
        lo, hi = heaps[spec["heap"]]
        cut = (lo + int((hi - lo) * spec["fraction"])) & ~4095
        return MutatedMemory(base, {}, (cut, hi if spec.get("hole") else 1 << 64))
    at = fields.get(spec["target"])
    if at is None:
        return None
    try:
        word = struct.unpack("<Q", base.read(at, 8))[0]
    except ReadError:
        return None
    if spec["op"] == "byte":
        return MutatedMemory(base, {at + spec["offset"]: bytes([spec["value"]])})
    if spec["op"] == "flip":
        new = word ^ (1 << spec["bit"])
    elif spec["value"] == "near":
        new = (word + spec["delta"]) & (2**64 - 1)
    else:
        new = spec["value"]
    return MutatedMemory(base, {at: struct.pack("<Q", new)})


def exercise(mem, symbols, maps, threads, regs, target: str) -> str:
    """Everything the commands do, on MEM; returns 'ok' or 'refused: <the one line a user sees>'."""
    try:
        disc = discover(mem, symbols, _overrides(), maps, [t.fs_base for t in threads if t.fs_base])
        state = collect(mem, disc, threads, target, True, regs)
    except DiscoveryError as exc:
        return f"refused: {exc}"
    result = check.check(state, mem, disc.layout)
    rep = report.build_report(state)
    sink = io.StringIO()
    console = render.make_console(sink, False)
    console.print(render.header_text(state))
    console.print(render.report_group(state, rep, False))
    console.print(render.arenas_table(state, False))
    console.print(render.bins_tables(state, list(state.arenas), set(jsonout.KINDS), False, True))
    console.print(render.tcache_tables(state, list(state.threads), False, True, state.scanned_tcaches))
    console.print(render.threads_group(state, False))
    console.print(render.check_text(result, check.scope(state)))
    document = jsonout.state_to_json(state)
    document["report"] = jsonout.report_json(rep)
    json.dumps(document)
    json.dumps(jsonout.check_document(state, result, check.scope(state)))
    mallocinfo.malloc_info_xml(state)
    return "ok" if result.clean else f"ok, {len(result.errors)} errors"


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
    disc = discover(base, symbols, _overrides(), maps, [t.fs_base for t in threads if t.fs_base])
    state = collect(base, disc, threads, "", True, regs)
    field_list = targets(state, disc, base)
    fields = dict(field_list)
    names = [n for n, _ in field_list]
    heaps = [(e.start, e.end) for a in state.arenas for e in extents(a, disc.layout)]
    mutants = list(spec.get("replay", []))
    mutants += [make_mutant(rng, names, heaps) for _ in range(spec["count"])]
    signal.signal(signal.SIGALRM, _alarm)
    results = []
    for m in mutants:
        mem = apply(m, base, fields, heaps)
        if mem is None:
            results.append({"mutant": m, "outcome": "not applicable", "seconds": 0})
            continue
        started = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, spec["bound"])
        try:
            outcome = exercise(mem, symbols, maps, threads, regs, "fuzz")
        except Timeout:
            outcome = f"FAILED: took more than {spec['bound']} s, stopped in:\n" + traceback.format_exc()
        except Exception:  # the point: anything here is a bug
            outcome = "FAILED: " + traceback.format_exc()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        results.append({"mutant": m, "outcome": outcome, "seconds": round(time.monotonic() - started, 3)})
    with open(spec["out"], "w", encoding="utf-8") as fh:
        json.dump({"fields": field_list, "results": results}, fh, indent=1)


main()
