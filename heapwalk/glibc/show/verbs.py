"""The commands only glibc's malloc has: 'heapwalk bins', 'tcache', 'chunks' and 'chunk'.  Each reads its
arguments and prints through the front end it is given (`heapwalk.face.Front`), so it runs the same
in gdb and in a test; no gdb here."""

from __future__ import annotations

from heapwalk.face import Verb, Wants
from heapwalk.common.errors import UsageError
from heapwalk.common.findings import Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.forensics import chunkinfo
from heapwalk.glibc.model import ChunkState
from heapwalk.glibc.show import documents
from heapwalk.glibc.show import tables
from heapwalk.glibc.walk.chunks import extents

__all__ = ["VERBS"]

#: rows of 'heapwalk chunks' printed at once
_PAGE_ROWS = 100


def _json_option(p) -> None:
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON (schema: docs/json.md)")


def _arena_option(p) -> None:
    p.add_argument("--arena", metavar="ADDR", help="only the arena at ADDR (or its number in the ring)")


def _selected_arena(heap, front, text: str, command: str):
    """The arena TEXT names (its address, or its number in the ring), for COMMAND's --arena option."""
    arena = heap.state.arena_named(front.evaluate(text))
    if arena is None:
        raise UsageError(f"heapwalk {command}: no arena at {text} (see 'heapwalk arenas')")
    return arena


def _bins_arguments(p) -> None:
    p.add_argument("kind", nargs="?", choices=documents.KINDS, help="only this kind of list")
    _arena_option(p)
    p.add_argument("--chunks", action="store_true", help="list the chunk addresses of each bin")
    _json_option(p)


def _bins(heap, args, front) -> None:
    state = heap.state
    arenas = list(state.arenas) if args.arena is None else [_selected_arena(heap, front, args.arena, "bins")]
    kinds = {args.kind} if args.kind else set(documents.KINDS)
    console = front.console_with_header(heap)
    console.print(tables.bins_tables(state, arenas, kinds, front.interactive, args.chunks))
    front.print_damage(console, heap, [f for a in arenas for f in a.findings] + list(state.findings))
    if args.json:
        documents.dump(documents.state_to_json(state, arenas=[a.address for a in arenas], kinds=kinds, threads=[]),
                     args.json)


def _tcache_arguments(p) -> None:
    p.add_argument("--thread", metavar="N", type=int, help="only gdb thread number N")
    p.add_argument("--entries", action="store_true", help="list every entry, not only the first few")
    _json_option(p)


def _tcache(heap, args, front) -> None:
    state = heap.state
    threads = list(state.threads)
    if args.thread is not None:
        threads = [t for t in threads if t.number == args.thread]
        if not threads:
            raise UsageError(f"heapwalk tcache: no thread {args.thread} (see 'info threads')")
    console = front.console_with_header(heap)
    scanned = state.scanned_tcaches if args.thread is None else ()
    console.print(tables.tcache_tables(state, threads, front.interactive, args.entries, scanned))
    front.print_damage(console, heap, [f for t in threads if t.tcache for f in t.tcache.findings]
                       + [f for tc in scanned for f in tc.findings]
                       + [f for f in state.findings if f.kind is Kind.TLS_LOST])
    if args.json:
        documents.dump(documents.state_to_json(state, arenas=[], threads=[t.number for t in threads]), args.json)


