"""heapwalk: heap forensics for gdb (glibc's malloc and jemalloc).

One folder per part (docs/architecture.md): `target` (memory, ELF images,
threads, core files), `glibc` (the allocator's decoder), `view` (what any
allocator's decoder gives the analysis), `analysis` (the report, the diff),
`output` (tables, JSON), and the two front ends `gdb` and `cli`.
Everything is plain Python and never imports gdb but
`heapwalk.inferior.gdbadapter` and the gdb front end (`heapwalk.gdb`).  Inside
gdb, `load()` registers the commands.
"""

__version__ = "0.1.0"


def load() -> "str | None":
    """Registers heapwalk's gdb commands (call from gdb's Python); in a gdb heapwalk does not run in, prints
    and returns the line that says why (heapwalk.gdb.loading)."""
    from heapwalk.gdb.loading import load as load_into_gdb

    return load_into_gdb()
