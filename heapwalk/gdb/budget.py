"""What a command over a big heap will cost, said in gdb before it starts (`analysis.sizing`): one line on a
terminal for a heap of a GiB or more, and a refusal, with what needs less, when this machine has not the memory
('set heapwalk memory-check off' runs it anyway).  The leak scan is weighed again once the blocks are known."""

from __future__ import annotations

import gdb

from heapwalk.analysis import sizing
from heapwalk.common.errors import UsageError
from heapwalk.gdb.console import say_now

__all__ = ["before_decode", "scan_refused", "LESS", "ANYWAY"]

#: what needs less memory than a whole report, as the refusals name it
LESS = ("'heapwalk bins' (the free lists alone), 'heapwalk check', 'heapwalk report --no-leaks' (no leak scan) "
        "or a machine with more memory (docs/performance.md)")
#: how to run it all the same, as the refusals say it
ANYWAY = "'set heapwalk memory-check off' (the command line's --no-memory-check)"


def _checking() -> bool:
    from heapwalk.gdb.session import Settings   # here: the session asks this module before each decode
    return Settings.memory_check is None or bool(Settings.memory_check.value)


def before_decode(target, kind: str) -> None:
    """Before a decode of KIND (`sizing.expected`) of TARGET: says what it is expected to cost on a terminal, or
    refuses it (UsageError) when this machine has not the memory."""
    cost = sizing.expected(kind, target.space.regions, _resident(target))
    if cost.heap < sizing.SAID_FROM:
        return
    available = sizing.available_memory()
    have = "" if available is None else f"; this machine has {sizing.human_bytes(available)} available"
    line = (f"heapwalk: {sizing.human_bytes(cost.heap)} of memory may hold chunks: expect about "
            f"{cost.seconds:.0f} s and {sizing.human_bytes(cost.bytes)} of gdb's memory{have}")
    if _checking() and sizing.too_big(cost.bytes, available):
        raise UsageError(f"{line}, not enough: {LESS} need less; {ANYWAY} runs it anyway")
    say_now(line)


def _resident(target) -> int | None:
    """The bytes of TARGET's memory that were resident, when cheap to know: a live process's anonymous RSS, or
    what a core's page map says of its regions; None otherwise (the regions' bytes are the bound)."""
    regions = target.space.regions
    if not target.space.core:
        try:
            with open(f"/proc/{gdb.selected_inferior().pid}/status", encoding="ascii") as fh:
                return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("RssAnon:"))
        except (OSError, StopIteration, ValueError):
            return None
    if target.residency is None or not regions:
        return None
    return target.residency.resident_sum([lo for lo, _ in regions], [hi for _, hi in regions])


def scan_refused(blocks: int) -> str | None:
    """Why the leak scan over BLOCKS blocks is not made (this machine has not the memory), or None."""
    need, available = sizing.scan_need(blocks), sizing.available_memory()
    if not _checking() or not sizing.too_big(need, available):
        return None
    return (f"the leak scan of {blocks:,} blocks needs about {sizing.human_bytes(need)} and this machine has "
            f"{sizing.human_bytes(available)} available: it was not made ('heapwalk report --no-leaks' says the rest; "
            f"{ANYWAY} makes it anyway)")
