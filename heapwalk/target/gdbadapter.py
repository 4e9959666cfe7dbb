"""The target as gdb shows it: memory, libc's debug symbols, threads.

This module and the gdb front end (`heapwalk.gdb`) are the only ones that import ``gdb``.
Everything here is read-only: memory is read, never written; no function in
the target is called; the selected thread and frame are restored after each
look at another thread.
"""

from __future__ import annotations

import contextlib
import os
import re
import weakref

import gdb  # type: ignore[import-not-found]

from heapwalk.target.threads import FATAL_SIGNALS, ThreadRegs
from heapwalk.target.elf import Mapping
from heapwalk.target.corefile import MISSING_ENV, CoreError, CoreFile, parse_ranges
from heapwalk.target.memory import CachedMemory, ranges_without
from heapwalk.target.mitext import console_text
from heapwalk.target.pages import LivePages
from heapwalk.target.residency import RESIDENT_ENV, Pagemap, Residency, load_runs, of_core
from heapwalk.target.space import MemoryMap

__all__ = ["gdb_memory", "GdbSymbols", "thread_registers", "describe_target", "preserved_selection", "has_target",
           "symbol_at", "stack_frame",
           "mappings", "MemoryMap", "memory_map"]

_MAPPING_LINE = re.compile(r"^\s*(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+0x[0-9a-f]+\s+(0x[0-9a-f]+)"
                           r"(?:\s+[r-][w-][x-][ps])?(?:\s+(.*?))?\s*$")

_LIBC_NAME = re.compile(r"(^|/)libc([.-][\w.]*)?\.so|(^|/)libc\.so\.6")


def has_target() -> bool:
    """Is there a process or core to look at?"""
    inferior = gdb.selected_inferior()
    return inferior is not None and inferior.pid != 0 and bool(inferior.threads())


def gdb_memory(known: list[tuple[int, int]] | None = None) -> CachedMemory:
    """A block-cached Memory over the selected inferior; reads outside KNOWN regions (when given) fail
    at once, without asking gdb, so damaged pointers cost nothing.  A process on this machine is read only
    where its page map says a read faults nothing in (`heapwalk.target.pages`); PagesUnknown when that
    cannot be known."""
    inferior = gdb.selected_inferior()

    def read(address: int, size: int) -> bytes:
        return inferior.read_memory(address, size).tobytes()

    if _connection_type() != "native":
        return CachedMemory(read, max_blocks=_CACHE_BLOCKS, regions=known, raw_buffer=inferior.read_memory)
    pages = LivePages(inferior.pid)

    def guarded(address: int, size: int) -> bytes:
        return pages.read(address, size, read)

    def guarded_buffer(address: int, size: int):
        plan = pages.plan(address, size)
        if len(plan) == 1 and plan[0][2].from_process:
            return inferior.read_memory(address, size)
        return pages.read(address, size, read, plan)

    memory = CachedMemory(guarded, max_blocks=_CACHE_BLOCKS, regions=known, raw_buffer=guarded_buffer)
    weakref.finalize(memory, pages.close)
    return memory


#: blocks of 64 KiB the cache keeps (128 MiB): enough that the free lists of an arena of two 64 MiB heaps
#: are read from the core about once, whatever order they link their chunks in
_CACHE_BLOCKS = 2048


@contextlib.contextmanager
def preserved_selection():
    """Restores the selected thread and frame on exit, whatever happens inside."""
    thread = gdb.selected_thread()
    try:
        frame = gdb.selected_frame()
    except gdb.error:
        frame = None
    try:
        yield
    finally:
        if thread is not None and thread.is_valid():
            thread.switch()
            if frame is not None and frame.is_valid():
                frame.select()


def _is_libc_objfile(objfile) -> bool:
    owner = getattr(objfile, "owner", None) or objfile
    return bool(owner.filename and _LIBC_NAME.search(owner.filename))


