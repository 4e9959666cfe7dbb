"""The object that holds tcmalloc in a target: a shared library named libtcmalloc (minimal or full), or the
program when it exports tcmalloc's entry points, or defines malloc and holds gperftools' version string (linked
in statically and stripped); its version from that string, which gperftools keeps in its read-only data ("gperftools 2.10")."""

from __future__ import annotations

import re
from dataclasses import dataclass

from heapwalk.inferior.elf import LibcImage, Mapping
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["TcImage", "find_tcmalloc"]

_NAME = re.compile(r"(?:^|/)libtcmalloc[a-z_]*\.so")
_EXPORTS = ("tc_malloc", "MallocExtension_GetNumericProperty")
_VERSION = re.compile(rb"gperftools (\d+\.\d+(?:\.\d+)?)\0")


@dataclass(frozen=True)
class TcImage:
    """The object that holds tcmalloc: its image, its version ("2.10", or "" when it does not say)."""

    image: LibcImage
    version: str

    @property
    def path(self) -> str:
        return self.image.path


def find_tcmalloc(mem: Memory, mappings: list[Mapping]) -> TcImage | None:
    """The object that holds tcmalloc, or None: one named libtcmalloc*, else the program when it exports
    tcmalloc's entry points, or defines malloc and says gperftools' version."""
    firsts = [(m.start, m.path) for m in mappings if m.offset == 0 and m.path.startswith("/")]
    named = [(b, p) for b, p in firsts if _NAME.search(p)]
    for base, path in named or firsts[:1]:
        try:
            image = LibcImage.read(mem, base, path)
        except ReadError:
            continue
        if named or any(image.dynamic_symbol(name) is not None for name in _EXPORTS):
            return TcImage(image, _version(image))
        if image.dynamic_symbol("malloc") is not None and _version(image):     # its own malloc: linked in
            return TcImage(image, _version(image))
    return None


def _version(image: LibcImage) -> str:
    found = image.find_bytes(b"gperftools ")
    if found is None:
        return ""
    match = _VERSION.match(found[1])
    return match.group(1).decode() if match else ""
