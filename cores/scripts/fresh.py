"""Whether a built program or a capture is still what its inputs make, by their content, not by file times.

A clone's files are all newer than anything built before it, so times would call every capture stale in a
fresh clone; build/ is kept in the cache (the Makefile links it there) and a program or a capture is made
again only when what it is made from changed: its sources, the harness, the C library or jemalloc it ran
on, its environment.  Each keeps the digest of its inputs beside it (`STAMP` in a capture's folder,
PROGRAM.sha beside a program).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import threading
from pathlib import Path

__all__ = ["STAMP", "digest", "mark", "marked", "stamp_of", "fresh", "exclusive"]

#: the file in a capture's folder that holds the digest of its inputs
STAMP = "inputs.sha"
#: the system's C library, which a capture without a sysroot ran on
SYSTEM_LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")
#: held while a program or a capture is checked and made, by every process that makes them (make test runs
#: its shards side by side): each is made once, and never read while another process writes it
LOCK = Path(__file__).resolve().parents[2] / "build" / ".making.lock"

_held = threading.local()
_in_process = threading.RLock()


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


@contextlib.contextmanager
def _making():
    """Holds LOCK (again, inside a function that already holds it)."""
    with _in_process:
        depth = getattr(_held, "depth", 0)
        if depth:
            _held.depth = depth + 1
            try:
                yield
            finally:
                _held.depth = depth
            return
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(LOCK, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            _held.depth = 1
            try:
                yield
            finally:
                _held.depth = 0
                fcntl.flock(f, fcntl.LOCK_UN)


def exclusive(function):
    """FUNCTION, which checks whether something is fresh and makes it when not, run while holding LOCK."""
    @functools.wraps(function)
    def held(*args, **kwargs):
        with _making():
            return function(*args, **kwargs)
    return held
