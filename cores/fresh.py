"""Whether a built program or a capture is still what its inputs make, by their content, not by file times.

A clone's files are all newer than anything built before it, so times would call every capture stale in a
fresh clone; build/ is kept in the cache (the Makefile links it there) and a program or a capture is made
again only when what it is made from changed: its sources, the harness, the C library or jemalloc it ran
on, its environment.  Each keeps the digest of its inputs beside it (`STAMP` in a capture's folder,
PROGRAM.sha beside a program).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

__all__ = ["STAMP", "digest", "mark", "marked", "stamp_of", "fresh"]

#: the file in a capture's folder that holds the digest of its inputs
STAMP = "inputs.sha"
#: the system's C library, which a capture without a sysroot ran on
SYSTEM_LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")


def digest(files, *settings) -> str:
    """The digest of FILES' names and contents (a missing file counts as absent) and of SETTINGS."""
    h = hashlib.sha256()
    for path in files:
        path = Path(path)
        h.update(path.name.encode() + b"\0")
        try:
            st = path.stat()
            h.update(_file_digest(str(path), st.st_mtime_ns, st.st_size).encode())
        except OSError:
            h.update(b"(absent)")
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    """The digest of the file at PATH as it is (its time and size say when it must be read again)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def stamp_of(target: Path) -> Path:
    """Where TARGET's digest is kept: in its folder when it is a capture's folder, else beside it."""
    return target / STAMP if target.is_dir() else target.with_name(target.name + ".sha")


def mark(target: Path, inputs: str) -> None:
    """Records that TARGET was made from INPUTS."""
    stamp_of(target).write_text(inputs + "\n")


def marked(target: Path, inputs: str) -> bool:
    """Whether TARGET exists and was made from INPUTS."""
    try:
        return target.exists() and stamp_of(target).read_text().strip() == inputs
    except OSError:
        return False


def fresh(directory: Path, inputs: str, files: tuple[str, ...]) -> bool:
    """Whether the capture in DIRECTORY was made from INPUTS, holds FILES, and its program (meta.json's exe)
    is there and was not built again since (gdb refuses a program whose build differs from the core's)."""
    if not marked(directory, inputs) or not all((directory / f).exists() for f in files):
        return False
    try:
        exe = Path(json.loads((directory / "meta.json").read_text())["exe"])
        return exe.stat().st_mtime <= (directory / "core").stat().st_mtime
    except (OSError, ValueError, KeyError):
        return False
