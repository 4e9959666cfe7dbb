"""Where heapwalk's commands write in gdb: a rich console on gdb's output (plain in logs and -batch), the
header, findings and partial-result notes every command ends with, the chunk walk's progress bar, and
gdb's permissions turned off while a command runs."""

from __future__ import annotations

import contextlib
import os
import time

import gdb  # type: ignore[import-not-found]
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from heapwalk.analysis.report import Report
from heapwalk.glibc.model import HeapState
from heapwalk.glibc.partial import partial
from heapwalk.jemalloc import check as je_check
from heapwalk.jemalloc.model import JeState
from heapwalk.output import jedoc, jsondoc, tables


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


@contextlib.contextmanager
def walk_progress(walk_chunks: bool):
    """A progress bar for the chunk walk (a callable for `collect`), or None: shown only in an interactive
    gdb (a terminal, and not -batch, which makes the width unlimited), and only once the walk has taken a
    second; it disappears when the walk ends."""
    if not walk_chunks or not interactive() or gdb.parameter("width") is None:
        yield None
        return
    bar = _ProgressBar()
    try:
        yield bar
    finally:
        bar.close()


class _ProgressBar:
    """rich's progress bar on gdb's terminal, started on the first report after a second."""

    def __init__(self):
        self.start = time.monotonic()
        self.progress: Progress | None = None
        self.task = None

    def __call__(self, done: int, total: int) -> None:
        if self.progress is None:
            if time.monotonic() - self.start < _PROGRESS_AFTER:
                return
            self.progress = Progress(TextColumn("walking chunks"), BarColumn(), DownloadColumn(binary_units=True),
                                     TimeRemainingColumn(), console=gdb_console(), transient=True)
            self.task = self.progress.add_task("walk", total=total)
            self.progress.start()
        self.progress.update(self.task, completed=done)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def gdb_console():
    return tables.make_console(_GdbFile(), interactive())


def console_with_header(state: HeapState, beside_jemalloc: bool = False):
    """A console that has printed the target, the glibc and how main_arena was found; BESIDE_JEMALLOC (a
    process with both allocators, whose jemalloc part was printed above): a heading instead of the target."""
    console = gdb_console()
    if beside_jemalloc:
        console.print("\nglibc's malloc, in use beside jemalloc:")
    console.print(tables.header_text(state, with_target=not beside_jemalloc), end="")
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


def print_damage(console, state: HeapState, findings) -> None:
    """What is partial in STATE, then FINDINGS: the tail of every command that shows decoded numbers."""
    print_partial(console, partial(state))
    print_findings(console, findings)


def print_jemalloc_arenas(state: JeState) -> dict:
    """'heapwalk arenas' of a jemalloc process: the target, the version, the arenas, findings; returns the
    JSON document."""
    _print_jemalloc(state, jedoc.jemalloc_arenas_table(state, tables.box_for(interactive())))
    return jedoc.jemalloc_document(state)


def print_jemalloc_threads(state: JeState) -> dict:
    """'heapwalk threads' of a jemalloc process: each thread's arena, byte counters and decay ticker; returns
    the JSON document."""
    _print_jemalloc(state, jedoc.jemalloc_threads_table(state, tables.box_for(interactive())))
    return jedoc.jemalloc_document(state)


def print_jemalloc_report(state: JeState) -> tuple[Report, dict]:
    """'heapwalk report' of a jemalloc process: where its pages are arena by arena, the free pieces by size,
    the slabs with the most free room, the threads, the verdict, and the findings; returns the report and
    the JSON document."""
    box = tables.box_for(interactive())
    rep = jedoc.jemalloc_report(state)
    console = _jemalloc_console(state)
    group = tables.report_group(rep, interactive())
    *parts, verdict = group.renderables
    for part in parts:
        console.print(part)
    for extra in (jedoc.jemalloc_slabs_table(state, box), jedoc.jemalloc_threads_table(state, box)):
        if extra is not None:
            console.print(extra)
    console.print(verdict)
    print_findings(console, state.all_findings())
    return rep, jedoc.jemalloc_report_document(state, rep)


def _jemalloc_console(state: JeState):
    """A console that has printed the target and jemalloc's version."""
    console = gdb_console()
    console.print(f"{state.target}\n" if state.target else "", end="")
    console.print(f"jemalloc {state.version}")
    return console


def _print_jemalloc(state: JeState, table) -> None:
    console = _jemalloc_console(state)
    console.print(table)
    print_findings(console, state.all_findings())


def print_jemalloc_check(state: JeState, limit: int) -> tuple[int, int, dict]:
    """'heapwalk check' of a jemalloc process: its findings and counters; returns the number of errors and
    of warnings, and the JSON document."""
    findings = je_check.check_jemalloc(state)
    checked = je_check.scope(state)
    console = _jemalloc_console(state)
    console.print(jedoc.jemalloc_check_text(findings, checked, limit or len(findings)), end="")
    errors = sum(1 for f in findings if f.severity.value == "error")
    warnings = sum(1 for f in findings if f.severity.value == "warning")
    return errors, warnings, jedoc.jemalloc_check_document(state, findings, checked)


def write_json(path: str | None, jemalloc_doc: dict | None, glibc_doc: dict | None) -> None:
    """Writes a command's JSON document to PATH (when given): one allocator's, or both (`jedoc.beside`)."""
    if path:
        jsondoc.dump(jedoc.beside(jemalloc_doc, glibc_doc), path)
