"""Which mapped object holds jemalloc: the program, a shared library or a plugin, under any symbol prefix or
none, stripped or not.

An object holds jemalloc when it exports jemalloc's entry points (``mallctl`` and ``malloc_stats_print``
under one prefix: none, ``je_``, ``_rjem_``...) or, exporting nothing, when its read-only data holds the
messages jemalloc writes (they start with ``<jemalloc>: ``).  A file's name never decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from heapwalk.common.errors import CannotDecode
from heapwalk.inferior.elf import ElfImage, Mapping, readable_runs
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["JemallocImage", "JemallocNotFound", "find_jemalloc", "mapped_objects"]

MARKER = b"<jemalloc>: "
_ENTRY = "malloc_stats_print"


class JemallocNotFound(CannotDecode):
    """jemalloc's state could not be located or decoded; the message says why, in a user's words."""


@dataclass(frozen=True)
class JemallocImage:
    """The object that holds jemalloc, how it was recognised, and the prefix of its entry points (None when
    it exports none)."""

    image: ElfImage
    how: str
    prefix: str | None

    @property
    def path(self) -> str:
        return self.image.path

    @property
    def base(self) -> int:
        return self.image.base

    def entry(self, name: str) -> int | None:
        """The address of jemalloc's exported entry point NAME under its prefix (None when not exported)."""
        return self.image.dynamic_symbol(self.prefix + name) if self.prefix is not None else None


def mapped_objects(mappings: list[Mapping]) -> list[tuple[int, str]]:
    """(base, path) of every file mapped from its first byte, each file once (its lowest mapping), in address
    order."""
    lowest: dict[str, int] = {}
    for m in mappings:
        if m.offset == 0 and m.path.startswith("/") and not m.path.startswith(("/dev/", "/memfd:", "/SYSV")):
            lowest[m.path] = min(m.start, lowest.get(m.path, m.start))
    return sorted((base, path) for path, base in lowest.items())


def find_jemalloc(mem: Memory, mappings: list[Mapping]) -> JemallocImage | None:
    """The object among MAPPINGS that holds jemalloc, None when none does (that can be read)."""
    images = []
    for base, path in mapped_objects(mappings):
        try:
            images.append(ElfImage.read(mem, base, path))
        except ReadError:
            continue
    for image in images:
        prefix = _exported_prefix(image)
        if prefix is not None:
            return JemallocImage(image, f"exports {prefix}mallctl and {prefix}{_ENTRY}", prefix)
    for image in images:
        where = _marker(image)
        if where is not None:
            return JemallocImage(image, f"jemalloc's messages in its read-only data at {where:#x}", None)
    return None


def _exported_prefix(image: ElfImage) -> str | None:
    """The prefix under which IMAGE exports both mallctl and malloc_stats_print, None when it does not."""
    try:
        names = image.dynamic_names()
    except ReadError:
        return None
    for name in names:
        if name.endswith(_ENTRY):
            prefix = name[:-len(_ENTRY)]
            if prefix + "mallctl" in names:
                return prefix
    return None


def _marker(image: ElfImage) -> int | None:
    """Where IMAGE's read-only data (or, linked without a separate read-only segment, its code) holds
    jemalloc's message prefix."""
    for seg in image.readonly_data() or image.readonly():
        for start, data in readable_runs(image.mem, seg.address, seg.filesz):
            pos = data.find(MARKER)
            if pos >= 0:
                return start + pos
    return None
