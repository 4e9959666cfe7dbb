"""heapwalk's small C libraries (`pip install` builds them from `glibc/_native.c` and `analysis/_reach.c`),
found beside their Python modules and loaded with ctypes: no Python headers, and nothing fails when they
were not built.  HEAPWALK_PURE=1 in the environment turns them off, so the Python forms can be checked."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

__all__ = ["built_library"]


def built_library(folder: Path, stem: str) -> ctypes.CDLL | None:
    """The library STEM (`_native`, `_reach`) built in FOLDER, or None: not built, cannot load, or turned off."""
    if os.environ.get("HEAPWALK_PURE"):
        return None
    for path in sorted(folder.glob(f"{stem}*.so")):
        try:
            return ctypes.CDLL(str(path))
        except OSError:
            continue
    return None
