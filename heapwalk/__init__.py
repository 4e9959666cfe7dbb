"""heapwalk: glibc heap forensics for gdb.

The engine (memory, layout, walkers, discovery, collect, model, jsonout,
render) is plain Python and never imports gdb; `heapwalk.gdbtarget` and
`heapwalk.commands` are the thin layer that does.  Inside gdb, `load()`
registers the commands.
"""

__version__ = "0.1.0"


def load() -> None:
    """Registers heapwalk's gdb commands (call from gdb's Python)."""
    from . import commands

    commands.register()
