"""Finding glibc's malloc state in a target: version, main_arena, mp_, TLS offsets.

Discovery asks a `SymbolSource` (debug symbols, supplied by the gdb layer)
first; sources that need no symbols plug in beside it.  Every fact records how
it was found, so reports can say so, and user overrides (``set heapwalk ...``)
win over everything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from .layout import HEAP_MAX_SIZE, Layout, UnsupportedVersion, layout_for
from .memory import Memory, ReadError
from .model import Fact

__all__ = ["SymbolSource", "NoSymbols", "Overrides", "Discovery", "DiscoveryError", "discover", "parse_version",
           "read_c_string"]


class DiscoveryError(Exception):
    """glibc's malloc state could not be located; the message says what is missing."""


class SymbolSource(Protocol):
    """Answers from debug information, or None when it has no answer."""

    def data_address(self, name: str) -> int | None:
        """Address of libc's data object NAME (main_arena, mp_, free_list, __libc_version)."""

    def tls_offset(self, name: str) -> int | None:
        """Offset of libc's TLS variable NAME from a thread's $fs_base (tcache, thread_arena)."""


class NoSymbols:
    """A SymbolSource that knows nothing."""

    def data_address(self, name: str) -> int | None:
        return None

    def tls_offset(self, name: str) -> int | None:
        return None


@dataclass
class Overrides:
    """Values the user set with ``set heapwalk ...``; None means discover."""

    glibc_version: tuple[int, int] | None = None
    main_arena: int | None = None


@dataclass
class Discovery:
    """What heapwalk needs to walk the heap, with how each part was found."""

    version: tuple[int, int]
    layout: Layout
    main_arena: int
    mp_address: int | None
    tcache_tpoff: int | None
    thread_arena_tpoff: int | None
    free_list_address: int | None
    heap_max_size: int = HEAP_MAX_SIZE
    facts: list[Fact] = field(default_factory=list)

    def found_by(self, name: str) -> str | None:
        return next((f.found_by for f in self.facts if f.name == name), None)


_VERSION = re.compile(rb"(\d+)\.(\d+)")


def parse_version(text: str | bytes) -> tuple[int, int]:
    """'2.36' (or 'GNU C Library ... release version 2.36.') -> (2, 36)."""
    if isinstance(text, str):
        text = text.encode()
    m = re.search(rb"release version (\d+)\.(\d+)", text) or _VERSION.search(text)
    if not m:
        raise ValueError(f"no glibc version in {text[:60]!r}")
    return int(m.group(1)), int(m.group(2))


def read_c_string(mem: Memory, address: int, limit: int = 256) -> bytes:
    """The NUL-terminated string at ADDRESS (at most LIMIT bytes)."""
    out = bytearray()
    while len(out) < limit:
        chunk = mem.read(address + len(out), 16)
        nul = chunk.find(b"\0")
        if nul >= 0:
            return bytes(out + chunk[:nul])
        out += chunk
    return bytes(out)


def _discover_version(mem: Memory, symbols: SymbolSource, overrides: Overrides, facts: list[Fact]) -> tuple[int, int]:
    if overrides.glibc_version:
        facts.append(Fact("glibc_version", overrides.glibc_version, "set heapwalk glibc-version"))
        return overrides.glibc_version
    address = symbols.data_address("__libc_version")
    if address is not None:
        try:
            version = parse_version(read_c_string(mem, address))
            facts.append(Fact("glibc_version", version, "symbol __libc_version"))
            return version
        except (ReadError, ValueError):
            pass
    raise DiscoveryError("cannot tell which glibc this is: no libc debug symbols (install libc6-dbg) "
                         "and no other clue; use 'set heapwalk glibc-version X.Y'")


def discover(mem: Memory, symbols: SymbolSource, overrides: Overrides | None = None) -> Discovery:
    """Locates version, layout, main_arena, mp_ and the TLS offsets of tcache and thread_arena."""
    overrides = overrides or Overrides()
    facts: list[Fact] = []
    version = _discover_version(mem, symbols, overrides, facts)
    try:
        layout = layout_for(version)
    except UnsupportedVersion as exc:
        raise DiscoveryError(str(exc)) from None

    if overrides.main_arena is not None:
        main_arena = overrides.main_arena
        facts.append(Fact("main_arena", main_arena, "set heapwalk main-arena"))
    else:
        main_arena = symbols.data_address("main_arena")
        if main_arena is None:
            raise DiscoveryError("cannot find main_arena: no libc debug symbols (install libc6-dbg) "
                                 "and no heuristic succeeded; use 'set heapwalk main-arena ADDRESS'")
        facts.append(Fact("main_arena", main_arena, "symbol main_arena"))

    mp_address = symbols.data_address("mp_")
    if mp_address is not None:
        facts.append(Fact("mp_", mp_address, "symbol mp_"))
    free_list = symbols.data_address("free_list")
    if free_list is not None:
        facts.append(Fact("free_list", free_list, "symbol free_list"))

    tpoffs: dict[str, int | None] = {}
    for name in ("tcache", "thread_arena"):
        tpoffs[name] = symbols.tls_offset(name) if layout.has_tcache or name == "thread_arena" else None
        if tpoffs[name] is not None:
            facts.append(Fact(f"{name}_tls_offset", tpoffs[name], f"symbol {name} (TLS)"))
    facts.append(Fact("layout", layout.name, f"glibc {version[0]}.{version[1]} layout table"))
    return Discovery(version=version, layout=layout, main_arena=main_arena, mp_address=mp_address,
                     tcache_tpoff=tpoffs["tcache"], thread_arena_tpoff=tpoffs["thread_arena"],
                     free_list_address=free_list, facts=facts)
