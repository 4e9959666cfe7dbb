"""What `heapwalk leaks` shows, as plain values: the totals, each arena's, the leaked blocks grouped by size
and by signature, the biggest unreferenced blocks with the first bytes of each, and every leaked block for
the JSON document.  Names of signatures (symbols) come from the caller, which asks the debugger."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from heapwalk.analysis.leaks import (HIDDEN_POINTERS, TEXT, ArenaLeaks, Group, Leaks, by_signature, by_size,
                                     signature_name)
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["LeakReport", "Unreferenced", "SignatureGroup", "LeakedBlock", "describe", "text_at", "HEAD_BYTES"]

#: bytes of each biggest unreferenced block shown
HEAD_BYTES = 32


@dataclass(frozen=True)
class SignatureGroup:
    """Leaked blocks alike by signature: its name, how many, their bytes, and one of them (its address and,
    for text, its first characters)."""

    name: str
    count: int
    bytes: int
    example: int
    text: str = ""


@dataclass(frozen=True)
class Unreferenced:
    """An unreferenced leaked block: where, its size and arena, what it holds, and its first bytes."""

    address: int
    size: int
    arena: int
    holds_count: int
    holds_bytes: int
    head: bytes


@dataclass(frozen=True)
class LeakedBlock:
    """One leaked block, for the JSON document."""

    address: int
    size: int
    arena: int
    unreferenced: bool
    holds_count: int
    holds_bytes: int
    signature: str | None


@dataclass(frozen=True)
class LeakReport:
    """Everything `heapwalk leaks` prints or writes (see the module)."""

    in_use_count: int
    in_use_bytes: int
    leaked_count: int
    leaked_bytes: int
    unreferenced_count: int
    in_rings: int
    in_rings_bytes: int
    arenas: tuple[ArenaLeaks, ...]
    by_size: tuple[Group, ...]
    by_signature: tuple[SignatureGroup, ...]
    biggest: tuple[Unreferenced, ...]
    leaked: tuple[LeakedBlock, ...]
    roots: tuple[tuple[str, int, int], ...]       # kind, regions, bytes
    unread_bytes: int
    note: str = HIDDEN_POINTERS


def describe(lk: Leaks, mem: Memory, images: Sequence[tuple[int, int, str]],
             symbol: Callable[[int], str | None] | None = None, limit: int = 20) -> LeakReport:
    """LK laid out for the output: LIMIT groups and unreferenced blocks at most, every leaked block."""
    blocks = lk.reach.blocks
    sizes = blocks.sizes()
    signed = lk.reach.signed
    names: dict[object, str] = {}

    def name(key: object) -> str:
        if key not in names:
            names[key] = signature_name(key, images, symbol)
        return names[key]

    groups = tuple(SignatureGroup(name(g.key), g.count, g.bytes, int(blocks.addresses(g.example)),
                                  text_at(mem, int(blocks.starts[g.example])) if g.key == TEXT else "")
                   for g in by_signature(signed, sizes, lk.leaked)[:limit])
    holds = dict(zip(lk.unreferenced.tolist(), zip(lk.holds_count.tolist(), lk.holds_bytes.tolist())))
    biggest = tuple(Unreferenced(int(blocks.addresses(i)), int(sizes[i]), int(blocks.arena_of(i)), *holds[i],
                                 _head(mem, int(blocks.starts[i]), min(HEAD_BYTES, int(blocks.end_of(i) - blocks.starts[i]))))
                    for i in lk.unreferenced[:limit].tolist())
    unreferenced = set(holds)
    leaked = tuple(LeakedBlock(int(a), int(s), int(n), i in unreferenced, *holds.get(i, (0, 0)),
                               name(_key(int(sig))) if sig else None)
                   for i, a, s, n, sig in zip(lk.leaked.tolist(), blocks.addresses(lk.leaked).tolist(),
                                              sizes[lk.leaked].tolist(), blocks.arena_of(lk.leaked).tolist(),
                                              signed.of(lk.leaked).tolist()))
    return LeakReport(lk.in_use_count, lk.in_use_bytes, lk.leaked_count, lk.leaked_bytes, lk.unreferenced_count,
                      lk.in_rings, lk.in_rings_bytes, lk.arenas, tuple(by_size(sizes, lk.leaked)[:limit]), groups,
                      biggest, leaked, _roots(lk), sum(hi - lo for lo, hi in lk.reach.unread))


def _key(sig: int) -> object:
    return TEXT if sig == 1 else sig


def _roots(lk: Leaks) -> tuple[tuple[str, int, int], ...]:
    """The roots scanned by kind: how many regions and bytes (registers: how many)."""
    out: dict[str, list[int]] = {}
    for r in lk.reach.roots:
        entry = out.setdefault(r.kind, [0, 0])
        entry[0] += 1
        entry[1] += r.end - r.start
    if lk.reach.registers:
        out["registers"] = [len(lk.reach.registers), 8 * len(lk.reach.registers)]
    return tuple((kind, n, b) for kind, (n, b) in out.items())


def _head(mem: Memory, address: int, size: int) -> bytes:
    try:
        return mem.read(address, size)
    except ReadError:
        return b""


def text_at(mem: Memory, address: int, size: int = 48) -> str:
    """The printable characters a block begins with."""
    data = _head(mem, address, size)
    out = []
    for byte in data:
        if not 0x20 <= byte < 0x7f:
            break
        out.append(chr(byte))
    return "".join(out)

