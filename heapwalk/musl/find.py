"""The object that holds musl in a target, and whether its malloc is mallocng: musl's C library (its dynamic
linker, named ld-musl-ARCH.so.1, or libc.musl-ARCH.so.1 as Alpine links it, or a musl libc.so in a folder of
musl's, as Debian installs it), else the program when musl is linked into it.  mallocng's table of size classes
(48 16-bit counts of 16-byte units, 1, 2, 3 ... 8191) in the read-only data says mallocng is there; musl's C
library without it has the malloc of musl before 1.2.1 (oldmalloc).  The version is the one musl keeps for ldd
("1.2.3"), when the object holds it."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from heapwalk.inferior.elf import ElfImage, Mapping, candidate_images, readable_runs
from heapwalk.inferior.memory import Memory
from heapwalk.musl.layout import SIZE_CLASSES

__all__ = ["MuslImage", "find_musl", "TABLE"]

_NAME = re.compile(r"(?:^|/)(?:ld-musl-[a-z0-9_]+\.so\.1|libc\.musl-[a-z0-9_]+\.so\.1|[a-z0-9_]+-linux-musl[a-z]*/"
                   r"(?:lib/)?libc\.so)$")
#: mallocng's size classes as its read-only data holds them
TABLE = struct.pack(f"<{len(SIZE_CLASSES)}H", *SIZE_CLASSES)
#: what musl's dynamic linker prints as ldd, around the version it keeps
_VERSION = re.compile(rb"\0(1\.[0-9]+\.[0-9]+)\0")
#: what only musl's C library says (its dynamic linker's usage and its messages)
_MUSL = (b"musl libc", b"ld-musl-")


@dataclass(frozen=True)
class MuslImage:
    """The object that holds musl: its image, whether mallocng's table is in it (and where), its version ("" when
    it does not say)."""

    image: ElfImage
    table: int
    version: str

    @property
    def path(self) -> str:
        return self.image.path

    @property
    def mallocng(self) -> bool:
        return bool(self.table)


def find_musl(mem: Memory, mappings: list[Mapping]) -> MuslImage | None:
    """The object that holds musl, or None: musl's C library by its name, else the program when mallocng's table
    is in its read-only data (linked in statically)."""
    for image, named in candidate_images(mem, mappings, _NAME):
        table = _table(image)
        if named or table:
            return MuslImage(image, table, _version(image) if named else "")
    return None


def _table(image: ElfImage) -> int:
    """The address of mallocng's size classes in IMAGE's read-only data (0: not there)."""
    for seg in image.readonly():
        for base, data in readable_runs(image.mem, seg.address, seg.filesz):
            pos = data.find(TABLE)
            if pos >= 0:
                return base + pos
    return 0


def _version(image: ElfImage) -> str:
    """The version musl keeps for ldd, when the image is musl's and holds one string that looks like it."""
    found = set()
    musl = False
    for seg in image.readonly():
        for _, data in readable_runs(image.mem, seg.address, seg.filesz):
            found.update(m.group(1).decode() for m in _VERSION.finditer(bytes(data)))
            musl = musl or any(needle in data for needle in _MUSL)
    return found.pop() if musl and len(found) == 1 else ""
