"""gdb commands: ``heapwalk arenas|bins|tcache|threads|chunks|chunk|report|check`` and ``set/show heapwalk ...``.

Commands parse their arguments, build a `HeapState` through the engine, and
render it; no heap logic lives here.  Errors the user can cause are one line;
internal errors show a traceback only with ``set heapwalk debug on``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import time
import traceback

import gdb  # type: ignore[import-not-found]
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from heapwalk.glibc import check, chunkinfo, mallocinfo
from heapwalk.output import jsondoc, tables
from heapwalk.analysis import report
from heapwalk.glibc.decode import collect, gc_paused
from heapwalk.glibc.discovery import DiscoveryError, Overrides, discover, foreign_allocator, parse_version
from heapwalk.target.gdbadapter import (GdbSymbols, describe_target, gdb_memory, has_target, memory_map,
                                        missing_ranges, preserved_selection, thread_registers)
from heapwalk.findings import Finding, Kind, Severity
from heapwalk.glibc.model import HeapState
from heapwalk.glibc.partial import partial
from heapwalk.glibc.summary import heap_view

__all__ = ["register"]


class UserError(Exception):
    """A mistake in the command line or the target: shown as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would exit gdb
        raise UserError(f"{self.prog}: {message} (see 'help {self.prog}')")

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            gdb.write(message)
        raise _HelpShown()


class _HelpShown(Exception):
    pass


class _GdbFile:
    """A file object that writes through gdb, so output lands in logs and pagers correctly."""

    def write(self, s: str) -> int:
        gdb.write(s)
        return len(s)

    def flush(self) -> None:
        gdb.flush()

    def isatty(self) -> bool:
        return _interactive()


def _interactive() -> bool:
    """Is gdb's output a terminal? (Logs and pipes get plain text.)"""
    try:
        return os.isatty(1)
    except OSError:
        return False


def _int(text: str) -> int:
    try:
        return int(gdb.parse_and_eval(text)) if not text.lower().startswith("0x") else int(text, 16)
    except (gdb.error, ValueError):
        raise UserError(f"not an address or number: {text}") from None


class _Settings:
    debug = None
    glibc_version = None
    main_arena = None


def _overrides() -> Overrides:
    ov = Overrides()
    version = _Settings.glibc_version.value if _Settings.glibc_version else ""
    if version:
        try:
            ov.glibc_version = parse_version(version)
        except ValueError:
            raise UserError(f"'set heapwalk glibc-version {version}': expected X.Y, e.g. 2.36") from None
    arena = _Settings.main_arena.value if _Settings.main_arena else ""
    if arena:
        ov.main_arena = _int(arena)
    return ov


def load_target(walk_chunks: bool = False):
    """Discovers and decodes the selected inferior's heap: (state, memory, layout)."""
    if not has_target():
        raise UserError("heapwalk: no process or core file: run, attach (gdb -p PID) or load a core first")
    if not _is_64bit():
        raise UserError(f"heapwalk: 32-bit targets are not supported yet: this one is {_architecture()}, and "
                        "heapwalk decodes 64-bit (x86-64) glibc heaps only")
    with preserved_selection():
        space = memory_map()
        mem = gdb_memory(space.readable)
        threads = thread_registers()
        other = foreign_allocator(space.mappings)
        try:
            disc = discover(mem, GdbSymbols(), _overrides(), space.mappings,
                            [t.fs_base for t in threads if t.fs_base], core=space.core,
                            regions=space.regions)
            with _walk_progress(walk_chunks) as progress:
                state = collect(mem, disc, threads, describe_target(), walk_chunks, space.regions, progress)
        except DiscoveryError as exc:
            if space.core and missing_ranges():
                raise UserError(f"heapwalk: the core is truncated, and what heapwalk needs lies in the part that "
                                f"is missing: {exc}") from None
            if other is not None:
                raise UserError(f"heapwalk: this process allocates with {other[0]} ({other[1]}), not glibc's "
                                f"malloc: glibc's arenas hold nothing of interest ({exc})") from None
            raise
        extra = []
        if other is not None:
            extra.append(Finding(
                Severity.WARNING, 0, "allocator", f"the process also maps {other[0]} ({other[1]}): memory it "
                "serves is not in glibc's arenas, and is not counted here", Kind.DISCOVERY))
        missing = missing_ranges() if space.core else []
        if missing:
            extra.append(Finding(
                Severity.WARNING, missing[0][0], "core file", f"the core is truncated: {len(missing)} region(s) of "
                f"the process's memory ({sum(b - a for a, b in missing)} bytes, from {missing[0][0]:#x}) are not "
                "in it; what lies there is reported as unreadable, never as empty", Kind.UNMAPPED))
        state = dataclasses.replace(state, target_findings=tuple(extra))
        return state, mem, disc.layout


