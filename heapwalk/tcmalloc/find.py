"""The object that holds tcmalloc in a target: a shared library named libtcmalloc (minimal or full), or the
program when it exports tcmalloc's entry points, or defines malloc and holds gperftools' version string (linked
in statically and stripped); its version from that string, which gperftools keeps in its read-only data
("gperftools 2.10").  Google's newer tcmalloc (github.com/google/tcmalloc: per-CPU caches, linked into programs,
as Bazel builds and Rust's tcmalloc crates do) is told apart by what only it holds in its read-only data: its
per-CPU caches' lines of statistics, its own environment variables, its internal namespace."""

from __future__ import annotations

import re
from dataclasses import dataclass

from heapwalk.inferior.elf import ElfImage, Mapping, candidate_images, readable_runs
from heapwalk.inferior.memory import Memory

__all__ = ["TcImage", "find_tcmalloc"]

_NAME = re.compile(r"(?:^|/)libtcmalloc[a-z_]*\.so")
_EXPORTS = ("tc_malloc", "MallocExtension_GetNumericProperty")
_VERSION = re.compile(rb"gperftools (\d+\.\d+(?:\.\d+)?)\0")
#: what only Google's tcmalloc holds in its read-only data (gperftools has no per-CPU caches); two of them must be
#: there, so that a program that merely names one is not taken for it
_GOOGLE = (b"Bytes in per-CPU cache", b"TCMALLOC_HPAA_CONTROL", b"tcmalloc_internal")


@dataclass(frozen=True)
class TcImage:
    """The object that holds tcmalloc: its image, its version ("2.10", or "" when it does not say)."""

    image: ElfImage
    version: str
    google: bool = False        # Google's tcmalloc, not gperftools'

    @property
    def path(self) -> str:
        return self.image.path


def find_tcmalloc(mem: Memory, mappings: list[Mapping]) -> TcImage | None:
    """The object that holds tcmalloc, or None: one named libtcmalloc*, else the program when it exports
    tcmalloc's entry points, or defines malloc and says gperftools' version."""
    for image, named in candidate_images(mem, mappings, _NAME):
        if named or any(image.dynamic_symbol(name) is not None for name in _EXPORTS):
            version = _version(image)
            return TcImage(image, version, not version and _google(image))
        if image.dynamic_symbol("malloc") is not None and _version(image):     # its own malloc: linked in
            return TcImage(image, _version(image))
        if _google(image):
            return TcImage(image, "", True)
    return None


def _google(image: ElfImage) -> bool:
    """Whether IMAGE's read-only data holds what only Google's tcmalloc holds."""
    seen = set()
    for seg in image.readonly_data():
        for _, data in readable_runs(image.mem, seg.address, seg.filesz):
            seen.update(needle for needle in _GOOGLE if needle in data)
    return len(seen) >= 2


def _version(image: ElfImage) -> str:
    found = image.find_bytes(b"gperftools ")
    if found is None:
        return ""
    match = _VERSION.match(found[1])
    return match.group(1).decode() if match else ""