class GdbSymbols:
    """libc's data and TLS symbols from debug information (libc6-dbg), if gdb has it."""

    def _symbols(self, name: str):
        try:
            candidates = list(gdb.lookup_static_symbols(name))
        except (gdb.error, AttributeError):
            candidates = []
        sym = gdb.lookup_global_symbol(name)
        if sym is not None:
            candidates.append(sym)
        return [s for s in candidates if s.symtab is not None and _is_libc_objfile(s.symtab.objfile)]

    def data_address(self, name: str) -> int | None:
        for sym in self._symbols(name):
            try:
                value = sym.value()
                if value.address is not None:
                    return int(value.address)
            except gdb.error:
                continue
        return None

    def tls_offset(self, name: str) -> int | None:
        """&NAME minus $fs_base, computed in the selected thread (x86_64 TLS variant II)."""
        for sym in self._symbols(name):
            try:
                frame = gdb.selected_frame()
                address = sym.value(frame).address
                fs_base = int(frame.read_register("fs_base"))
            except gdb.error:
                continue
            if address is not None and fs_base:
                return int(address) - fs_base
        return None


    def libc_file(self) -> tuple[str, str | None] | None:
        """(path, build-id) of the libc gdb loaded for the selected inferior; None when it loaded none."""
        for objfile in gdb.objfiles():
            if getattr(objfile, "owner", None) is None and _is_libc_objfile(objfile):
                return objfile.filename, getattr(objfile, "build_id", None)
        return None


#: the general registers that may hold a pointer, callee-saved first (they survive the calls into abort)
_POINTER_REGISTERS = ("rbx", "rbp", "r12", "r13", "r14", "r15", "rdi", "rsi", "rdx", "rcx", "rax", "r8", "r9",
                      "r10", "r11")


#: arguments of malloc's functions that hold the chunk being worked on: user pointers, then chunk pointers
_USER_ARGUMENTS = ("mem", "oldmem", "ptr")
_CHUNK_ARGUMENTS = ("p", "oldp", "victim")
_MALLOC_FRAMES = ("free", "malloc", "realloc", "munmap_chunk", "malloc_consolidate", "unlink_chunk", "memalign")


def _malloc_arguments(depth: int = 16) -> tuple[tuple[str, int], ...]:
    """(where, user pointer) for the pointer arguments of malloc's functions among the selected thread's
    newest DEPTH frames (libc's debug symbols are needed; an argument optimised out is taken at its entry
    value where gdb knows it).  Chunk pointers are given as their user pointers (+ 16)."""
    out: list[tuple[str, int]] = []
    frame = gdb.newest_frame()
    for level in range(depth):
        if frame is None:
            break
        name = frame.name() or ""
        if any(part in name for part in _MALLOC_FRAMES):
            for arg in (*_USER_ARGUMENTS, *_CHUNK_ARGUMENTS):
                value = _argument(frame, arg)
                if value:
                    out.append((f"argument {arg} of {name} (frame {level})",
                                value + (16 if arg in _CHUNK_ARGUMENTS else 0)))
        try:
            frame = frame.older()
        except gdb.error:
            break
    return tuple(out)


def _argument(frame, name: str) -> int | None:
    """FRAME's argument NAME as an integer, or its entry value when it is optimised out; None if neither."""
    for expression in (name, f"{name}@entry"):
        try:
            frame.select()
            value = gdb.parse_and_eval(expression)
            if value.is_optimized_out:
                continue
            return int(value.cast(gdb.lookup_type("unsigned long")))
        except (gdb.error, ValueError, RuntimeError):
            continue
    return None


def thread_registers() -> list[ThreadRegs]:
    """Every thread of the selected inferior with its $fs_base (None where unreadable)."""
    out = []
    with preserved_selection():
        for thread in gdb.selected_inferior().threads():
            fs_base = sp = signal = None
            registers: list[tuple[str, int]] = []
            try:
                thread.switch()
                frame = gdb.newest_frame()
                fs_base = int(frame.read_register("fs_base"))
                sp = int(frame.read_register("rsp"))
                for name in _POINTER_REGISTERS:
                    registers.append((name, int(frame.read_register(name)) & (2**64 - 1)))
            except (gdb.error, ValueError):
                pass
            try:
                signal = int(gdb.parse_and_eval("$_siginfo.si_signo"))
            except (gdb.error, ValueError):
                pass
            arguments = _malloc_arguments() if signal in FATAL_SIGNALS else ()
            out.append(ThreadRegs(thread.num, thread.ptid[1] or thread.ptid[0], fs_base, sp, signal,
                                  tuple(registers), arguments))
    return sorted(out, key=lambda t: t.number)


def _text(command: str) -> str:
    """What gdb's COMMAND prints, as the console shows it (under MI too: `mitext.console_text`)."""
    return console_text(gdb.execute(command, to_string=True))


