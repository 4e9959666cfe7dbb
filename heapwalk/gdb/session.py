"""The selected inferior, decoded: heapwalk's settings (``set heapwalk ...``) as overrides, the target as gdb
shows it, and every allocator of the registry looked for in it; mistakes the user can make are `UserError`."""

from __future__ import annotations

import dataclasses

import gdb  # type: ignore[import-not-found]

from heapwalk import registry
from heapwalk.face import Allocator, Context, Decoded, NotUsed, Wants
from heapwalk.common.errors import CannotDecode, UsageError
from heapwalk.gdb import budget
from heapwalk.gdb.console import walk_progress
from heapwalk.arch import UnknownArchitecture, by_elf_machine, known
from heapwalk.gdb.adapter import (GdbSymbols, architecture_name, gdb_memory, preserved_selection,
                                  target_architecture, thread_registers)
from heapwalk.gdb.addressspace import (clock_ns, core_contents, core_machine, core_not_read, cpu_counts, page_size,
                                       describe_target, has_target, memory_map, missing_ranges, residency,
                                       thread_names)
from heapwalk.inferior.memory import drop_cached
from heapwalk.inferior.ownmemory import give_back
from heapwalk.inferior.space import Target

#: a mistake in the command line or the target: shown as one line
UserError = UsageError


def parse_int(text: str) -> int:
    try:
        return int(gdb.parse_and_eval(text)) if not text.lower().startswith("0x") else int(text, 16)
    except (gdb.error, ValueError):
        raise UserError(f"not an address or number: {text}") from None


class Settings:
    debug = None
    memory_check = None        # off: a command this machine has not the memory for is run all the same (`budget`)
    resident_from = None
    core_missing = None
    allocators: dict = {}      # setting name -> its parameter, for the allocators' own settings


def _require_target() -> None:
    """UserError unless gdb has a 64-bit process or core selected."""
    if not has_target():
        raise UserError("heapwalk: no process or core file: run, attach (gdb -p PID) or load a core first")
    _require_core_read_as_its_own()
    if not _is_64bit():
        names = ", ".join(a.name for a in known())
        raise UserError(f"heapwalk: 32-bit targets are not supported yet: this one is {_architecture()}, and "
                        f"heapwalk decodes the heaps of 64-bit ({names}) processes only")
    try:
        target_architecture()
    except UnknownArchitecture as exc:
        raise UserError(f"heapwalk: {exc}") from None


def _require_core_read_as_its_own() -> None:
    """UserError when the core gdb has open is of another architecture than the one gdb reads it as (a gdb
    built for this machine alone gives another architecture's core its own, with no registers)."""
    machine = core_machine()
    if machine is None:
        return
    try:
        own = by_elf_machine(machine)
    except UnknownArchitecture as exc:
        raise UserError(f"heapwalk: {exc}") from None
    if architecture_name() not in own.gdb_names:
        raise UserError(f"heapwalk: this is a core of an {own.name} process, which this gdb reads as "
                        f"{architecture_name()}: open it with a gdb that reads {own.name} (gdb-multiarch), with "
                        f"the libraries of its system under 'set sysroot DIR'")


def _target() -> Target:
    """The selected inferior as gdb shows it."""
    space = memory_map()
    resident = residency()
    arch = target_architecture()
    return Target(gdb_memory(space.readable), space, thread_registers(thread_names(), arch), GdbSymbols(arch),
                  describe_target(), missing_ranges() if space.core else [], cpu_counts(), resident, core_not_read(),
                  clock_ns(), core_contents if resident is None and space.core else None, arch,
                  page_size(arch.page_size))


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


class SetPrefix(gdb.Command):
    """Settings of heapwalk."""

    def __init__(self, verb: str):
        super().__init__(f"{verb} heapwalk", gdb.COMMAND_DATA, prefix=True)


