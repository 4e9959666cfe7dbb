"""heapwalk: heap forensics for gdb (glibc's malloc, jemalloc, gperftools' tcmalloc, mimalloc 2 and 3, CPython's
obmalloc).

One folder per part (docs/architecture.md): `inferior` (memory, ELF images, threads, core files, the target as
the debugger shows it), `arch` (what differs between processors), `capture` (a core of a running process), one
folder per allocator behind the face `allocator` (`registry` names them), `view` (what any allocator's decoder
gives the analysis), `analysis` (the report, the diff, the leak scan), `output` (tables, JSON, maps, pages), and
the two front ends `gdb` and `cli`.  Everything is plain Python and only the gdb front end (`heapwalk.gdb`, with
its adapters: the target as gdb shows it) imports gdb.  Inside gdb, `load()` registers the commands.
"""

__version__ = "0.1.0"


def load() -> "str | None":
    """Registers heapwalk's gdb commands (call from gdb's Python); in a gdb heapwalk does not run in, prints
    and returns the line that says why (heapwalk.gdb.loading)."""
    from heapwalk.gdb.loading import load as load_into_gdb

    return load_into_gdb()
