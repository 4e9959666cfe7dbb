"""The object that holds mimalloc in a target: a shared library named libmimalloc (libmimalloc.so.2,
libmimalloc-secure.so...), else the program when it exports mimalloc's entry points, or holds mimalloc's own
strings in its read-only data (linked in and stripped, as the Rust crate builds it), unless the program is
CPython, whose own copy of mimalloc is its own; its version from what the
exported ``mi_version()`` returns (a constant: 209 for 2.0.9, 30403 for 3.4.3)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from heapwalk.inferior.elf import ElfImage, Mapping, candidate_images, readable_runs
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["MiImage", "find_mimalloc"]

_NAME = re.compile(r"(?:^|/)libmimalloc[a-z_-]*\.so")
_EXPORTS = ("mi_malloc", "mi_version")
#: what mimalloc keeps in its read-only data: the prefix of its environment variables, and its messages'
_STRINGS = (b"mimalloc_", b"mimalloc: ")
#: CPython from 3.13 links its own copy of mimalloc (its free-threaded builds allocate objects with it), with
#: changes of its own to mimalloc's structures: not taken for a program's mimalloc (docs/mimalloc.md)
_CPYTHON = "_PyRuntime"


@dataclass(frozen=True)
class MiImage:
    """The object that holds mimalloc: its image, its version (major, minor, patch) or None when it does not
    say, and how the version was learnt."""

    image: ElfImage
    version: tuple[int, int, int] | None

    @property
    def path(self) -> str:
        return self.image.path

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version)) if self.version else ""

    @property
    def named(self) -> str:
        """How messages name it: "mimalloc 3.0.1", or "a mimalloc that does not say its version"."""
        return f"mimalloc {self.version_text}" if self.version else "a mimalloc that does not say its version"


def find_mimalloc(mem: Memory, mappings: list[Mapping]) -> MiImage | None:
    """The object that holds mimalloc, or None: one named libmimalloc*, else the program when it exports
    mimalloc's entry points, or defines malloc and holds mimalloc's strings."""
    for image, named in candidate_images(mem, mappings, _NAME):
        exports = any(image.dynamic_symbol(name) is not None for name in _EXPORTS)
        if named or exports or (_strings(image) and image.dynamic_symbol(_CPYTHON) is None):
            return MiImage(image, _version(mem, image))
    return None


def _strings(image: ElfImage) -> bool:
    """Whether IMAGE's read-only data holds mimalloc's own strings (all of them)."""
    seen = set()
    for seg in image.readonly_data():
        for _, data in readable_runs(image.mem, seg.address, seg.filesz):
            seen.update(needle for needle in _STRINGS if needle in data)
    return len(seen) == len(_STRINGS)


def _version(mem: Memory, image: ElfImage) -> tuple[int, int, int] | None:
    """The version mi_version() returns, read from its code (``mov $N, %eax; ret``).  N has had three forms:
    209 (2.0.9, a digit each), 3010 (3.0.10, two digits of patch), 30403 (3.4.3, two of minor and patch)."""
    at = image.dynamic_symbol("mi_version")
    if at is None:
        return None
    try:
        code = mem.read(at, 16)
    except ReadError:
        return None
    number = image.code.returned_constant(code)
    return None if number is None else version_of(number)


def version_of(number: int) -> tuple[int, int, int] | None:
    """(major, minor, patch) of MI_MALLOC_VERSION NUMBER, or None when it is no version."""
    if 100 <= number < 1000:
        return (number // 100, number // 10 % 10, number % 10)
    if 1000 <= number < 10000:
        return (number // 1000, number // 100 % 10, number % 100)
    if 10000 <= number < 100000:
        return (number // 10000, number // 100 % 100, number % 100)
    return None