class BoolParameter(gdb.Parameter):
    """A heapwalk setting that is on or off: 'set heapwalk NAME on|off', saying whether WHAT."""

    def __init__(self, name: str, what: str, value: bool):
        self.__doc__ = f"When on, {what}."
        self.set_doc = f"Set whether {what}."
        self.show_doc = f"Show whether {what}."
        super().__init__(f"heapwalk {name}", gdb.COMMAND_DATA, gdb.PARAM_BOOLEAN)
        self.value = value


class StringParameter(gdb.Parameter):
    """A heapwalk setting; empty means EMPTY (by default: discover it from the target)."""

    def __init__(self, name: str, what: str, empty: str = "discover it from the target"):
        self.set_doc = f"Set {what} (empty: {empty})."
        self.show_doc = f"Show the {what} override."
        super().__init__(f"heapwalk {name}", gdb.COMMAND_DATA, gdb.PARAM_STRING)
        self.value = ""


@dataclasses.dataclass
class Found:
    """Every allocator decoded in the selected inferior, the program's own first (`heapwalk.registry`'s order),
    and the target as gdb showed it when they were decoded."""

    decoded: list[Decoded]
    target: Target

    def scanned(self) -> list[Decoded]:
        """The decoded allocators the leak scan reads."""
        return [d for d in self.decoded if d.scans_leaks]


def load_allocators(walk_chunks: bool = False, keep_used: bool = False, keep_chunks: bool = False,
                    keep_pages: bool = False) -> Found:
    """Decodes every allocator of the selected inferior, asking gdb for the target once.  A process may use
    more than one (a program on jemalloc whose library, bound with RTLD_DEEPBIND, uses glibc's malloc): each
    is decoded.  An allocator that is there but cannot be decoded is said in one line when no other could be
    decoded, else it is one of the first decoded one's findings, with the reason."""
    _require_target()
    with preserved_selection():
        target = _target()
        budget.before_decode(target, "report" if keep_used else "walk" if walk_chunks else "lists")
        with walk_progress(walk_chunks) as progress:
            wants = Wants(walk_chunks, keep_used, keep_chunks, progress, keep_pages)
            decoded = decode(target, wants)
    _drop_cached(decoded)
    return Found(decoded, target)


def _drop_cached(decoded: list[Decoded]) -> None:
    """Lets the walkers' cached blocks and free pages go once the decode is done: what a command does next reads
    little, or whole windows (the leak scan)."""
    for one in decoded:
        try:
            drop_cached(one.memory)
        except NotImplementedError:   # a decoder that keeps no memory of its own (CPython's)
            continue
    give_back()


def decode(target: Target, wants: Wants, only: str | None = None) -> list[Decoded]:
    """Every registered allocator (or the one named ONLY) decoded in TARGET, as `load_allocators` says."""
    decoded: list[Decoded] = []
    failed: list[tuple[Allocator, CannotDecode]] = []
    for allocator in registry.allocators():
        if only is not None and allocator.name != only:
            continue
        libc = any(d.serves_libc for d in decoded) or any(a.serves_libc for a, _ in failed)
        context = Context(target, wants, _settings(), parse_int, tuple(decoded), tuple(a.name for a, _ in failed),
                          libc)
        try:
            decoded.append(allocator.load(context))
        except NotUsed:
            continue
        except CannotDecode as exc:
            failed.append((allocator, exc))
    if not decoded:
        if failed:
            raise failed[0][1]
        raise UserError("heapwalk: no allocator heapwalk knows holds memory in this process")
    for allocator, exc in failed:   # looked for before or after the first decoded: never left unsaid
        decoded[0] = decoded[0].with_finding(allocator.beside_failure(exc, decoded[0]))
    return decoded


def _settings() -> dict[str, str]:
    return {name: parameter.value or "" for name, parameter in Settings.allocators.items()}


def reload(found_one: Decoded, wants: Wants) -> Decoded:
    """The allocator of FOUND_ONE decoded again in the selected inferior, with what WANTS asks for."""
    with preserved_selection():
        return decode(_target(), wants, only=found_one.name)[0]
