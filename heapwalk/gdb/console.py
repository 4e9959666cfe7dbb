"""Where heapwalk's commands write in gdb: a rich console on gdb's output (plain in logs and -batch), the
header, findings and partial-result notes every command ends with, the progress bars of long work (the chunk
walk, the leak scan), and gdb's permissions turned off while a command runs."""

from __future__ import annotations

import contextlib
import os
import time

import gdb  # type: ignore[import-not-found]
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from heapwalk.common.relay import PROGRESS, RELAY, SAY
from heapwalk.output import jsondoc, tables


class _GdbFile:
    """A file object that writes through gdb, so output lands in logs and pagers correctly."""

    def write(self, s: str) -> int:
        gdb.write(s)
        return len(s)

    def flush(self) -> None:
        gdb.flush()

    def isatty(self) -> bool:
        return interactive()


def interactive() -> bool:
    """Is gdb's output a terminal? (Logs and pipes get plain text.)"""
    try:
        return os.isatty(1)
    except OSError:
        return False


_PROGRESS_AFTER = 1.0  # seconds a walk runs before its progress bar appears
_RELAY_EVERY = 0.25    # seconds between two progress lines relayed to the command line


def _relayed() -> bool:
    return os.environ.get(RELAY) == "1" and not interactive()


def say_now(line: str) -> None:
    """LINE said at once to a user at a terminal (gdb's, or the command line's): nothing in logs and pipes."""
    if interactive():
        gdb_console().print(line, highlight=False)
    elif _relayed():
        gdb.write(f"{SAY}|{line}\n", gdb.STDERR)


@contextlib.contextmanager
def progress_bar(label: str, wanted: bool = True):
    """A progress bar for long work (a callable taking bytes done and bytes in all), or None: shown only to a
    user at a terminal, in an interactive gdb (not -batch, which makes the width unlimited) or through the command
    line, and only once the work has taken a second; it disappears when the work ends."""
    if wanted and interactive() and gdb.parameter("width") is not None:
        bar = _ProgressBar(label)
    elif wanted and _relayed():
        bar = _RelayedProgress(label)
    else:
        yield None
        return
    try:
        yield bar
    finally:
        bar.close()


def walk_progress(walk_chunks: bool):
    """The chunk walk's `progress_bar`."""
    return progress_bar("walking chunks", walk_chunks)


class _ProgressBar:
    """rich's progress bar on gdb's terminal, started on the first report after a second."""

    def __init__(self, label: str):
        self.label = label
        self.start = time.monotonic()
        self.progress: Progress | None = None
        self.task = None

    def __call__(self, done: int, total: int) -> None:
        if self.progress is None:
            if time.monotonic() - self.start < _PROGRESS_AFTER:
                return
            self.progress = Progress(TextColumn(self.label), BarColumn(), DownloadColumn(binary_units=True),
                                     TimeRemainingColumn(), console=gdb_console(), transient=True)
            self.task = self.progress.add_task("walk", total=total)
            self.progress.start()
        self.progress.update(self.task, completed=done)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


class _RelayedProgress:
    """The progress as lines for the command line ("heapwalk-progress|label|done|total"), a few a second."""

    def __init__(self, label: str):
        self.label = label
        self.start = self.last = time.monotonic()
        self.said = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.start >= _PROGRESS_AFTER and now - self.last >= _RELAY_EVERY:
            self.last, self.said = now, True
            gdb.write(f"{PROGRESS}|{self.label}|{done}|{total}\n", gdb.STDERR)

    def close(self) -> None:
        if self.said:
            gdb.write(f"{PROGRESS}|{self.label}|end|0\n", gdb.STDERR)


def gdb_console():
    return tables.make_console(_GdbFile(), interactive())


def console_with_header(decoded, beside=None):
    """A console that has printed DECODED's header (the target, the allocator, how it was found); BESIDE (the
    allocator printed above it, in a process with several): a heading instead of the target."""
    console = gdb_console()
    if beside is not None:
        console.print(f"\n{decoded.title}, in use beside {beside.title}:")
    console.print(decoded.header(with_target=beside is None), end="")
    return console


def print_findings(console, findings) -> None:
    text = tables.findings_text(findings)
    if text is not None:
        console.print(text)


#: gdb's permission settings that keep a command from changing the target (see "Observer Mode" in gdb's manual)
_PERMISSIONS = ("may-write-memory", "may-write-registers", "may-call-functions", "may-insert-breakpoints")


class read_only:
    """Turns off gdb's permissions to write memory and registers, call functions and insert breakpoints in
    the target for the duration of a command, and restores them after: heapwalk only reads, and a bug or
    a user expression (``heapwalk chunk 'free(p)'``) cannot change the process."""

    def __enter__(self):
        self.saved = {}
        for name in _PERMISSIONS:
            try:
                self.saved[name] = gdb.parameter(name)
                gdb.execute(f"set {name} off", to_string=True)
            except gdb.error:  # some cannot change while a live process runs; gdb keeps them as they are
                self.saved.pop(name, None)
        return self

    def __exit__(self, *exc):
        for name, value in self.saved.items():
            try:
                gdb.execute(f"set {name} {'on' if value else 'off'}", to_string=True)
            except gdb.error:
                pass
        return False


def print_partial(console, notes) -> None:
    text = tables.partial_text(notes)
    if text is not None:
        console.print(text, end="")


def print_damage(console, decoded, findings) -> None:
    """What is partial in DECODED, then FINDINGS: the tail of every command that shows decoded numbers."""
    print_partial(console, decoded.partial())
    print_findings(console, findings)


def write_json(path: str | None, documents) -> None:
    """Writes a command's JSON document to PATH (when given): from the (decoded, document) of each allocator,
    one document (`jsondoc.together`)."""
    documents = [(d.name, d.beside_key, doc) for d, doc in documents if doc is not None]
    if path and documents:
        jsondoc.dump(jsondoc.together(documents), path)