def _connection_type() -> str | None:
    """'core', 'native' (a process on this machine), 'remote'... for the selected inferior: from its
    connection (gdb 12 and later), else from what 'info target' says (gdb 10 and 11); None when there is no
    target."""
    connection = getattr(gdb.selected_inferior(), "connection", _NO_ATTRIBUTE)
    if connection is not _NO_ATTRIBUTE:
        return getattr(connection, "type", None)
    if not has_target():
        return None
    try:
        info = _text("info target")
    except gdb.error:
        return None
    if "core dump file" in info:
        return "core"
    if re.search(r"[Rr]emote (serial target|target) ", info) or "extended-remote" in info:
        return "remote"
    return "native"


_NO_ATTRIBUTE = object()


@contextlib.contextmanager
def _open_core():
    """The core file gdb has open, as a `CoreFile` (None when there is none or it cannot be read)."""
    path = core_path() if _connection_type() == "core" else None
    try:
        core = CoreFile(path) if path is not None else None
    except CoreError:
        core = None
    try:
        yield core
    finally:
        if core is not None:
            core.close()


def cpu_counts() -> tuple[int, int] | None:
    """The CPUs online and the CPUs the process may run on (glibc's arena limit is 8 per CPU), when known: a
    live process's from this machine, a core's from the note `heapwalk capture` writes; None otherwise."""
    if _connection_type() == "core":
        with _open_core() as core:
            facts = core.capture_facts() if core is not None else {}
        online, allowed = facts.get("cpus_online"), facts.get("cpus_allowed")
        return (online, allowed or online) if isinstance(online, int) and online > 0 else None
    try:
        return os.cpu_count() or 1, len(os.sched_getaffinity(gdb.selected_inferior().pid))
    except (OSError, ValueError):
        return None


def residency() -> Residency | None:
    """Which pages were resident, where that is known: a process on this machine's from its page map, a
    core's from what `heapwalk capture` recorded (in the core, or beside gcore's core); None otherwise."""
    kind = _connection_type()
    if kind == "core":
        with _open_core() as core:
            found = of_core(core) if core is not None else None
        recorded = os.environ.get(RESIDENT_ENV)
        return found if found is not None or not recorded else load_runs(recorded)
    if kind != "native":
        return None
    pid = gdb.selected_inferior().pid
    try:
        with open(f"/proc/{pid}/pagemap", "rb", buffering=0) as f:
            os.pread(f.fileno(), 8, 0)
    except OSError:
        return None
    return Pagemap(pid)


def core_path() -> str | None:
    """The core file gdb has open, or None."""
    try:
        info = _text("info target")
    except gdb.error:
        return None
    m = re.search(r"Local core dump file:\s*\n?\s*`([^']+)'", info)
    return m.group(1) if m else None


def describe_target() -> str:
    """'core file /x/core of /x/exe' or 'process 1234 (/x/exe)'."""
    inferior = gdb.selected_inferior()
    exe = gdb.current_progspace().filename or "?"
    if _connection_type() == "core":
        return f"core file {core_path() or '?'} of {exe}"
    return f"process {inferior.pid} ({exe})"


_SECTION = re.compile(r"^\s*(0x[0-9a-f]+) - (0x[0-9a-f]+) is (\S+)", re.M)


def memory_map() -> MemoryMap:
    """The selected inferior's MemoryMap, less the ranges whose bytes a core does not hold (`core_holes`):
    what a truncated core lacks, what a capture did not read, and the zero-filled pages of files gdb has not."""
    space = _memory_map()
    missing = core_holes() if space.core else []
    if not missing:
        return space
    return MemoryMap(space.mappings, ranges_without(space.regions, missing),
                     None if space.readable is None else ranges_without(space.readable, missing), True,
                     None if space.writable is None else ranges_without(space.writable, missing))


def missing_ranges() -> list[tuple[int, int]]:
    """The address ranges the core lacks, as the command line found them when it padded a truncated core
    for gdb (whose padding would otherwise read as zeros)."""
    return parse_ranges(os.environ.get(MISSING_ENV, ""))


def core_holes() -> list[tuple[int, int]]:
    """Every range of the core gdb has open whose bytes it does not hold, though gdb may read zeros there:
    `missing_ranges`, and `CoreFile.holes` with the files gdb can read."""
    with _open_core() as core:
        holes = core.holes(_gdb_has_file) if core is not None else []
    return sorted(missing_ranges() + holes)


