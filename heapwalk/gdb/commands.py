"""gdb commands: ``heapwalk arenas|bins|tcache|threads|chunks|chunk|report|check`` and ``set/show heapwalk ...``.

Commands parse their arguments, build a `HeapState` through the engine, and
render it; no heap logic lives here.  Errors the user can cause are one line;
internal errors show a traceback only with ``set heapwalk debug on``.
"""

from __future__ import annotations

import gdb  # type: ignore[import-not-found]

from heapwalk.analysis import report
from heapwalk.findings import Kind, Severity
from heapwalk.gdb.leakcommands import LeaksCommand, in_use_and_leaks, reach_text, scan_leaks
from heapwalk.gdb.mapcommands import MapCommand, write_report_html
from heapwalk.gdb.console import (console_with_header, gdb_console, interactive, print_damage, print_findings,
                                  print_jemalloc_arenas, print_jemalloc_check, print_jemalloc_report,
                                  print_jemalloc_threads, print_partial, write_json)
from heapwalk.gdb.session import (DebugParameter, SetPrefix, Settings, StringParameter, UserError,
                                  load_allocators, load_state, load_target, parse_int, selected_arena)
from heapwalk.gdb.subcommand import Parser, Subcommand, json_option
from heapwalk.glibc import check, chunkinfo, mallocinfo
from heapwalk.glibc.model import ChunkState
from heapwalk.glibc.partial import partial
from heapwalk.glibc.summary import heap_view
from heapwalk.output import jsondoc, tables
from heapwalk.output.options import add_no_leaks, add_report_files
from heapwalk.output.jedoc import both_text

__all__ = ["register"]


class ArenasCommand(Subcommand):
    name = "arenas"

    def make_parser(self):
        p = Parser(prog="heapwalk arenas", description="List every arena (main and thread arenas, in ring "
                   "order) with its system memory, top chunk, and the free bytes (chunk count) held in each "
                   "kind of free list: tcache (of the threads using the arena), fastbins, unsorted, small, large.")
        json_option(p)
        return p

    def run(self, args) -> None:
        found = load_allocators(walk_chunks=True)
        je_doc = print_jemalloc_arenas(found.jemalloc) if found.jemalloc else None
        glibc_doc = None
        if found.glibc:
            state = found.glibc[0]
            console = console_with_header(state, beside_jemalloc=je_doc is not None)
            console.print(tables.arenas_table(state, interactive()))
            print_damage(console, state, state.all_findings())
            glibc_doc = jsondoc.state_to_json(state) if args.json else None
        write_json(args.json, je_doc, glibc_doc)


class BinsCommand(Subcommand):
    name = "bins"

    def make_parser(self):
        p = Parser(prog="heapwalk bins", description="Show the free lists of each arena: fastbins, the unsorted "
                   "bin, small bins and large bins (chunk sizes, counts, bytes). KIND limits the output to one "
                   "kind: fast, unsorted, small or large.")
        p.add_argument("kind", nargs="?", choices=jsondoc.KINDS, help="only this kind of list")
        p.add_argument("--arena", metavar="ADDR", help="only the arena at ADDR (or its number in the ring)")
        p.add_argument("--chunks", action="store_true", help="list the chunk addresses of each bin")
        json_option(p)
        return p

    def run(self, args) -> None:
        state = load_state()
        arenas = list(state.arenas) if args.arena is None else [selected_arena(state, args.arena, "bins")]
        kinds = {args.kind} if args.kind else set(jsondoc.KINDS)
        console = console_with_header(state)
        console.print(tables.bins_tables(state, arenas, kinds, interactive(), args.chunks))
        print_damage(console, state, [f for a in arenas for f in a.findings] + list(state.findings))
        if args.json:
            jsondoc.dump(jsondoc.state_to_json(state, arenas=[a.address for a in arenas], kinds=kinds,
                                               threads=[]), args.json)


class TcacheCommand(Subcommand):
    name = "tcache"

    def make_parser(self):
        p = Parser(prog="heapwalk tcache", description="Show the tcache of every thread (or of thread N): "
                   "the thread's arena, and each non-empty tcache bin with its chunk size, count and entries "
                   "(user-memory addresses, list head first).")
        p.add_argument("--thread", metavar="N", type=int, help="only gdb thread number N")
        p.add_argument("--entries", action="store_true", help="list every entry, not only the first few")
        json_option(p)
        return p

    def run(self, args) -> None:
        state = load_state()
        threads = list(state.threads)
        if args.thread is not None:
            threads = [t for t in threads if t.number == args.thread]
            if not threads:
                raise UserError(f"heapwalk tcache: no thread {args.thread} (see 'info threads')")
        console = console_with_header(state)
        scanned = state.scanned_tcaches if args.thread is None else ()
        console.print(tables.tcache_tables(state, threads, interactive(), args.entries, scanned))
        print_damage(console, state, [f for t in threads if t.tcache for f in t.tcache.findings]
                      + [f for tc in scanned for f in tc.findings]
                      + [f for f in state.findings if f.kind is Kind.TLS_LOST])
        if args.json:
            jsondoc.dump(jsondoc.state_to_json(state, arenas=[], threads=[t.number for t in threads]), args.json)