_PROGRESS_AFTER = 1.0  # seconds a walk runs before its progress bar appears


@contextlib.contextmanager
def _walk_progress(walk_chunks: bool):
    """A progress bar for the chunk walk (a callable for `collect`), or None: shown only in an interactive
    gdb (a terminal, and not -batch, which makes the width unlimited), and only once the walk has taken a
    second; it disappears when the walk ends."""
    if not walk_chunks or not _interactive() or gdb.parameter("width") is None:
        yield None
        return
    bar = _ProgressBar()
    try:
        yield bar
    finally:
        bar.close()


class _ProgressBar:
    """rich's progress bar on gdb's terminal, started on the first report after a second."""

    def __init__(self):
        self.start = time.monotonic()
        self.progress: Progress | None = None
        self.task = None

    def __call__(self, done: int, total: int) -> None:
        if self.progress is None:
            if time.monotonic() - self.start < _PROGRESS_AFTER:
                return
            self.progress = Progress(TextColumn("walking chunks"), BarColumn(), DownloadColumn(binary_units=True),
                                     TimeRemainingColumn(), console=_console(), transient=True)
            self.task = self.progress.add_task("walk", total=total)
            self.progress.start()
        self.progress.update(self.task, completed=done)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _is_64bit() -> bool:
    try:
        return gdb.lookup_type("void").pointer().sizeof == 8
    except gdb.error:
        return True


def _architecture() -> str:
    """The selected inferior's architecture as gdb names it ("i386"), or "32-bit" if gdb cannot say."""
    try:
        return gdb.selected_inferior().architecture().name()
    except (gdb.error, AttributeError, RuntimeError):
        return "32-bit"


def load_state(walk_chunks: bool = False) -> HeapState:
    """Discovers and decodes the selected inferior's heap (with every chunk walked if WALK_CHUNKS)."""
    return load_target(walk_chunks)[0]


def _console():
    return tables.make_console(_GdbFile(), _interactive())


def _console_with_header(state: HeapState):
    """A console that has printed the target, the glibc and how main_arena was found."""
    console = _console()
    console.print(tables.header_text(state), end="")
    return console


def _print_findings(console, findings) -> None:
    text = tables.findings_text(findings)
    if text is not None:
        console.print(text)


#: gdb's permission settings that keep a command from changing the target (see "Observer Mode" in gdb's manual)
_PERMISSIONS = ("may-write-memory", "may-write-registers", "may-call-functions", "may-insert-breakpoints")


class read_only:
    """Turns off gdb's permissions to write memory and registers, call functions and insert breakpoints in
    the target for the duration of a command, and restores them after: heapwalk only reads, and a bug or
    a user expression (``heapwalk chunk 'free(p)'``) cannot change the process."""

    def __enter__(self):
        self.saved = {}
        for name in _PERMISSIONS:
            try:
                self.saved[name] = gdb.parameter(name)
                gdb.execute(f"set {name} off", to_string=True)
            except gdb.error:  # some cannot change while a live process runs; gdb keeps them as they are
                self.saved.pop(name, None)
        return self

    def __exit__(self, *exc):
        for name, value in self.saved.items():
            try:
                gdb.execute(f"set {name} {'on' if value else 'off'}", to_string=True)
            except gdb.error:
                pass
        return False


def _print_partial(console, notes) -> None:
    text = tables.partial_text(notes)
    if text is not None:
        console.print(text, end="")


def _print_damage(console, state: HeapState, findings) -> None:
    """What is partial in STATE, then FINDINGS: the tail of every command that shows decoded numbers."""
    _print_partial(console, partial(state))
    _print_findings(console, findings)


