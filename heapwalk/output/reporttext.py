"""The report in a terminal or a log, for any allocator: the arena table in the allocator's words
(`heapwalk.common.view.Words`), the allocator's summary lines, the histogram of the free pieces, its size classes,
the memory in use, and the verdict."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from heapwalk.analysis.report import Report, counted, human
from heapwalk.output.consoles import box_for
from heapwalk.output.inusedoc import in_use_tables
from heapwalk.common.view import Words

__all__ = ["report_group", "arena_table", "plain_lines"]


def arena_table(rep: Report, interactive: bool, words: Words) -> Table:
    """Each arena's bytes by what holds them, with a footer of totals."""
    table = Table(title="where the memory is", box=box_for(interactive), title_justify="left", show_footer=True)
    kinds = tuple(dict.fromkeys(k for a in rep.arenas for k in a.free))
    figures = ((words.system, lambda a: a.system),) + \
        ((("RSS", lambda a: a.resident),) if rep.residency else ()) + (("in use", lambda a: a.in_use),) + \
        words.columns(kinds) + ((("free in RAM", lambda a: a.idle_resident),) if rep.residency else ()) + \
        (words.last_columns or ((words.overhead, lambda a: a.overhead), (words.gives_back, lambda a: a.reclaim)))
    fixed = (("#", "right"), (words.arena, "left"), ("kind", "left"), ("threads", "right"), (words.heaps, "right"))
    totals = [counted(len(rep.arenas), words.arenas), "", "", ""]
    totals += [_shown(None if any(get(a) is None for a in rep.arenas) else sum(get(a) for a in rep.arenas))
               for _, get in figures]
    for (name, justify), footer in zip(fixed + tuple((name, "right") for name, _ in figures), ["", *totals]):
        table.add_column(name, justify=justify, no_wrap=True, footer=footer)
    for a in rep.arenas:
        table.add_row(str(a.number), f"{a.address:#x}" if a.address else "-", a.kind, str(a.threads), str(a.heaps),
                      *(_shown(get(a)) for _, get in figures))
    return table


def _shown(value: int | None) -> str:
    """A figure of the arena table: "-" where the target cannot say it."""
    return "-" if value is None else human(value)


def plain_lines(rep: Report, words: Words) -> Text:
    """The summary lines of an allocator that has none of its own: its large allocations, arenas, what it
    would give back, its free pieces."""
    lines = Text()
    lines.append(f"{words.large}: {rep.mmapped_count}, {human(rep.mmapped_bytes)}\n")
    limit = f"; {rep.arena_limit}" if rep.arena_limit else ""
    lines.append(f"arenas: {len(rep.arenas)} ({rep.arenas_on_free_list} with no thread){limit}\n")
    if not all(a.balanced for a in rep.arenas):
        lines.append("accounting: some arenas do not add up to what they hold (see the findings)\n", style="red")
    lines.append(f"{words.gives_back}: {human(rep.trim_total)}\n")
    lines.append(f"free {words.pieces}: {rep.free_chunks}, {human(rep.free_listed)}; largest "
                 f"{human(rep.largest_free)}\n")
    return lines


def report_group(rep: Report, interactive: bool, words: Words, lines: Text) -> Group:
    """The report: the arena table with totals, the allocator's summary LINES, the histogram, its size classes
    (when it has them), the memory in use, and the verdict."""
    hist = Table(title=f"free {words.pieces} by size", box=box_for(interactive), title_justify="left")
    for name in ("size", words.pieces, "bytes", "share"):
        hist.add_column(name, justify="right" if name != "size" else "left", no_wrap=True)
    for b in rep.histogram:
        hist.add_row(f"{human(b.low)} - {human(b.high)}", str(b.count), human(b.bytes),
                     f"{100 * b.bytes / rep.free_listed:.0f}%" if rep.free_listed else "-")
    parts = [arena_table(rep, interactive, words), lines, hist]
    if rep.size_classes:
        classes = Table(title=f"free {words.pieces} by {rep.allocator} size class", box=box_for(interactive),
                        title_justify="left")
        for name in ("class", words.pieces, "bytes"):
            classes.add_column(name, justify="right" if name != "class" else "left", no_wrap=True)
        for name, count, size in rep.classes:
            classes.add_row(name, str(count), human(size))
        parts.append(classes)
    parts += in_use_tables(rep.in_use_groups, rep.leaks, interactive, words.blocks, words.blocks_counted)
    verdict = Text("verdict:\n", style="bold")
    for sentence in rep.verdict:
        verdict.append(f"  - {sentence}\n")
    return Group(*parts, verdict)
