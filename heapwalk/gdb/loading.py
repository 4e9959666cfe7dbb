"""Loading heapwalk into gdb: the commands, or, in a gdb heapwalk does not run in, a `heapwalk` command whose
every use fails with the one line that says why."""

from __future__ import annotations

import gdb  # type: ignore[import-not-found]

from heapwalk.gdb.gdbversion import unsupported_gdb

__all__ = ["load"]


class _Refused(gdb.Command):
    """heapwalk cannot run in this gdb: 'heapwalk' says why."""

    def __init__(self, line: str):
        super().__init__("heapwalk", gdb.COMMAND_DATA, prefix=True)
        self._line = line

    def invoke(self, argument: str, from_tty: bool) -> None:
        raise gdb.GdbError(self._line)


def load() -> "str | None":
    """Registers heapwalk's commands; in a gdb older than heapwalk runs in, prints and returns the refusal
    line, and every `heapwalk` command fails with it (so a gdb -batch script's status says so)."""
    refusal = unsupported_gdb(getattr(gdb, "VERSION", ""))
    if refusal is not None:
        print(refusal)
        _Refused(refusal)
        return refusal
    from heapwalk.gdb import commands

    commands.register()
    return None
