"""glibc's tables for people (rich renderables built from a `HeapState`): the header, the arenas, the free
lists, the tcaches, the threads, the chunks and one chunk.  Interactive terminals get rounded boxes and
colour; logs (``gdb -batch``, pipes) get plain ASCII rules."""

from __future__ import annotations

from typing import Iterable

from rich.console import Group
from rich.table import Table
from rich.text import Text

from heapwalk.analysis.report import counted, human
from heapwalk.glibc.model import Arena, BinKind, BinList, HeapState, Tcache, Thread
from heapwalk.glibc.account.summary import arena_limit
from heapwalk.output.consoles import box_for

__all__ = ["header_text", "arenas_table", "bins_tables", "tcache_tables", "threads_group", "chunks_table",
           "chunk_text", "check_scope", "human"]


def _sum(lists: Iterable[BinList]) -> tuple[int, int]:
    count = total = 0
    for b in lists:
        count += b.count
        total += b.total
    return count, total


def _cell(count: int, total: int) -> str:
    return "-" if not count else f"{human(total)} ({count})"


def header_text(state: HeapState, with_target: bool = True) -> Text:
    by = {f.name: f.found_by for f in state.facts}
    text = Text()
    text.append(f"{state.target}\n" if state.target and with_target else "")
    text.append(f"glibc {state.version_text} (version: {by.get('glibc_version', '?')})\n")
    if state.page_size != 4096:
        text.append(f"pages of {human(state.page_size)} (the kernel's AT_PAGESZ: trim gives back whole pages)\n")
    text.append(f"main_arena {'unknown' if state.main_arena is None else f'{state.main_arena:#x}'} "
                f"({by.get('main_arena', '?')})\n")
    if state.mp is not None:
        text.append(f"mp_ {state.mp.address:#x} ({by.get('mp_', '?')})\n")
    else:
        text.append(f"mp_ unknown ({by.get('mp_', 'not read')})\n")
    return text