def size_argument(text: str) -> int:
    """'4096', '0x1000', '4k', '2M' -> bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = units.get(t[-1:], 1)
    t = t[:-1] if t[-1:] in units else t
    try:
        return int(t, 0) * scale
    except ValueError:
        raise UsageError(f"not a size: {text} (e.g. 4096, 0x1000, 64k, 2M)") from None


def _chunks_arguments(p) -> None:
    _arena_option(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--free", action="store_true", help="only free chunks (tcache, fastbins, bins)")
    which.add_argument("--used", action="store_true", help="only chunks in use")
    p.add_argument("--min", metavar="SIZE", help="only chunks of at least SIZE bytes (4096, 0x1000, 64k)")
    p.add_argument("--max", metavar="SIZE", help="only chunks of at most SIZE bytes")
    p.add_argument("--limit", metavar="N", type=int, default=200,
                   help="print at most N chunks (default 200; 0: all); --json has them all")
    _json_option(p)


def _chunks(heap, args, front) -> None:
    state, mem, layout = heap.state, heap.mem, heap.layout
    arena = _selected_arena(heap, front, args.arena, "chunks").address if args.arena else None
    flt = chunkinfo.ChunkFilter(arena=arena, free=args.free, used=args.used,
                                min_size=size_argument(args.min) if args.min else 0,
                                max_size=size_argument(args.max) if args.max else None)
    console = front.console_with_header(heap)
    shown, total, count, page, printed = 0, 0, 0, [], False
    walk_findings: list = []
    writer = documents.ChunksWriter(args.json, state) if args.json else None
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
                        console.print(tables.chunks_table(page, front.interactive, first=not printed))
                        page, printed = [], True
    finally:
        if writer is not None:
            writer.close()
    if page or not printed:
        console.print(tables.chunks_table(page, front.interactive, first=not printed))
    more = f" (first {shown} shown; --limit 0 shows all)" if shown < count else ""
    console.print(f"{count} chunks, {tables.human(total)}{more}")
    damaged = [f for f in walk_findings if f.severity is Severity.ERROR]
    if damaged:
        console.print(f"partial results: the walk met {len(damaged)} damaged place(s); 'heapwalk check' lists them")


def _chunk_arguments(p) -> None:
    p.add_argument("address", metavar="ADDRESS")
    _json_option(p)


def _chunk(heap, args, front) -> None:
    address = front.evaluate(args.address)
    found = chunkinfo.locate(heap.mem, heap.layout, heap.state, address)
    if found is not None:
        console = front.console()
        console.print(tables.chunk_text(found, address))
        reach = front.reach(heap, found.chunk.address) if found.chunk.state is ChunkState.IN_USE else None
        if reach is not None:
            console.print(f"  {reach}")
        if args.json:
            documents.dump(documents.chunk_document(heap.state, address, located=found, reach=reach), args.json)
        return
    state = front.reload(heap, Wants(walk=True)).state  # finds the mmapped chunks too
    mmapped = next((c for c in state.mmapped if c.address <= address < c.address + c.span), None)
    if mmapped is None:
        holder = next(((a, e) for a in state.arenas for e in extents(a, heap.layout) if e.start <= address < e.end),
                      None)
        if holder is not None:       # in a heap whose walk does not land on a chunk that holds it: damage
            arena, extent = holder
            raise UsageError(f"heapwalk chunk: {address:#x} is in arena {arena.number}'s heap "
                             f"{extent.start:#x}-{extent.end:#x}, but the walk of that heap lands on no chunk that "
                             "holds it: the heap is damaged before it ('heapwalk check' names where)")
        raise UsageError(f"heapwalk chunk: {address:#x} is in no arena's heap and in no mmapped chunk")
    listed = chunkinfo.where_listed(state, mmapped.address)
    front.console().print(f"{address:#x} is {address - mmapped.address} bytes into the mmapped chunk at "
                          f"{mmapped.address:#x} (user memory {mmapped.address + 16:#x})\n"
                          f"  size {mmapped.size:#x}, its own mapping of {tables.human(mmapped.span)}"
                          + (f"\n  listed in {listed}" if listed else "\n  state: in use (freeing it unmaps it)"))
    if args.json:
        documents.dump(documents.chunk_document(state, address, mmapped=mmapped, listed=listed), args.json)


VERBS = (
    Verb("bins", "the free lists of each arena (fast, unsorted, small, large)",
         "Show the free lists of each arena: fastbins, the unsorted bin, small bins and large bins (chunk sizes, "
         "counts, bytes). KIND limits the output to one kind: fast, unsorted, small or large.",
         _bins_arguments, _bins),
    Verb("tcache", "every thread's tcache",
         "Show the tcache of every thread (or of thread N): the thread's arena, and each non-empty tcache bin "
         "with its chunk size, count and entries (user-memory addresses, list head first).",
         _tcache_arguments, _tcache),
    Verb("chunks", "every chunk of every heap, filtered by arena, state and size",
         "Walk every chunk of every heap in address order and list those that match: address, size, state "
         "(in_use, tcache, fast, unsorted, small, large, top, tcache_struct, fencepost), flags and arena.",
         _chunks_arguments, _chunks),
    Verb("chunk", "the chunk holding an address: state, list, neighbours",
         "Describe the chunk holding ADDRESS (a user pointer or any address inside a chunk): its arena and heap, "
         "size and flags, state, the list that holds it, and its neighbours; for a chunk in use, whether "
         "anything still points to it (one path from a root, or leaked: see 'heapwalk leaks').",
         _chunk_arguments, _chunk),
)
