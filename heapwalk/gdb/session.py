"""The selected inferior, decoded: heapwalk's settings (``set heapwalk ...``) as overrides, the target as gdb
shows it, and glibc's decoder run on it; mistakes the user can make are `UserError`."""

from __future__ import annotations

import gdb  # type: ignore[import-not-found]

from heapwalk.gdb.console import walk_progress
from heapwalk.glibc.discovery import DiscoveryError, Overrides, parse_version
from heapwalk.glibc.load import load
from heapwalk.glibc.model import Arena, HeapState
from heapwalk.jemalloc.discovery import JemallocNotFound, find_library
from heapwalk.jemalloc.load import load_jemalloc
from heapwalk.target.gdbadapter import (GdbSymbols, describe_target, gdb_memory, has_target, memory_map,
                                        missing_ranges, preserved_selection, thread_registers)
from heapwalk.target.space import Target


class UserError(Exception):
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


def _load_glibc(target: Target, walk_chunks: bool):
    """TARGET's glibc heap: (state, memory, layout)."""
    with walk_progress(walk_chunks) as progress:
        state, disc = load(target, overrides(), walk_chunks, progress)
    return state, target.mem, disc.layout


def _target() -> Target:
    """The selected inferior as gdb shows it."""
    space = memory_map()
    return Target(gdb_memory(space.readable), space, thread_registers(), GdbSymbols(), describe_target(),
                  missing_ranges() if space.core else [])


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
    """A heapwalk override setting; empty means: discover it from the target."""

    def __init__(self, name: str, what: str):
        self.set_doc = f"Set {what} (empty: discover it from the target)."
        self.show_doc = f"Show the {what} override."
        super().__init__(f"heapwalk {name}", gdb.COMMAND_DATA, gdb.PARAM_STRING)
        self.value = ""


def glibc_unless_jemalloc(args, show_jemalloc, walk_chunks: bool = False, with_memory: bool = False):
    """The glibc state (with WITH_MEMORY: (state, memory, layout)), or None once SHOW_JEMALLOC(state, json
    file) has shown a target that allocates with jemalloc.  When jemalloc is mapped but not found, glibc's heap may still be the one in use: its error is
    raised only if glibc's is not found either.  The target is asked of gdb once."""
    _require_target()
    with preserved_selection():
        target = _target()
        je_error = None
        if find_library(target.space.mappings) is not None:
            try:
                state = load_jemalloc(target)
            except JemallocNotFound as exc:
                je_error = UserError(f"heapwalk: this process allocates with jemalloc, and {exc}")
            else:
                show_jemalloc(state, args.json)
                return None
        try:
            loaded = _load_glibc(target, walk_chunks)
            return loaded if with_memory else loaded[0]
        except (UserError, DiscoveryError):
            if je_error is not None:
                raise je_error from None
            raise
