"""The rich consoles heapwalk writes through: colour and rounded boxes on a terminal, plain ASCII and no
wrapping elsewhere."""

from __future__ import annotations

from rich import box
from rich.console import Console

__all__ = ["make_console", "box_for"]

#: the width a console that is not a terminal lays tables out in: wide enough that nothing wraps
_UNWRAPPED = 100_000


def make_console(file, interactive: bool, width: int | None = None) -> Console:
    """A console writing to FILE: colour and boxes when INTERACTIVE, plain ASCII otherwise, its lines never
    wrapped (a log or a file is read with copy and paste, and grep, not at a terminal's width)."""
    if interactive:
        return Console(file=file, force_terminal=True, width=width)
    return Console(file=file, force_terminal=False, no_color=True, width=width or _UNWRAPPED, highlight=False,
                   emoji=False, soft_wrap=True)


def box_for(interactive: bool):
    """The table box style for a terminal (rounded) or a log (plain ASCII)."""
    return box.ROUNDED if interactive else box.ASCII2
