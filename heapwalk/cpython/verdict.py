"""obmalloc's sentences on its report: what its arenas hold, and when the free memory they keep is worth a
remedy (weighed against the process's RSS), what keeps it and what would give it back, with the cost."""

from __future__ import annotations

from heapwalk.analysis.report import Report, human, not_worth, worth
from heapwalk.cpython.model import ObState

__all__ = ["advice"]

_REMEDIES = ("PYTHONMALLOC=malloc or a worker restarted after some requests")


def advice(state: ObState, rep: Report) -> list[str]:
    """The verdict's sentences on STATE's report REP, each with its figures."""
    f = state.figures()
    unused = f["unused_pools"] * state.pool_size
    resident = [a.resident for a in state.arenas]
    in_ram = f" ({human(sum(resident))} of it in RAM)" if all(r is not None for r in resident) else ""
    out = [f"CPython's obmalloc maps {human(state.mapped)} in {len(state.arenas)} arenas{in_ram}: "
           f"{human(f['bytes_in_allocated_blocks'])} in blocks Python uses, {human(f['bytes_in_available_blocks'])} "
           f"in free blocks of pools in use and {human(unused)} in {f['unused_pools']} unused pools."]
    free = [a.free_resident for a in state.arenas]
    kept = sum(free) if all(x is not None for x in free) else f["bytes_in_available_blocks"] + unused
    if not kept:
        return out
    holding = sum(1 for a in state.arenas if a.used)
    if not worth(rep, kept):
        return out + [not_worth(rep, kept, _REMEDIES)]
    where = "in RAM" if all(x is not None for x in free) else "mapped"
    return out + [
        f"Free memory obmalloc keeps, not a leak: {human(kept)} {where} that Python freed lies in {holding} arenas "
        "that each still hold a block in use, and obmalloc gives an arena back to the system only when every "
        "pool in it is empty; it comes back only as the objects still in those arenas die.",
        "PYTHONMALLOC=malloc (from the next start) serves Python's small objects from malloc, whose trim then "
        "applies to them, at some cost in speed; a worker restarted after some requests (gunicorn's "
        "max_requests, uWSGI's max-requests) starts again from empty arenas."]
