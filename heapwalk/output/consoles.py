"""The rich consoles heapwalk writes through: colour and rounded boxes on a terminal, plain ASCII and no
wrapping elsewhere."""

from __future__ import annotations

from rich import box
from rich.console import Console, Group
from rich.segment import Segment
from rich.table import Table

from heapwalk.output.plaintable import plain_table

__all__ = ["make_console", "box_for"]

#: the width a console that is not a terminal lays tables out in: wide enough that nothing wraps
_UNWRAPPED = 100_000


def make_console(file, interactive: bool, width: int | None = None) -> Console:
    """A console writing to FILE: colour and boxes when INTERACTIVE, plain ASCII otherwise, its lines never
    wrapped (a log or a file is read with copy and paste, and grep, not at a terminal's width)."""
    if interactive:
        return Console(file=file, force_terminal=True, width=width)
    return _LogConsole(file=file, force_terminal=False, no_color=True, width=width or _UNWRAPPED, highlight=False,
                       emoji=False, soft_wrap=True)


class _LogConsole(Console):
    """A console for logs, pipes and files, whose tables are laid out by `plaintable` where it can (the same
    text, made without rich's renderer), and by rich otherwise."""

    def print(self, *objects, **options) -> None:
        """`Console.print`; a table, or a group holding tables, printed a part at a time, each table laid out
        here where it can be."""
        parts = objects[0].renderables if len(objects) == 1 and isinstance(objects[0], Group) else objects
        if options or len(objects) != 1 or not any(isinstance(part, Table) for part in parts):
            super().print(*objects, **options)
            return
        for part in parts:
            text = plain_table(part, self) if isinstance(part, Table) else None
            if text is None:
                super().print(part)
                continue
            with self:
                self._buffer.append(Segment(text))


def box_for(interactive: bool):
    """The table box style for a terminal (rounded) or a log (plain ASCII)."""
    return box.ROUNDED if interactive else box.ASCII2
