"""A rich table laid out as plain text without rich's renderer, for a console that is not a terminal (no colour,
nothing wrapped): the same lines, made a row at a time from the cells' text.  rich measures and renders every cell
through its segments (some 50 microseconds a row): `heapwalk bins` on a heap of nine arenas prints four
thousand rows, a quarter of a second of its time.

Only the tables heapwalk makes are laid out here (a box, a header, padding of one space each side, cells of one
line of text, columns justified left or right, a title on the left); anything else (a cell over several lines, a
control character, a nested renderable, a caption) gives None, and rich lays the table out as always.
tests/unit/output/test_plaintable.py holds the two equal."""

from __future__ import annotations

from rich import markup
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["plain_table"]


def plain_table(table: Table, console: Console) -> str | None:
    """The text rich prints for TABLE on CONSOLE (which must be no terminal and wide enough for the table), or
    None where the table holds anything this does not lay out as rich does."""
    if not _simple(table):
        return None
    columns = []
    for column in table.columns:
        cells = [_plain(column.header)] + [_plain(c) for c in column.cells] + \
            ([_plain(column.footer)] if table.show_footer else [])
        if any(c is None for c in cells):
            return None
        columns.append(cells)
    widths = [max(cell_len(c) for c in cells) + 2 for cells in columns]
    table_width = sum(widths) + len(widths) + 1
    if table_width > console.width:
        return None
    box = table.box.substitute(console.options, safe=table.safe_box if table.safe_box is not None else console.safe_box)
    out = []
    if table.title is not None:
        title = _plain(table.title)
        if title is None or table.title_justify not in ("left", "default") or \
                cell_len(title) > table_width and not console.soft_wrap:     # (rich wraps it then)
            return None
        out.append(title)
    out.append(box.get_top(widths))
    justify = [column.justify for column in table.columns]
    rows = list(zip(*columns))
    for i, cells in enumerate(rows):
        header, footer = i == 0, table.show_footer and i == len(rows) - 1
        if footer:
            out.append(box.get_row(widths, "foot", edge=True))
        edge, divider = ((box.head_left, box.head_vertical) if header else
                         (box.foot_left, box.foot_vertical) if footer else (box.mid_left, box.mid_vertical))
        right = box.head_right if header else box.foot_right if footer else box.mid_right
        out.append(edge + divider.join(_cell(text, width, how) for text, width, how in zip(cells, widths, justify))
                   + right)
        if header:
            out.append(box.get_row(widths, "head", edge=True))
        elif not footer and table.rows[i - 1].end_section and i < len(rows) - 1 - table.show_footer:
            out.append(box.get_row(widths, "row", edge=True))
    out.append(box.get_bottom(widths))
    return "\n".join(out) + "\n"


def _simple(table: Table) -> bool:
    """Whether TABLE is laid out as `plain_table` lays it out."""
    return (table.box is not None and table.show_header and table.show_edge and not table.show_lines
            and not table.leading and not table.expand and table.width is None and not table.min_width
            and table.caption is None and table.padding == (0, 1, 0, 1) and not table.collapse_padding
            and table.pad_edge and table.columns != [] and table.row_count > 0
            and all(column.justify in ("left", "right") and column.width is None and column.min_width is None
                    and column.max_width is None and column.ratio is None for column in table.columns))


def _plain(cell) -> str | None:
    """CELL's text as rich shows it (markup taken as rich takes it), or None where it is not one plain line."""
    if isinstance(cell, str):
        text = markup.render(cell).plain if "[" in cell else cell
    elif type(cell) is Text and cell.justify is None and cell.overflow is None and not cell.no_wrap:
        text = cell.plain
    else:
        return None
    if not text.isprintable():
        return None
    return text


def _cell(text: str, width: int, justify: str) -> str:
    """TEXT in a column WIDTH wide, a space each side."""
    room = width - 2 - cell_len(text)
    return " " + (text + " " * room if justify == "left" else " " * room + text) + " "
