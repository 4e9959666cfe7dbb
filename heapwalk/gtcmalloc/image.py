"""The object that holds Google's tcmalloc in a target: Google's tcmalloc is linked into programs (as Bazel builds
and Rust's tcmalloc crates link it), so the object is found by what only it holds in its read-only data: two of
its per-CPU caches' statistics lines, its own environment variable, its internal namespace."""

from __future__ import annotations

import re

from heapwalk.inferior.elf import ElfImage, Mapping, candidate_images, readable_runs
from heapwalk.inferior.memory import Memory

__all__ = ["find_google_tcmalloc"]

_NAME = re.compile(r"(?:^|/)libtcmalloc[a-z_]*\.so")
#: what Google's tcmalloc holds in its read-only data (gperftools' tcmalloc has no per-CPU caches, no huge-page-
#: aware allocator); two of them must be there, so that a program that merely names one is not taken for it
MARKS = (b"Bytes in per-CPU cache", b"TCMALLOC_HPAA_CONTROL", b"tcmalloc_internal")


def find_google_tcmalloc(mem: Memory, mappings: list[Mapping]) -> ElfImage | None:
    """The image that holds Google's tcmalloc (a library named libtcmalloc, else the program), or None."""
    for image, _ in candidate_images(mem, mappings, _NAME):
        seen = set()
        for seg in image.readonly_data():
            for _, data in readable_runs(image.mem, seg.address, seg.filesz):
                seen.update(mark for mark in MARKS if mark in data)
        if len(seen) >= 2:
            return image
    return None
