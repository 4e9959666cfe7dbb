"""Tables laid out without rich's renderer (`output.plaintable`, used by the consoles of logs and pipes): the
same text as rich's, for every table heapwalk makes, and rich's own layout for any table it does not lay out."""

from __future__ import annotations

import io
import random

import pytest
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from heapwalk.output.consoles import box_for, make_console
from heapwalk.output.plaintable import plain_table

#: cells as heapwalk's tables hold them, and what rich reads as markup, wide characters, and long words
WORDS = ["a", "bin", "0x20", "34.9 MiB", "", "-", "no free chunks", "[heap]", "[bold]x[/bold]", "ünï", "日本",
         "x" * 30, "a:b", "[0x20, 0x30)", "1,234"]


def _rich(renderable) -> str:
    """What rich itself prints of RENDERABLE on a console like the logs' (its layout, not `plaintable`'s)."""
    out = io.StringIO()
    Console(file=out, force_terminal=False, no_color=True, width=100_000, highlight=False, emoji=False,
            soft_wrap=True).print(renderable)
    return out.getvalue()


def _ours(renderable) -> str:
    out = io.StringIO()
    make_console(out, False).print(renderable)
    return out.getvalue()


def _table(rng: random.Random, plain: bool) -> Table:
    """A random table as heapwalk makes them, in its logs' box or another (PLAIN: only what `plaintable` lays
    out)."""
    titles = [None, "arena 0", "[b]t[/b]"]
    if not plain:
        titles.append("arena 0 (main) at 0x7f341e80dc60: free lists, a title wider than its table")
    table = Table(title=rng.choice(titles), box=rng.choice((box_for(False), box.ASCII, box.SIMPLE, box.DOUBLE_EDGE)),
                  title_justify="left", show_footer=rng.random() < 0.3)
    columns = rng.randint(1, 6)
    for _ in range(columns):
        table.add_column(rng.choice(WORDS) or "h", justify=rng.choice(("left", "right")),
                         no_wrap=plain or rng.random() < 0.7, footer=rng.choice(WORDS))
    for _ in range(rng.randint(1, 8)):
        cells = [rng.choice(WORDS) if plain or rng.random() < 0.8 else Text(rng.choice(WORDS), style="red")
                 for _ in range(columns)]
        if not plain and rng.random() < 0.1:
            cells[0] = "two\nlines"
        table.add_row(*cells, end_section=rng.random() < 0.2)
    return table


@pytest.mark.parametrize("seed", range(20))
def test_a_table_is_laid_out_as_rich_lays_it_out(seed):
    """Headers, footers, sections, titles, markup, wide characters, either justification: the same lines."""
    rng = random.Random(seed)
    console = make_console(io.StringIO(), False)
    for _ in range(20):
        table = _table(rng, plain=True)
        text = plain_table(table, console)
        assert text is not None and text == _rich(table)


@pytest.mark.parametrize("seed", range(10))
def test_what_it_does_not_lay_out_rich_does(seed):
    """A title wider than its table (printed whole, as rich prints it on a console that does not wrap), a styled
    cell, a cell over two lines (None: rich lays that table out): the same text."""
    rng = random.Random(100 + seed)
    console = make_console(io.StringIO(), False)
    declined = 0
    for _ in range(30):
        table = _table(rng, plain=False)
        text = plain_table(table, console)
        declined += text is None
        assert text is None or text == _rich(table)
        assert _ours(table) == _rich(table)
    assert declined


@pytest.mark.parametrize("seed", range(10))
def test_a_console_prints_groups_of_tables_and_text_as_rich_does(seed):
    """A log's console prints a group a part at a time, each table laid out where it can be: the same text as
    rich's printing of the whole group (tables with no rows and plain strings among them)."""
    rng = random.Random(200 + seed)
    for _ in range(10):
        parts = []
        for _ in range(rng.randint(1, 4)):
            table = _table(rng, plain=rng.random() < 0.7)
            if rng.random() < 0.1:
                table = Table(title="empty", box=box_for(False))
                table.add_column("a")
            parts.append(table)
            if rng.random() < 0.5:
                parts.append(Text(rng.choice(WORDS)))
            if rng.random() < 0.3:
                parts.append(rng.choice(WORDS))
        renderable = Group(*parts) if rng.random() < 0.7 else parts[0]
        assert _ours(renderable) == _rich(renderable)
