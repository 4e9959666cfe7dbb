"""The allocators heapwalk decodes, in the order they are looked for: the allocators a program brings (they
serve its malloc when present) before the C library's.  The one place that names them; a new allocator is
its folder and one line here (docs/architecture.md)."""

from __future__ import annotations

from heapwalk.face import Allocator

__all__ = ["allocators", "add", "remove", "described", "xml_help"]

_added: list[Allocator] = []


def allocators() -> tuple[Allocator, ...]:
    """Every allocator, in the order they are looked for; CPython's obmalloc, which takes its memory from the
    system beside them, last."""
    from heapwalk.jemalloc.allocator import JEMALLOC
    from heapwalk.tcmalloc.allocator import TCMALLOC
    from heapwalk.gtcmalloc.allocator import GTCMALLOC
    from heapwalk.mimalloc.allocator import MIMALLOC
    from heapwalk.musl.allocator import MUSL
    from heapwalk.glibc.allocator import GLIBC
    from heapwalk.cpython.allocator import CPYTHON
    return (*_added, JEMALLOC, TCMALLOC, GTCMALLOC, MIMALLOC, MUSL, GLIBC, CPYTHON)


def add(allocator: Allocator) -> None:
    """Makes ALLOCATOR known for this session, looked for first (an allocator written outside the package,
    or a test's)."""
    if allocator not in _added:
        _added.append(allocator)


def remove(allocator: Allocator) -> None:
    if allocator in _added:
        _added.remove(allocator)


def described(what: str, command: str) -> str:
    """A command's help: WHAT it does for every allocator, then what it shows of each (`Allocator.describes`)."""
    parts = [f"For {a.title}: {a.describes[command]}." for a in allocators() if command in a.describes]
    return " ".join([f"{what}.", *parts])


def xml_help() -> str:
    """The help of report's --xml: the allocators' own XML statistics, and what each holds."""
    writers = [f"{a.xml_name}" + (f" ({a.describes['xml']})" if "xml" in a.describes else "")
               for a in allocators() if a.xml_name]
    return f"also write the allocator's own XML statistics: {'; '.join(writers) or 'none'}"