def _size(text: str) -> int:
    """'4096', '0x1000', '4k', '2M' -> bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = units.get(t[-1:], 1)
    t = t[:-1] if t[-1:] in units else t
    try:
        return int(t, 0) * scale
    except ValueError:
        raise UserError(f"not a size: {text} (e.g. 4096, 0x1000, 64k, 2M)") from None


_PAGE_ROWS = 100  # rows of 'heapwalk chunks' printed at once


class ChunksCommand(Subcommand):
    name = "chunks"

    def make_parser(self):
        p = Parser(prog="heapwalk chunks", description="Walk every chunk of every heap in address order and "
                   "list those that match: address, size, state (in_use, tcache, fast, unsorted, small, large, "
                   "top, tcache_struct, fencepost), flags and arena.")
        p.add_argument("--arena", metavar="ADDR", help="only the arena at ADDR (or its number in the ring)")
        which = p.add_mutually_exclusive_group()
        which.add_argument("--free", action="store_true", help="only free chunks (tcache, fastbins, bins)")
        which.add_argument("--used", action="store_true", help="only chunks in use")
        p.add_argument("--min", metavar="SIZE", help="only chunks of at least SIZE bytes (4096, 0x1000, 64k)")
        p.add_argument("--max", metavar="SIZE", help="only chunks of at most SIZE bytes")
        p.add_argument("--limit", metavar="N", type=int, default=200,
                       help="print at most N chunks (default 200; 0: all); --json has them all")
        json_option(p)
        return p

    def run(self, args) -> None:
        state, mem, layout = load_target()
        arena = selected_arena(state, args.arena, "chunks").address if args.arena else None
        flt = chunkinfo.ChunkFilter(arena=arena,
                                    free=args.free, used=args.used, min_size=_size(args.min) if args.min else 0,
                                    max_size=_size(args.max) if args.max else None)
        console = console_with_header(state)
        shown, total, count, page, printed = 0, 0, 0, [], False
        walk_findings: list = []
        writer = jsondoc.ChunksWriter(args.json, state) if args.json else None
        try:  # the listing is printed a page at a time and the JSON written a chunk at a time, as the walk goes
            for matches in chunkinfo.matching(mem, layout, state, flt, walk_findings):
                count += matches.count
                total += matches.total
                wanted = None if writer is not None or args.limit == 0 else max(0, args.limit - shown)
                if wanted == 0:
                    continue
                for chunk in matches.chunks(wanted):
                    if writer is not None:
                        writer.add(matches.arena, chunk)
                    if args.limit == 0 or shown < args.limit:
                        shown += 1
                        page.append((matches.arena, chunk))
                        if len(page) == _PAGE_ROWS:
                            console.print(tables.chunks_table(page, interactive(), first=not printed))
                            page, printed = [], True
        finally:
            if writer is not None:
                writer.close()
        if page or not printed:
            console.print(tables.chunks_table(page, interactive(), first=not printed))
        more = f" (first {shown} shown; --limit 0 shows all)" if shown < count else ""
        console.print(f"{count} chunks, {tables.human(total)}{more}")
        damaged = [f for f in walk_findings if f.severity is Severity.ERROR]
        if damaged:
            console.print(f"partial results: the walk met {len(damaged)} damaged place(s); "
                          "'heapwalk check' lists them")


class ChunkCommand(Subcommand):
    name = "chunk"

    def make_parser(self):
        p = Parser(prog="heapwalk chunk", description="Describe the chunk holding ADDRESS (a user pointer or "
                   "any address inside a chunk): its arena and heap, size and flags, state, the list that "
                   "holds it, and its neighbours; for a chunk in use, whether anything still points to it "
                   "(one path from a root, or leaked: see 'heapwalk leaks').")
        p.add_argument("address", metavar="ADDRESS")
        json_option(p)
        return p

    def run(self, args) -> None:
        address = parse_int(args.address)
        state, mem, layout = load_target()
        found = chunkinfo.locate(mem, layout, state, address)
        if found is not None:
            console = gdb_console()
            console.print(tables.chunk_text(found, address))
            reach = self._reach(found.chunk.address) if found.chunk.state is ChunkState.IN_USE else None
            if reach is not None:
                console.print(f"  {reach}")
            if args.json:
                jsondoc.dump(jsondoc.chunk_document(state, address, located=found, reach=reach), args.json)
            return
        state, mem, layout = load_target(walk_chunks=True)  # finds the mmapped chunks too
        mmapped = next((c for c in state.mmapped if c.address <= address < c.address + c.span), None)
        if mmapped is None:
            raise UserError(f"heapwalk chunk: {address:#x} is in no arena's heap and in no mmapped chunk")
        listed = chunkinfo.where_listed(state, mmapped.address)
        gdb_console().print(f"{address:#x} is {address - mmapped.address} bytes into the mmapped chunk at "
                         f"{mmapped.address:#x} (user memory {mmapped.address + 16:#x})\n"
                         f"  size {mmapped.size:#x}, its own mapping of {tables.human(mmapped.span)}"
                         + (f"\n  listed in {listed}" if listed else "\n  state: in use (freeing it unmaps it)"))
        if args.json:
            jsondoc.dump(jsondoc.chunk_document(state, address, mmapped=mmapped, listed=listed), args.json)


    @staticmethod
    def _reach(chunk: int) -> str | None:
        """Whether the in-use chunk at CHUNK is reached from a root, and how (a scan of the whole heap)."""
        found = load_allocators(walk_chunks=True, keep_used=True)
        return reach_text(scan_leaks(found), chunk, found.target.threads) if found.glibc else None


class ThreadsCommand(Subcommand):
    name = "threads"

    def make_parser(self):
        p = Parser(prog="heapwalk threads", description="Every thread: its arena and the chunks and bytes its "
                   "tcache holds; every arena: how many threads use it, attached_threads, and whether it waits "
                   "on the free list of exited threads; the arena limit.")
        json_option(p)
        return p

    def run(self, args) -> None:
        found = load_allocators()
        je_doc = print_jemalloc_threads(found.jemalloc) if found.jemalloc else None
        glibc_doc = None
        if found.glibc:
            state = found.glibc[0]
            console = console_with_header(state, beside_jemalloc=je_doc is not None)
            console.print(tables.threads_group(state, interactive()))
            glibc_doc = jsondoc.state_to_json(state, kinds=()) if args.json else None
        write_json(args.json, je_doc, glibc_doc)


class ReportCommand(Subcommand):
    name = "report"

    def make_parser(self):
        p = Parser(prog="heapwalk report", description="Where every byte of every arena is: per arena the "
                   "system memory, in-use bytes, free bytes by kind, top and overhead, which add up to "
                   "system_mem; a free-chunk size histogram; what malloc_trim(0) would give back; and a verdict "
                   "(leak or fragmentation, and the remedies the numbers support).")
        add_report_files(p)
        add_no_leaks(p)
        return p

    def run(self, args) -> None:
        found = load_allocators(walk_chunks=True, keep_used=not args.no_leaks, keep_chunks=bool(args.html))
        if args.xml and found.glibc is None:
            raise UserError("heapwalk report: --xml writes glibc's malloc_info XML, and this process allocates "
                            "with jemalloc (--json has its statistics)")
        je_rep, je_doc = print_jemalloc_report(found.jemalloc) if found.jemalloc else (None, None)
        glibc_doc = None
        if found.glibc:
            state = found.glibc[0]
            scanned = in_use_and_leaks(found) if not args.no_leaks else None
            rep = report.build_report(heap_view(state), *(scanned[:2] if scanned else ()))
            notes = partial(state)
            console = console_with_header(state, beside_jemalloc=je_rep is not None)
            console.print(tables.report_group(rep, interactive()))
            print_partial(console, notes)
            print_findings(console, state.all_findings())
            if je_rep is not None:
                console.print(f"\n{both_text(je_rep, rep)}")
            glibc_doc = jsondoc.report_document(state, rep, notes) if args.json or args.html else None
            if args.html:
                write_report_html(args.html, found.glibc, glibc_doc, console, je_doc,
                                  both_text(je_rep, rep) if je_rep is not None else "", found.jemalloc,
                                  scanned[2] if scanned else None)
            if args.xml:
                with open(args.xml, "w", encoding="utf-8") as fh:
                    fh.write(mallocinfo.malloc_info_xml(state))
        if args.html and not found.glibc:
            write_report_html(args.html, None, je_doc, gdb_console(), jemalloc=found.jemalloc)
        write_json(args.json, je_doc, glibc_doc)


class CheckCommand(Subcommand):
    name = "check"

    def make_parser(self):
        p = Parser(prog="heapwalk check", description="Validate every invariant glibc relies on, in every "
                   "arena, heap, bin and tcache, and list each violation: kind, address, structure, what was "
                   "expected and what was found. Sets $heapwalk_errors and $heapwalk_warnings; when the heap "
                   "is damaged the command ends with an error, so 'gdb -batch' exits with status 1 when it is "
                   "the last command (see docs/forensics.md).")
        p.add_argument("--limit", metavar="N", type=int, default=200,
                       help="print at most N findings (default 200; 0: all); --json has them all")
        json_option(p)
        return p

    def run(self, args) -> None:
        for name in ("heapwalk_errors", "heapwalk_warnings"):
            gdb.set_convenience_variable(name, None)
        found = load_allocators(walk_chunks=True)
        errors, warnings, je_doc = print_jemalloc_check(found.jemalloc, args.limit) if found.jemalloc \
            else (0, 0, None)
        glibc_doc = None
        if found.glibc:
            state, mem, layout = found.glibc
            result = check.check(state, mem, layout)
            checked = check.scope(state)
            console = console_with_header(state, beside_jemalloc=je_doc is not None)
            console.print(tables.check_text(result, checked, args.limit or len(result.findings)), end="")
            print_partial(console, result.partial)
            glibc_doc = jsondoc.check_document(state, result, checked) if args.json else None
            errors, warnings = errors + len(result.errors), warnings + len(result.warnings)
        write_json(args.json, je_doc, glibc_doc)
        gdb.set_convenience_variable("heapwalk_errors", errors)
        gdb.set_convenience_variable("heapwalk_warnings", warnings)
        if errors:
            what = "the heap is" if found.glibc else "jemalloc's state is"
            raise UserError(f"heapwalk check: {what} damaged ({errors} error(s))")


class HeapwalkPrefix(gdb.Command):
    """heapwalk: heap forensics (glibc's malloc, jemalloc) for cores and live processes.

Every arena, bin and thread cache of the target, decoded read-only from memory.
Subcommands:
  heapwalk report   start here: where the memory is, trim estimate, verdict
  heapwalk arenas   every arena: system memory, top, free bytes per kind of list
  heapwalk bins     the free lists of each arena (fast, unsorted, small, large)
  heapwalk tcache   every thread's tcache
  heapwalk threads  every thread's arena and tcache; arenas, their users, the limit
  heapwalk chunks   every chunk of every heap, filtered by arena, state and size
  heapwalk chunk    the chunk holding an address: state, list, neighbours
  heapwalk check    every invariant glibc relies on; damage with its address
  heapwalk leaks    the chunks in use nothing points to any more, by a scan from the roots
  heapwalk map      each heap as a strip, coloured by what holds each byte (--svg FILE)
Each takes --json FILE. 'help heapwalk SUBCOMMAND' describes its options.
Settings: 'set heapwalk debug on|off', 'set heapwalk glibc-version X.Y',
'set heapwalk main-arena ADDRESS' ('show heapwalk' lists them)."""

    def __init__(self):
        super().__init__("heapwalk", gdb.COMMAND_DATA, prefix=True)

    def invoke(self, argument: str, from_tty: bool) -> None:
        if argument.strip():
            raise gdb.GdbError(f"heapwalk: unknown subcommand '{argument.split()[0]}' (see 'help heapwalk')")
        gdb.execute("help heapwalk")


def register() -> None:
    """Creates the commands and settings in gdb (idempotent enough to re-source)."""
    HeapwalkPrefix()
    SetPrefix("set")
    SetPrefix("show")
    Settings.debug = DebugParameter()
    Settings.glibc_version = StringParameter("glibc-version", "the glibc version (X.Y) heapwalk decodes as")
    Settings.main_arena = StringParameter("main-arena", "the address of main_arena")
    Settings.resident_from = StringParameter(
        "resident-from", "the capture.json whose page map says which pages of this core were resident (for a "
        "gcore core taken with a capture)", "what the core itself records")
    Settings.core_missing = StringParameter(
        "core-missing", "the address ranges (hex a-b,c-d) a truncated core lacks, which its padding would read as "
        "zeros (the command line sets it)", "the core lacks nothing")
    ArenasCommand()
    BinsCommand()
    TcacheCommand()
    ChunksCommand()
    ChunkCommand()
    ReportCommand()
    ThreadsCommand()
    CheckCommand()
    LeaksCommand()
    MapCommand()
