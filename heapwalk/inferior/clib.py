"""heapwalk's small C libraries (`pip install` builds them from `glibc/bulk/_native.c`, `jemalloc/_native.c`,
`inferior/_slots.c` and `analysis/_reach.c`), found beside their Python modules and loaded with ctypes: no Python
headers, and nothing fails when they were not built.  HEAPWALK_PURE=1 in the environment turns them off, so the Python forms can be checked."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

__all__ = ["built_library", "declared_library"]


def built_library(folder: Path, stem: str, functions: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The library STEM (`_native`, `_reach`) built in FOLDER, or None: not built, cannot load, turned off, or
    built from older sources that lack one of FUNCTIONS."""
    if os.environ.get("HEAPWALK_PURE"):
        return None
    for path in sorted(folder.glob(f"{stem}*.so")):
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            continue
        return lib if all(hasattr(lib, name) for name in functions) else None
    return None


def declared_library(folder: Path, stem: str, signatures: dict) -> ctypes.CDLL | None:
    """`built_library` with each function of SIGNATURES (name -> (restype, argtypes)) declared, or None."""
    lib = built_library(folder, stem, tuple(signatures))
    for name, (restype, argtypes) in signatures.items() if lib is not None else ():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib
