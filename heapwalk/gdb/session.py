"""The selected inferior, decoded: heapwalk's settings (``set heapwalk ...``) as overrides, the target as gdb
shows it, and glibc's decoder run on it; mistakes the user can make are `UserError`."""

from __future__ import annotations

import dataclasses

import gdb  # type: ignore[import-not-found]

from heapwalk.errors import HeapwalkError
from heapwalk.gdb.console import walk_progress
from heapwalk.findings import Finding, Kind, Severity
from heapwalk.glibc.discovery import DiscoveryError, MallocUnused, Overrides, parse_version
from heapwalk.glibc.load import load
from heapwalk.glibc.model import Arena, HeapState
from heapwalk.jemalloc.discovery import JemallocNotFound, find_library
from heapwalk.jemalloc.load import load_jemalloc
from heapwalk.jemalloc.model import JeState
from heapwalk.target.gdbadapter import GdbSymbols, gdb_memory, preserved_selection, thread_registers
from heapwalk.target.gdbspace import (core_not_read, cpu_counts, describe_target, has_target, memory_map,
                                      missing_ranges, residency)
from heapwalk.target.space import Target


class UserError(HeapwalkError):
    """A mistake in the command line or the target: shown as one line."""


def parse_int(text: str) -> int:
    try:
        return int(gdb.parse_and_eval(text)) if not text.lower().startswith("0x") else int(text, 16)
    except (gdb.error, ValueError):
        raise UserError(f"not an address or number: {text}") from None


class Settings:
    debug = None
    glibc_version = None
    main_arena = None
    resident_from = None
    core_missing = None


def overrides() -> Overrides:
    ov = Overrides()
    version = Settings.glibc_version.value if Settings.glibc_version else ""
    if version:
        try:
            ov.glibc_version = parse_version(version)
        except ValueError:
            raise UserError(f"'set heapwalk glibc-version {version}': expected X.Y, e.g. 2.36") from None
    arena = Settings.main_arena.value if Settings.main_arena else ""
    if arena:
        ov.main_arena = parse_int(arena)
    return ov


def load_target(walk_chunks: bool = False):
    """Discovers and decodes the selected inferior's heap: (state, memory, layout)."""
    _require_target()
    with preserved_selection():
        return _load_glibc(_target(), walk_chunks)


def _require_target() -> None:
    """UserError unless gdb has a 64-bit process or core selected."""
    if not has_target():
        raise UserError("heapwalk: no process or core file: run, attach (gdb -p PID) or load a core first")
    if not _is_64bit():
        raise UserError(f"heapwalk: 32-bit targets are not supported yet: this one is {_architecture()}, and "
                        "heapwalk decodes 64-bit (x86-64) glibc heaps only")


def _load_glibc(target: Target, walk_chunks: bool, keep_used: bool = False, keep_chunks: bool = False):
    """TARGET's glibc heap: (state, memory, layout); KEEP_USED keeps the in-use chunks the walk met, KEEP_CHUNKS
    all of them (for the heap maps)."""
    with walk_progress(walk_chunks) as progress:
        state, disc = load(target, overrides(), walk_chunks, progress, keep_used, keep_chunks)
    return state, target.mem, disc.layout


def _target() -> Target:
    """The selected inferior as gdb shows it."""
    space = memory_map()
    return Target(gdb_memory(space.readable), space, thread_registers(), GdbSymbols(), describe_target(),
                  missing_ranges() if space.core else [], cpu_counts(), residency(), core_not_read())


def _is_64bit() -> bool:
    try:
        return gdb.lookup_type("void").pointer().sizeof == 8
    except gdb.error:
        return True


def _architecture() -> str:
    """The selected inferior's architecture as gdb names it ("i386"), or "32-bit" if gdb cannot say."""
    try:
        return gdb.selected_inferior().architecture().name()
    except (gdb.error, AttributeError, RuntimeError):
        return "32-bit"


def load_state(walk_chunks: bool = False) -> HeapState:
    """Discovers and decodes the selected inferior's heap (with every chunk walked if WALK_CHUNKS)."""
    return load_target(walk_chunks)[0]


def selected_arena(state: HeapState, text: str, command: str) -> Arena:
    """The arena TEXT names (its address, or its number in the ring), for COMMAND's --arena option."""
    arena = state.arena_named(parse_int(text))
    if arena is None:
        raise UserError(f"heapwalk {command}: no arena at {text} (see 'heapwalk arenas')")
    return arena


class SetPrefix(gdb.Command):
    """Settings of heapwalk."""

    def __init__(self, verb: str):
        super().__init__(f"{verb} heapwalk", gdb.COMMAND_DATA, prefix=True)


class DebugParameter(gdb.Parameter):
    """When on, heapwalk shows Python tracebacks for its internal errors."""

    set_doc = "Set whether heapwalk shows tracebacks of internal errors."
    show_doc = "Show whether heapwalk shows tracebacks of internal errors."

    def __init__(self):
        super().__init__("heapwalk debug", gdb.COMMAND_DATA, gdb.PARAM_BOOLEAN)
        self.value = False


class StringParameter(gdb.Parameter):
    """A heapwalk setting; empty means EMPTY (by default: discover it from the target)."""

    def __init__(self, name: str, what: str, empty: str = "discover it from the target"):
        self.set_doc = f"Set {what} (empty: {empty})."
        self.show_doc = f"Show the {what} override."
        super().__init__(f"heapwalk {name}", gdb.COMMAND_DATA, gdb.PARAM_STRING)
        self.value = ""


@dataclasses.dataclass
class Allocators:
    """What the selected inferior allocates with: jemalloc's state when it maps jemalloc and it was found,
    and glibc's (state, memory, layout) when glibc's malloc holds memory (alone, or beside jemalloc)."""

    jemalloc: JeState | None = None
    glibc: tuple | None = None
    target: Target | None = None   # the target as gdb showed it when they were decoded


def load_allocators(walk_chunks: bool = False, keep_used: bool = False, keep_chunks: bool = False) -> Allocators:
    """Decodes every allocator of the selected inferior, asking gdb for the target once.  A process that maps
    jemalloc may use glibc's malloc too (a library bound to it with RTLD_DEEPBIND): both are decoded.  When
    jemalloc is mapped but not found, glibc's heap may still be the one in use: jemalloc's error is raised
    only if glibc's is not found either; when jemalloc is found and glibc's malloc holds something heapwalk
    cannot decode, that is one of jemalloc's findings."""
    _require_target()
    with preserved_selection():
        target = _target()
        je_error = None
        if find_library(target.space.mappings) is not None:
            try:
                je = load_jemalloc(target)
            except JemallocNotFound as exc:
                je_error = UserError(f"heapwalk: this process allocates with jemalloc, and {exc}")
            else:
                return dataclasses.replace(_glibc_beside(je, target, walk_chunks, keep_used, keep_chunks),
                                           target=target)
        try:
            return Allocators(glibc=_load_glibc(target, walk_chunks, keep_used, keep_chunks), target=target)
        except (UserError, DiscoveryError):
            if je_error is not None:
                raise je_error from None
            raise


def _glibc_beside(je: JeState, target: Target, walk_chunks: bool, keep_used: bool = False,
                  keep_chunks: bool = False) -> Allocators:
    """JE with glibc's heap beside it when glibc's malloc was used (without its finding that another allocator
    is mapped: it is decoded too)."""
    try:
        state, mem, layout = _load_glibc(target, walk_chunks, keep_used, keep_chunks)
    except MallocUnused:
        return Allocators(jemalloc=je)
    except (UserError, DiscoveryError) as exc:
        note = Finding(Severity.WARNING, 0, "glibc's malloc", f"not decoded beside jemalloc: {exc}",
                       Kind.DISCOVERY)
        return Allocators(jemalloc=dataclasses.replace(je, findings=je.findings + (note,)))
    kept = tuple(f for f in state.target_findings if f.structure != "allocator")
    return Allocators(jemalloc=je, glibc=(dataclasses.replace(state, target_findings=kept), mem, layout))
