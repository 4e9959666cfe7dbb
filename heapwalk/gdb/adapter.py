"""The target as gdb shows it: memory, libc's debug symbols, threads.

With `heapwalk.gdb.addressspace` (the address space), the gdb side of `heapwalk.inferior`: only the gdb front
end imports ``gdb``.
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

from heapwalk.arch import DEFAULT, Architecture, by_gdb_name
from heapwalk.inferior.threads import FATAL_SIGNALS, ThreadRegs
from heapwalk.gdb.addressspace import command_text, connection_type, core_path
from heapwalk.inferior.corefile import file_build_id
from heapwalk.inferior.coreread import CoreReader
from heapwalk.inferior.memory import CachedMemory, ReadError
from heapwalk.inferior.pages import LivePages
from heapwalk.inferior.readahead import ReadAhead

__all__ = ["gdb_memory", "GdbSymbols", "thread_registers", "preserved_selection", "symbol_at", "stack_frame",
           "target_architecture"]

_LIBC_NAME = re.compile(r"(^|/)libc([.-][\w.]*)?\.so|(^|/)libc\.so\.6")


def gdb_memory(known: list[tuple[int, int]] | None = None) -> CachedMemory:
    """A block-cached Memory over the selected inferior; reads outside KNOWN regions (when given) fail
    at once, without asking gdb, so damaged pointers cost nothing.  A process on this machine is read only
    where its page map says a read faults nothing in (`heapwalk.inferior.pages`); PagesUnknown when that
    cannot be known."""
    inferior = gdb.selected_inferior()

    def read(address: int, size: int) -> bytes:
        return inferior.read_memory(address, size).tobytes()

    connection = connection_type()
    if connection != "native":
        core = _core_reader(read) if connection == "core" else None
        if core is None:
            return CachedMemory(read, max_blocks=_CACHE_BLOCKS, regions=known, raw_buffer=inferior.read_memory)

        memory = CachedMemory(_first(core.read, read), max_blocks=_CACHE_BLOCKS, regions=known,
                              raw_buffer=_first(core.read, inferior.read_memory), raw_links=core.links,
                              read_ahead=ReadAhead(core.read_into), on_thread=lambda: _core_only(core, known))
        weakref.finalize(memory, core.close)
        return memory
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


def _core_only(core: CoreReader, known: list[tuple[int, int]] | None) -> CachedMemory:
    """The core's memory as any thread may read it: from the file alone (what only gdb gives, it does not).
    Without a read ahead: the thread's reads are already beside the caller's work (measured: no faster with one,
    and its windows 4 MiB more of gdb's memory)."""
    def read(address: int, size: int) -> bytes:
        data = core.read(address, size)
        if data is None:
            raise ReadError(address, size, "not in the core file's own bytes")
        return data
    return CachedMemory(read, max_blocks=_THREAD_CACHE_BLOCKS, regions=known, raw_buffer=read)


def _first(primary, fallback):
    """A reader giving PRIMARY's bytes, FALLBACK's where PRIMARY has none (None)."""
    def read(address: int, size: int):
        data = primary(address, size)
        return fallback(address, size) if data is None else data
    return read


def _core_reader(read) -> CoreReader | None:
    """The core gdb has open, read from its file (`coreread`), when it can be and gives the bytes gdb's READ gives
    at the start of a few of its segments; None otherwise, or when HEAPWALK_READ_BY_GDB=1 in the environment."""
    if os.environ.get("HEAPWALK_READ_BY_GDB"):
        return None
    core = CoreReader.open(core_path())
    if core is None:
        return None
    for start in core.samples():
        try:
            expected = read(start, 64)
        except gdb.error:
            continue
        if core.read(start, 64) != expected:
            core.close()
            return None
    return core


#: blocks of 64 KiB the cache keeps (128 MiB): enough that the free lists of an arena of two 64 MiB heaps
#: are read from the core about once, whatever order they link their chunks in
_CACHE_BLOCKS = 2048
#: the same for a reader on another thread (`_core_only`): its windows pass by the cache
_THREAD_CACHE_BLOCKS = 64


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
    """libc's data and TLS symbols from debug information (libc6-dbg), if gdb has it, in a target of ARCH."""

    def __init__(self, arch: Architecture = DEFAULT):
        self.arch = arch

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
        """&NAME minus the thread pointer, computed in the selected thread."""
        for sym in self._symbols(name):
            try:
                frame = gdb.selected_frame()
                address = sym.value(frame).address
                thread_pointer = int(frame.read_register(self.arch.thread_pointer))
            except (gdb.error, ValueError):
                continue
            if address is not None and thread_pointer:
                return int(address) - thread_pointer
        return None


    def libc_file(self) -> tuple[str, str | None] | None:
        """(path, build-id) of the libc gdb loaded for the selected inferior; None when it loaded none."""
        for objfile in gdb.objfiles():
            if getattr(objfile, "owner", None) is None and _is_libc_objfile(objfile):
                return objfile.filename, getattr(objfile, "build_id", None)
        return None

    def loaded_file(self, mapped: str) -> tuple[str, str | None] | None:
        """(path, build-id) of the file gdb reads the shared object the process mapped from MAPPED from (that
        path, or it under gdb's sysroot; its symbols read or not: gdb fills a core's missing pages from it either
        way); None when gdb lists none."""
        try:
            listed = gdb.execute("info sharedlibrary", to_string=True)
        except gdb.error:
            return None
        for line in listed.splitlines():
            name = line.rsplit(None, 1)[-1] if line.startswith("0x") else ""
            if name and (name == mapped or name.endswith(mapped)):
                objfile = next((o for o in gdb.objfiles() if o.filename == name), None)
                found = getattr(objfile, "build_id", None) if objfile is not None else None
                return name, found or file_build_id(name)
        return None


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


def thread_registers(names: dict[int, str] | None = None, arch: Architecture = DEFAULT) -> list[ThreadRegs]:
    """Every thread of the selected inferior (of ARCH) with its thread pointer (None where unreadable) and its
    name (gdb's, or NAMES': LWP -> name, what a capture recorded).  A core's are read once and kept for the
    next command while gdb reads the same core with the same files (`_kept_for`): on a crash core, evaluating
    malloc's arguments in each frame is most of a small heap's command."""
    global _threads_kept
    key = _kept_for(names, arch)
    if key is not None and _threads_kept is not None and _threads_kept[0] == key:
        return list(_threads_kept[1])
    out = _read_thread_registers(names, arch)
    _threads_kept = None if key is None else (key, tuple(out))
    return out


#: the threads `thread_registers` read last, with what they were read from (`_kept_for`)
_threads_kept: tuple[tuple, tuple[ThreadRegs, ...]] | None = None


def _kept_for(names: dict[int, str] | None, arch: Architecture) -> tuple | None:
    """What a core's threads as `thread_registers` reads them depend on: the core file (its path, inode, size
    and time), the files gdb has loaded (another library or debug file changes what a frame's arguments say),
    the inferior, ARCH and NAMES; None for anything but a core (a process's threads move on)."""
    if connection_type() != "core":
        return None
    path = core_path()
    try:
        stat = os.stat(path) if path else None
    except OSError:
        stat = None
    if stat is None:
        return None
    files = tuple(o.filename for o in gdb.objfiles() if o.is_valid())
    return (path, stat.st_ino, stat.st_size, stat.st_mtime_ns, gdb.selected_inferior().num, files, arch.name,
            tuple(sorted((names or {}).items())))


def _read_thread_registers(names: dict[int, str] | None, arch: Architecture) -> list[ThreadRegs]:
    """`thread_registers` read from gdb."""
    out = []
    with preserved_selection():
        for thread in gdb.selected_inferior().threads():
            thread_pointer = sp = signal = None
            registers: list[tuple[str, int]] = []
            try:
                thread.switch()
                frame = gdb.newest_frame()
                thread_pointer = int(frame.read_register(arch.thread_pointer))
                sp = int(frame.read_register(arch.stack_pointer))
                for name in arch.pointer_registers:
                    registers.append((name, int(frame.read_register(name)) & (2**64 - 1)))
            except (gdb.error, ValueError):
                pass
            try:
                signal = int(gdb.parse_and_eval("$_siginfo.si_signo"))
            except (gdb.error, ValueError):
                pass
            arguments = _malloc_arguments() if signal in FATAL_SIGNALS else ()
            lwp = thread.ptid[1] or thread.ptid[0]
            out.append(ThreadRegs(thread.num, lwp, thread_pointer, sp, signal, tuple(registers), arguments,
                                  _thread_name(thread) or (names or {}).get(lwp)))
    return sorted(out, key=lambda t: t.number)


def _thread_name(thread) -> str | None:
    """The thread's name as gdb knows it (a live process's comm; cores have none), or None."""
    try:
        return thread.name or None
    except (gdb.error, RuntimeError):
        return None


def symbol_at(address: int) -> str | None:
    """The symbol gdb knows at ADDRESS, with its offset ("vtable for Shape + 16"); None when it knows none."""
    try:
        text = command_text(f"info symbol {address:#x}")
    except gdb.error:
        return None
    if not text or text.startswith("No symbol"):
        return None
    return text.split(" in section ")[0].strip()


def target_architecture() -> Architecture:
    """The selected inferior's architecture, by the name gdb gives it; UnknownArchitecture when heapwalk reads
    none such."""
    return by_gdb_name(architecture_name())


def architecture_name() -> str:
    """The name gdb gives the selected inferior's architecture: the inferior's (gdb 12+), its
    newest frame's, or what 'show architecture' says it currently is."""
    for ask in (lambda: gdb.selected_inferior().architecture(), lambda: gdb.newest_frame().architecture()):
        try:
            return ask().name()
        except (gdb.error, AttributeError, RuntimeError):
            continue
    found = re.search(r'currently "?([^")]+)"?\)', command_text("show architecture") or "")
    return found.group(1) if found else DEFAULT.gdb_names[0]


def stack_frame(thread_number: int, address: int, depth: int = 256, arch: Architecture = DEFAULT
                ) -> tuple[int, bool] | None:
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
                if int(frame.read_register(arch.stack_pointer)) > address:
                    break
                older = frame.older()
                found = (level, older is None)
                frame, level = older, level + 1
        except (gdb.error, ValueError):
            pass
    return found
