"""Python's cyclic garbage collector paused while heapwalk decodes."""

from __future__ import annotations

import contextlib
import gc

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector off for a while: decoding and walking make millions of short-lived
    tuples and no cycles, and the collector's passes over everything alive cost a sixth of a large walk."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