class _Subcommand(gdb.Command):
    """Base: argparse-based subcommand of ``heapwalk``."""

    name = ""

    def __init__(self):
        self.parser = self.make_parser()
        self.__doc__ = self.parser.format_help()
        super().__init__(f"heapwalk {self.name}", gdb.COMMAND_DATA)

    def make_parser(self) -> argparse.ArgumentParser:
        raise NotImplementedError

    def run(self, args) -> None:
        raise NotImplementedError

    def invoke(self, argument: str, from_tty: bool) -> None:
        try:
            args = self.parser.parse_args(gdb.string_to_argv(argument))
            with read_only(), gc_paused():
                self.run(args)
        except _HelpShown:
            return
        except (UserError, DiscoveryError) as exc:
            raise gdb.GdbError(str(exc)) from None
        except OSError as exc:  # a --json/--xml FILE that cannot be written, mostly
            where = f"cannot write {exc.filename}" if exc.filename else "system error"
            raise gdb.GdbError(f"heapwalk {self.name}: {where}: {exc.strerror or exc}") from None
        except gdb.GdbError:
            raise
        except Exception as exc:  # an internal error: one line unless debugging
            if _Settings.debug is not None and _Settings.debug.value:
                traceback.print_exc()
            raise gdb.GdbError(f"heapwalk {self.name}: internal error: {type(exc).__name__}: {exc} "
                               "('set heapwalk debug on' shows a traceback)") from None


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="also write the result as JSON (schema: docs/json.md)")


class ArenasCommand(_Subcommand):
    name = "arenas"

    def make_parser(self):
        p = _Parser(prog="heapwalk arenas", description="List every arena (main and thread arenas, in ring "
                    "order) with its system memory, top chunk, and the free bytes (chunk count) held in each "
                    "kind of free list: tcache (of the threads using the arena), fastbins, unsorted, small, large.")
        _json_option(p)
        return p

    def run(self, args) -> None:
        state = load_state(walk_chunks=True)
        console = _console_with_header(state)
        console.print(tables.arenas_table(state, _interactive()))
        _print_damage(console, state, state.all_findings())
        if args.json:
            jsondoc.dump(jsondoc.state_to_json(state), args.json)


class BinsCommand(_Subcommand):
    name = "bins"

    def make_parser(self):
        p = _Parser(prog="heapwalk bins", description="Show the free lists of each arena: fastbins, the unsorted "
                    "bin, small bins and large bins (chunk sizes, counts, bytes). KIND limits the output to one "
                    "kind: fast, unsorted, small or large.")
        p.add_argument("kind", nargs="?", choices=jsondoc.KINDS, help="only this kind of list")
        p.add_argument("--arena", metavar="ADDR", help="only the arena at ADDR (or its number in the ring)")
        p.add_argument("--chunks", action="store_true", help="list the chunk addresses of each bin")
        _json_option(p)
        return p

    def run(self, args) -> None:
        state = load_state()
        arenas = list(state.arenas)
        if args.arena is not None:
            wanted = _int(args.arena)
            arenas = [a for a in arenas if a.address == wanted or (wanted < 4096 and a.number == wanted)]
            if not arenas:
                raise UserError(f"heapwalk bins: no arena at {args.arena} (see 'heapwalk arenas')")
        kinds = {args.kind} if args.kind else set(jsondoc.KINDS)
        console = _console_with_header(state)
        console.print(tables.bins_tables(state, arenas, kinds, _interactive(), args.chunks))
        _print_damage(console, state, [f for a in arenas for f in a.findings] + list(state.findings))
        if args.json:
            jsondoc.dump(jsondoc.state_to_json(state, arenas=[a.address for a in arenas], kinds=kinds,
                                               threads=[]), args.json)