def core_not_read() -> tuple[tuple[int, int, str], ...]:
    """The (start, end, why) runs a capture's core says it did not read (none for any other target)."""
    if _connection_type() != "core":
        return ()
    with _open_core() as core:
        runs = core.capture_facts().get("not_read", ()) if core is not None else ()
    return tuple((a, b, str(why)) for a, b, why in (r for r in runs if isinstance(r, list) and len(r) == 3)
                 if isinstance(a, int) and isinstance(b, int))


def _gdb_has_file(path: str) -> bool:
    """Can gdb read the file the core names PATH (under its sysroot, or as one of the files it loaded)?"""
    name = os.path.basename(path)
    if any(os.path.basename(o.filename or "") == name for o in gdb.objfiles()):
        return True
    try:
        sysroot = gdb.parameter("sysroot") or ""
    except (gdb.error, RuntimeError):
        sysroot = ""
    if sysroot.startswith("target:"):
        sysroot = sysroot[len("target:"):]
    return os.path.isfile(os.path.join(sysroot, path.lstrip("/")) if sysroot else path)


def _memory_map() -> MemoryMap:
    maps = mappings()
    spans = [(m.start, m.end) for m in maps]
    if _connection_type() != "core":
        readable = spans
        if _connection_type() == "native":
            with LivePages(gdb.selected_inferior().pid) as pages:
                readable = ranges_without(spans, pages.absent())
        return MemoryMap(maps, spans, readable or None, writable=_live_writable())
    with _open_core() as core:
        writable = list(core.writable) if core is not None else None
        loads = core.regions() if core is not None else None
    try:
        sections = [(int(a, 16), int(b, 16), name) for a, b, name in
                    _SECTION.findall(_text("info files"))]
    except gdb.error:
        return MemoryMap(maps, loads or [], spans or None, True, writable)
    if loads is None:
        loads = [(a, b) for a, b, name in sections if re.fullmatch(r"load\d+", name)]
    return MemoryMap(maps, loads, [(a, b) for a, b, _ in sections] + spans or None, True, writable)


def _live_writable() -> list[tuple[int, int]] | None:
    """The writable mappings of a process on this machine (/proc/PID/maps); None for any other target."""
    if _connection_type() != "native":
        return None
    try:
        with open(f"/proc/{gdb.selected_inferior().pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = []
    for line in lines:
        fields = line.split(None, 2)
        if len(fields) >= 2 and fields[1][1:2] == "w":
            start, _, end = fields[0].partition("-")
            out.append((int(start, 16), int(end, 16)))
    return out


def mappings() -> list[Mapping]:
    """The target's mappings as 'info proc mappings' shows them (core file note, or /proc/PID/maps)."""
    try:
        text = _text("info proc mappings")
    except gdb.error:
        return []
    out = []
    for line in text.splitlines():
        m = _MAPPING_LINE.match(line)
        if m:
            out.append(Mapping(int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16), m.group(4) or ""))
    return out


def symbol_at(address: int) -> str | None:
    """The symbol gdb knows at ADDRESS, with its offset ("vtable for Shape + 16"); None when it knows none."""
    try:
        text = _text(f"info symbol {address:#x}")
    except gdb.error:
        return None
    if not text or text.startswith("No symbol"):
        return None
    return text.split(" in section ")[0].strip()


def stack_frame(thread_number: int, address: int, depth: int = 256) -> tuple[int, bool] | None:
    """The level of the frame of thread THREAD_NUMBER whose part of the stack holds ADDRESS (each frame's from
    its stack pointer up to its caller's), and whether it is the outermost frame gdb knows (ADDRESS may then
    lie above the stack, in the thread's TLS); None when gdb cannot unwind to it."""
    with preserved_selection():
        thread = next((t for t in gdb.selected_inferior().threads() if t.num == thread_number), None)
        if thread is None:
            return None
        found = None
        try:
            thread.switch()
            frame, level = gdb.newest_frame(), 0
            while frame is not None and level < depth:
                if int(frame.read_register("rsp")) > address:
                    break
                older = frame.older()
                found = (level, older is None)
                frame, level = older, level + 1
        except (gdb.error, ValueError):
            pass
    return found