def arenas_table(state: HeapState, interactive: bool) -> Table:
    """One row per arena: system memory, top, and free bytes (count) per kind of list."""
    tcache_by_arena: dict[int, tuple[int, int]] = {}
    owned = [(t.arena, t.tcache) for t in state.threads if t.tcache and t.arena]
    for arena, tcache in owned + [(tc.arena, tc) for tc in state.scanned_tcaches]:
        c, b = tcache_by_arena.get(arena, (0, 0))
        tcache_by_arena[arena] = (c + tcache.count, b + tcache.total)
    table = Table(title="arenas", box=box_for(interactive), title_justify="left")
    for name, justify in (("#", "right"), ("arena", "left"), ("kind", "left"), ("threads", "right"),
                          ("heaps", "right"), ("system", "right"), ("top", "right"), ("tcache", "right"),
                          ("fastbins", "right"), ("unsorted", "right"), ("small", "right"), ("large", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    totals = dict(system=0, top=0, tc=[0, 0], fast=[0, 0], uns=[0, 0], small=[0, 0], large=[0, 0])
    for a in state.arenas:
        fast = _sum(a.fastbins)
        uns = _sum([a.unsorted])
        small = _sum(b for b in a.bins if b.kind is BinKind.SMALL)
        large = _sum(b for b in a.bins if b.kind is BinKind.LARGE)
        tc = tcache_by_arena.get(a.address, (0, 0))
        threads = "-" if a.attached_threads is None else str(a.attached_threads)
        if a.on_free_list:
            threads += " (free list)"
        table.add_row(str(a.number), f"{a.address:#x}", a.kind, threads, str(len(a.heaps)), human(a.system_mem),
                      human(a.top_size), _cell(*tc), _cell(*fast), _cell(*uns), _cell(*small), _cell(*large))
        totals["system"] += a.system_mem
        totals["top"] += a.top_size
        for key, val in (("tc", tc), ("fast", fast), ("uns", uns), ("small", small), ("large", large)):
            totals[key][0] += val[0]
            totals[key][1] += val[1]
    if len(state.arenas) > 1:
        table.add_section()
        table.add_row("", "total", counted(len(state.arenas), "arenas"), "", "", human(totals["system"]),
                      human(totals["top"]), *(_cell(*totals[k]) for k in ("tc", "fast", "uns", "small", "large")))
    return table


def _bin_rows(table: Table, lists: Iterable[BinList], show_chunks: bool) -> None:
    for b in lists:
        if not b.count and b.complete:
            continue
        sizes = f"{b.min_size:#x}" if b.min_size == b.max_size else f"{b.min_size:#x}-{b.max_size:#x}"
        note = "" if b.complete else "partial: see findings"
        chunks = ""
        if show_chunks:
            chunks = " ".join(f"{c:#x}" for c in b.chunks)
        table.add_row(b.kind.value, str(b.index), sizes, str(b.count), human(b.total), note or chunks)


def bins_tables(state: HeapState, arenas: Iterable[Arena], kinds: set[str], interactive: bool,
                show_chunks: bool = False) -> Group:
    """For each arena, a table of its non-empty free lists of the given KINDS."""
    parts = []
    for a in arenas:
        table = Table(title=f"arena {a.number} ({a.kind}) at {a.address:#x}: free lists", box=box_for(interactive),
                      title_justify="left")
        for name, justify in (("kind", "left"), ("bin", "right"), ("chunk sizes", "right"), ("count", "right"),
                              ("bytes", "right"), ("chunks" if show_chunks else "note", "left")):
            table.add_column(name, justify=justify, no_wrap=name != "chunks")
        if "fast" in kinds:
            _bin_rows(table, a.fastbins, show_chunks)
        if "unsorted" in kinds:
            _bin_rows(table, [a.unsorted], show_chunks)
        if "small" in kinds:
            _bin_rows(table, (b for b in a.bins if b.kind is BinKind.SMALL), show_chunks)
        if "large" in kinds:
            _bin_rows(table, (b for b in a.bins if b.kind is BinKind.LARGE), show_chunks)
        if not table.row_count:
            table.add_row("-", "", "", "0", "0 B", "no free chunks in these lists")
        parts.append(table)
        extra = Text(f"top {a.top:#x} ({human(a.top_size)})")
        if a.last_remainder:
            extra.append(f", last_remainder {a.last_remainder:#x}")
        parts.append(extra)
    return Group(*parts)


def tcache_tables(state: HeapState, threads: Iterable[Thread], interactive: bool, show_entries: bool,
                  scanned: Iterable[Tcache] = ()) -> Group:
    """A summary row per thread and per tcache found by scanning (SCANNED), then each non-empty tcache bin
    (with entries if asked)."""
    threads, scanned = list(threads), list(scanned)
    summary = Table(title="tcache per thread", box=box_for(interactive), title_justify="left")
    for name, justify in (("thread", "right"), ("lwp", "right"), ("arena", "left"), ("tcache", "left"),
                          ("chunks", "right"), ("bytes", "right")):
        summary.add_column(name, justify=justify, no_wrap=True)
    arena_numbers = {a.address: a.number for a in state.arenas}
    for t in threads:
        arena = "-" if not t.arena else f"{t.arena:#x} (#{arena_numbers.get(t.arena, '?')})"
        if t.tls_lost:
            summary.add_row(str(t.number), str(t.lwp), "unknown", "unknown (TLS not in the core)", "-", "-")
        elif t.tcache is None:
            summary.add_row(str(t.number), str(t.lwp), arena, "none" if not t.tcache_pointer else "none (dummy)", "-", "-")
        else:
            summary.add_row(str(t.number), str(t.lwp), arena, f"{t.tcache.address:#x}", str(t.tcache.count),
                            human(t.tcache.total))
    for tc in scanned:
        summary.add_row("?", "-", f"{tc.arena:#x} (#{arena_numbers.get(tc.arena, '?')}, holds it)",
                        f"{tc.address:#x} (found by scanning)", str(tc.count), human(tc.total))
    parts: list = [summary]
    titled = [(f"thread {t.number} (lwp {t.lwp}) tcache at {t.tcache.address:#x}", t.tcache)
              for t in threads if t.tcache is not None]
    titled += [(f"tcache at {tc.address:#x} (found by scanning arena #{arena_numbers.get(tc.arena, '?')}; "
                "thread unknown)", tc) for tc in scanned]
    for title, tcache in titled:
        if not tcache.bins:
            continue
        table = Table(title=title, box=box_for(interactive), title_justify="left")
        for name, justify in (("bin", "right"), ("chunk size", "right"), ("count", "right"),
                              ("entries" if show_entries else "first entries", "left")):
            table.add_column(name, justify=justify, no_wrap=name == "bin")
        for b in tcache.bins:
            shown = b.entries if show_entries else b.entries[:3]
            text = " ".join(f"{e:#x}" for e in shown)
            if not show_entries and len(b.entries) > 3:
                text += f" ... (+{len(b.entries) - 3}; --entries lists all)"
            if not b.complete:
                text += "  [partial: see findings]"
            table.add_row(str(b.index), f"{b.chunk_size:#x}", str(b.count), text)
        parts.append(table)
    return Group(*parts)


def _flags(flags: int) -> str:
    return "".join(c for bit, c in ((1, "P"), (2, "M"), (4, "A")) if flags & bit) or "-"


def chunks_table(rows, interactive: bool, first: bool = True) -> Table:
    """One row per (arena, chunk): address, size, state, flags (P prev-in-use, M mmapped, A non-main arena).

    Columns have fixed widths, so a long listing can be printed a page at a time as the walk goes (FIRST:
    the page with the title and header) and the pages line up."""
    table = Table(title="chunks" if first else None, box=box_for(interactive), title_justify="left", show_header=first)
    for name, justify, width in (("address", "left", 18), ("size", "right", 12), ("state", "left", 13),
                                 ("flags", "left", 5), ("arena", "right", 5)):
        table.add_column(name, justify=justify, no_wrap=True, width=width)
    for arena, chunk in rows:
        table.add_row(f"{chunk.address:#x}", f"{chunk.size:#x}", chunk.state.value, _flags(chunk.flags),
                      str(arena.number))
    return table


def chunk_text(found, address: int) -> Text:
    """What `chunkinfo.locate` found, as a few lines."""
    c = found.chunk
    text = Text()
    offset = address - c.address
    text.append(f"{address:#x} is {offset} bytes into the chunk at {c.address:#x} (user memory {c.address + 16:#x})\n")
    text.append(f"  size {c.size:#x} ({human(c.size)}), flags {_flags(c.flags)}, state {c.state.value}\n")
    text.append(f"  arena {found.arena.number} ({found.arena.kind}) at {found.arena.address:#x}, "
                f"heap {c.extent:#x}\n")
    if found.listed:
        text.append(f"  listed in {found.listed}\n")
    for label, n in (("previous", found.previous), ("next", found.following)):
        if n is not None:
            text.append(f"  {label}: {n.address:#x}, size {n.size:#x}, {n.state.value}\n")
    return text


def threads_group(state: HeapState, interactive: bool) -> Group:
    """Every thread with its arena and tcache; then the arenas with their users, and the users glibc counts
    (its attached_threads)."""
    numbers = {a.address: a.number for a in state.arenas}
    named = any(t.name for t in state.threads)       # a core gdb wrote has no names: no column then
    table = Table(title="threads", box=box_for(interactive), title_justify="left")
    for name, justify in (("thread", "right"), ("lwp", "right"), *((("name", "left"),) if named else ()),
                          ("arena", "left"), ("tcache chunks", "right"), ("tcache bytes", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    users: dict[int, int] = {}
    for t in state.threads:
        if t.arena:
            users[t.arena] = users.get(t.arena, 0) + 1
        arena = f"#{numbers[t.arena]} {t.arena:#x}" if t.arena in numbers else ("-" if not t.arena else
                                                                              f"{t.arena:#x} (not in the ring)")
        if t.tls_lost:
            arena = "unknown (TLS not in the core)"
        count = str(t.tcache.count) if t.tcache else "-"
        table.add_row(str(t.number), str(t.lwp), *((t.name or "-",) if named else ()), arena, count,
                      human(t.tcache.total) if t.tcache else "-")
    arenas = Table(title="arenas and their threads", box=box_for(interactive), title_justify="left")
    for name, justify in (("#", "right"), ("arena", "left"), ("kind", "left"), ("threads using it", "right"),
                          ("threads glibc counts", "right"), ("on free list", "left")):
        arenas.add_column(name, justify=justify, no_wrap=True)
    for a in state.arenas:
        arenas.add_row(str(a.number), f"{a.address:#x}", a.kind, str(users.get(a.address, 0)),
                       "-" if a.attached_threads is None else str(a.attached_threads),
                       "yes" if a.on_free_list else "")
    text = Text(f"{len(state.threads)} threads, {len(state.arenas)} arenas; arena limit {arena_limit(state)}\n")
    lost = sum(1 for t in state.threads if t.tls_lost)
    if lost:
        text.append(f"{lost} thread{'s' if lost > 1 else ''} not counted in 'threads using it': TLS not in the core\n")
    return Group(table, arenas, text)


def check_scope(checked: dict[str, int]) -> str:
    """What a check of glibc's heap covered, in words."""
    return (f"{checked['arenas']} arenas, {checked['heaps']} heaps, {checked['chunks']} chunks, "
            f"{checked['listed']} free-list entries, {checked['tcaches']} tcaches")