class TcacheCommand(_Subcommand):
    name = "tcache"

    def make_parser(self):
        p = _Parser(prog="heapwalk tcache", description="Show the tcache of every thread (or of thread N): "
                    "the thread's arena, and each non-empty tcache bin with its chunk size, count and entries "
                    "(user-memory addresses, list head first).")
        p.add_argument("--thread", metavar="N", type=int, help="only gdb thread number N")
        p.add_argument("--entries", action="store_true", help="list every entry, not only the first few")
        _json_option(p)
        return p

    def run(self, args) -> None:
        state = load_state()
        threads = list(state.threads)
        if args.thread is not None:
            threads = [t for t in threads if t.number == args.thread]
            if not threads:
                raise UserError(f"heapwalk tcache: no thread {args.thread} (see 'info threads')")
        console = _console_with_header(state)
        scanned = state.scanned_tcaches if args.thread is None else ()
        console.print(tables.tcache_tables(state, threads, _interactive(), args.entries, scanned))
        _print_damage(console, state, [f for t in threads if t.tcache for f in t.tcache.findings]
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


def _arena_address(state: HeapState, text: str) -> int:
    wanted = _int(text)
    for a in state.arenas:
        if a.address == wanted or (wanted < 4096 and a.number == wanted):
            return a.address
    raise UserError(f"no arena at {text} (see 'heapwalk arenas')")


_PAGE_ROWS = 100  # rows of 'heapwalk chunks' printed at once


class ChunksCommand(_Subcommand):
    name = "chunks"

    def make_parser(self):
        p = _Parser(prog="heapwalk chunks", description="Walk every chunk of every heap in address order and "
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
        _json_option(p)
        return p

    def run(self, args) -> None:
        state, mem, layout = load_target()
        flt = chunkinfo.ChunkFilter(arena=_arena_address(state, args.arena) if args.arena else None,
                                    free=args.free, used=args.used, min_size=_size(args.min) if args.min else 0,
                                    max_size=_size(args.max) if args.max else None)
        console = _console_with_header(state)
        shown, total, count, page, printed = 0, 0, 0, [], False
        walk_findings: list = []
        writer = jsondoc.ChunksWriter(args.json, state) if args.json else None
        try:  # the listing is printed a page at a time and the JSON written a chunk at a time, as the walk goes
            for arena, chunk in chunkinfo.chunks(mem, layout, state, flt, walk_findings):
                count += 1
                total += chunk.size
                if writer is not None:
                    writer.add(arena, chunk)
                if args.limit == 0 or shown < args.limit:
                    shown += 1
                    page.append((arena, chunk))
                    if len(page) == _PAGE_ROWS:
                        console.print(tables.chunks_table(page, _interactive(), first=not printed))
                        page, printed = [], True
        finally:
            if writer is not None:
                writer.close()
        if page or not printed:
            console.print(tables.chunks_table(page, _interactive(), first=not printed))
        more = f" (first {shown} shown; --limit 0 shows all)" if shown < count else ""
        console.print(f"{count} chunks, {tables.human(total)}{more}")
        damaged = [f for f in walk_findings if f.severity is Severity.ERROR]
        if damaged:
            console.print(f"partial results: the walk met {len(damaged)} damaged place(s); "
                          "'heapwalk check' lists them")


class ChunkCommand(_Subcommand):
    name = "chunk"

    def make_parser(self):
        p = _Parser(prog="heapwalk chunk", description="Describe the chunk holding ADDRESS (a user pointer or "
                    "any address inside a chunk): its arena and heap, size and flags, state, the list that "
                    "holds it, and its neighbours.")
        p.add_argument("address", metavar="ADDRESS")
        _json_option(p)
        return p

    def run(self, args) -> None:
        address = _int(args.address)
        state, mem, layout = load_target()
        found = chunkinfo.locate(mem, layout, state, address)
        if found is not None:
            _console().print(tables.chunk_text(found, address))
            if args.json:
                jsondoc.dump(jsondoc.chunk_document(state, address, located=found), args.json)
            return
        state, mem, layout = load_target(walk_chunks=True)  # finds the mmapped chunks too
        mmapped = next((c for c in state.mmapped if c.address <= address < c.address + c.span), None)
        if mmapped is None:
            raise UserError(f"heapwalk chunk: {address:#x} is in no arena's heap and in no mmapped chunk")
        listed = chunkinfo.where_listed(state, mmapped.address)
        _console().print(f"{address:#x} is {address - mmapped.address} bytes into the mmapped chunk at "
                         f"{mmapped.address:#x} (user memory {mmapped.address + 16:#x})\n"
                         f"  size {mmapped.size:#x}, its own mapping of {tables.human(mmapped.span)}"
                         + (f"\n  listed in {listed}" if listed else "\n  state: in use (freeing it unmaps it)"))
        if args.json:
            jsondoc.dump(jsondoc.chunk_document(state, address, mmapped=mmapped, listed=listed), args.json)


class ThreadsCommand(_Subcommand):
    name = "threads"

    def make_parser(self):
        p = _Parser(prog="heapwalk threads", description="Every thread: its arena and the chunks and bytes its "
                    "tcache holds; every arena: how many threads use it, attached_threads, and whether it waits "
                    "on the free list of exited threads; the arena limit.")
        _json_option(p)
        return p

    def run(self, args) -> None:
        state = load_state()
        console = _console_with_header(state)
        console.print(tables.threads_group(state, _interactive()))
        if args.json:
            jsondoc.dump(jsondoc.state_to_json(state, kinds=()), args.json)


class ReportCommand(_Subcommand):
    name = "report"

    def make_parser(self):
        p = _Parser(prog="heapwalk report", description="Where every byte of every arena is: per arena the "
                    "system memory, in-use bytes, free bytes by kind, top and overhead, which add up to "
                    "system_mem; a free-chunk size histogram; what malloc_trim(0) would give back; and a verdict "
                    "(leak or fragmentation, and the remedies the numbers support).")
        _json_option(p)
        p.add_argument("--xml", metavar="FILE", help="also write glibc's malloc_info XML for this heap "
                       "(what the process would have printed: no tcache)")
        return p

    def run(self, args) -> None:
        state = load_state(walk_chunks=True)
        rep = report.build_report(heap_view(state))
        notes = partial(state)
        console = _console_with_header(state)
        console.print(tables.report_group(state, rep, _interactive()))
        _print_partial(console, notes)
        _print_findings(console, state.all_findings())
        if args.json:
            jsondoc.dump(jsondoc.report_document(state, rep, notes), args.json)
        if args.xml:
            with open(args.xml, "w", encoding="utf-8") as fh:
                fh.write(mallocinfo.malloc_info_xml(state))


class CheckCommand(_Subcommand):
    name = "check"

    def make_parser(self):
        p = _Parser(prog="heapwalk check", description="Validate every invariant glibc relies on, in every "
                    "arena, heap, bin and tcache, and list each violation: kind, address, structure, what was "
                    "expected and what was found. Sets $heapwalk_errors and $heapwalk_warnings; when the heap "
                    "is damaged the command ends with an error, so 'gdb -batch' exits with status 1 when it is "
                    "the last command (see docs/forensics.md).")
        p.add_argument("--limit", metavar="N", type=int, default=200,
                       help="print at most N findings (default 200; 0: all); --json has them all")
        _json_option(p)
        return p

    def run(self, args) -> None:
        for name in ("heapwalk_errors", "heapwalk_warnings"):
            gdb.set_convenience_variable(name, None)
        state, mem, layout = load_target(walk_chunks=True)
        result = check.check(state, mem, layout)
        checked = check.scope(state)
        console = _console_with_header(state)
        console.print(tables.check_text(result, checked, args.limit or len(result.findings)), end="")
        _print_partial(console, result.partial)
        if args.json:
            jsondoc.dump(jsondoc.check_document(state, result, checked), args.json)
        gdb.set_convenience_variable("heapwalk_errors", len(result.errors))
        gdb.set_convenience_variable("heapwalk_warnings", len(result.warnings))
        if not result.clean:
            raise UserError(f"heapwalk check: the heap is damaged ({len(result.errors)} error(s))")


class HeapwalkPrefix(gdb.Command):
    """heapwalk: glibc heap forensics for cores and live processes.

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
Each takes --json FILE. 'help heapwalk SUBCOMMAND' describes its options.
Settings: 'set heapwalk debug on|off', 'set heapwalk glibc-version X.Y',
'set heapwalk main-arena ADDRESS' ('show heapwalk' lists them)."""

    def __init__(self):
        super().__init__("heapwalk", gdb.COMMAND_DATA, prefix=True)

    def invoke(self, argument: str, from_tty: bool) -> None:
        if argument.strip():
            raise gdb.GdbError(f"heapwalk: unknown subcommand '{argument.split()[0]}' (see 'help heapwalk')")
        gdb.execute("help heapwalk")


class _SetPrefix(gdb.Command):
    """Settings of heapwalk."""

    def __init__(self, verb: str):
        super().__init__(f"{verb} heapwalk", gdb.COMMAND_DATA, prefix=True)


class DebugParameter(gdb.Parameter):
    """When on, heapwalk shows Python tracebacks for its internal errors."""

    set_doc = "Set whether heapwalk shows tracebacks of internal errors."
    show_doc = "Show whether heapwalk shows tracebacks of internal errors."

    def __init__(self):
        super().__init__("heapwalk debug", gdb.COMMAND_DATA, gdb.PARAM_BOOLEAN)
        self.value = False


class _StringParameter(gdb.Parameter):
    """A heapwalk override setting; empty means: discover it from the target."""

    def __init__(self, name: str, what: str):
        self.set_doc = f"Set {what} (empty: discover it from the target)."
        self.show_doc = f"Show the {what} override."
        super().__init__(f"heapwalk {name}", gdb.COMMAND_DATA, gdb.PARAM_STRING)
        self.value = ""


def register() -> None:
    """Creates the commands and settings in gdb (idempotent enough to re-source)."""
    HeapwalkPrefix()
    _SetPrefix("set")
    _SetPrefix("show")
    _Settings.debug = DebugParameter()
    _Settings.glibc_version = _StringParameter("glibc-version", "the glibc version (X.Y) heapwalk decodes as")
    _Settings.main_arena = _StringParameter("main-arena", "the address of main_arena")
    ArenasCommand()
    BinsCommand()
    TcacheCommand()
    ChunksCommand()
    ChunkCommand()
    ReportCommand()
    ThreadsCommand()
    CheckCommand()
