"""Which gdb heapwalk runs in: its version from `gdb.VERSION`, and the one line that refuses a gdb older than
the oldest it is tested on (docs/platforms.md), instead of tracebacks or numbers from an API that differs."""

from __future__ import annotations

import re

__all__ = ["OLDEST_GDB", "parse_gdb_version", "unsupported_gdb"]

#: the oldest gdb heapwalk is tested on (10.1, Debian 11's; docs/platforms.md)
OLDEST_GDB = (10, 0)


def parse_gdb_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of a `gdb.VERSION` string such as '13.1', '10.1.90.20210103-git' or 'Fedora Linux
    12.1-5.fc37'; None when it holds no version."""
    found = re.search(r"(?<![\d.])(\d+)\.(\d+)", text or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def unsupported_gdb(text: str) -> str | None:
    """The one line that refuses the gdb whose `gdb.VERSION` is TEXT, or None when heapwalk runs in it."""
    version = parse_gdb_version(text)
    if version is None:
        return f"heapwalk: cannot tell this gdb's version ({text!r}); heapwalk needs gdb {OLDEST_GDB[0]} or later"
    if version < OLDEST_GDB:
        return (f"heapwalk: gdb {version[0]}.{version[1]} is older than gdb {OLDEST_GDB[0]}, the oldest heapwalk "
                f"is tested on; run it in gdb {OLDEST_GDB[0]} or later (a core or a capture can be opened on another "
                "machine: docs/platforms.md)")
    return None
