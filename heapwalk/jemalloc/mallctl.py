"""mallctl's tree of named nodes, found in a jemalloc image without symbols, and what its functions show.

mallctl resolves a name like ``opt.dirty_decay_ms`` or ``arenas.lookup`` by walking a tree of nodes kept in
the image's relocated data: a named node is {named, name, nchildren, children, ctl}, 40 bytes, its name a
string of the read-only data.  The top level ("version", "epoch", "thread", "config", "opt", "arena",
"arenas", "stats", ...) is one array of such nodes; each node's children are another.  The tree is the same
whatever the build's symbol prefix, and it is there in stripped images, so heapwalk finds jemalloc's code
through it: each leaf's ctl function is a small function whose loads name the global it reads.

The top level is found from the node named "opt" (a node whose name is "opt", with children and no ctl
function of its own); its neighbours in the same array are the other top-level nodes.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import numpy as np

from heapwalk.common.errors import HeapwalkError
from heapwalk.inferior.elf import ElfImage, readable_runs
from heapwalk.inferior.memory import ReadError

__all__ = ["MallctlTree", "Node", "TreeNotFound", "cstring"]

NODE = 40                   # ctl_named_node_t
_MAX_STRING = 4096
_MAX_CHILDREN = 1024
_NAME = re.compile(r"[a-z_0-9]{1,64}\Z")


class TreeNotFound(HeapwalkError):
    """mallctl's tree could not be found; the message says where the search stopped."""


@dataclass(frozen=True)
class Node:
    """One named node: where it is, its name, its children (an array of NODE-byte nodes) and its ctl
    function (0 for an inner node)."""

    address: int
    name: str
    nchildren: int
    children: int
    ctl: int


class MallctlTree:
    """The top level of mallctl's tree in IMAGE, and lookups by dotted name."""

    def __init__(self, image: ElfImage, top: list[Node]):
        self.image, self.top = image, top

    @classmethod
    def find(cls, image: ElfImage) -> "MallctlTree":
        """The tree of IMAGE (TreeNotFound when no node named "opt" is in its writable data)."""
        opt = _opt_node(image)
        top = [opt]
        at = opt.address - NODE
        while (node := _node_at(image, at)) is not None:
            top.insert(0, node)
            at -= NODE
        at = opt.address + NODE
        while (node := _node_at(image, at)) is not None:
            top.append(node)
            at += NODE
        return cls(image, top)

    def children(self, node: Node) -> list[Node]:
        """NODE's named children (empty for a leaf, or children that are an indexed node)."""
        out = []
        for i in range(node.nchildren):
            child = _node_at(self.image, node.children + NODE * i)
            if child is None:
                return out
            out.append(child)
        return out

    def node(self, dotted: str) -> Node | None:
        """The node named DOTTED ("arenas.lookup"), None when the tree has none."""
        level = self.top
        found = None
        for part in dotted.split("."):
            found = next((n for n in level if n.name == part), None)
            if found is None:
                return None
            level = self.children(found) if found.nchildren else []
        return found

    @property
    def address(self) -> int:
        """Where the top level's array starts."""
        return self.top[0].address


def _node_at(image: ElfImage, at: int) -> Node | None:
    """The named node at AT, None when what is there is not one."""
    try:
        named, name_at, nchildren, children, ctl = struct.unpack("<QQQQQ", image.mem.read(at, NODE))
    except ReadError:
        return None
    if named & 0xFF != 1 or nchildren > _MAX_CHILDREN or (nchildren == 0) != (children == 0) \
            or (nchildren == 0) == (ctl == 0) or not image.contains(name_at):
        return None
    try:
        name = cstring(image, name_at, 65)
    except (ReadError, ValueError):
        return None
    return Node(at, name, nchildren, children, ctl) if _NAME.match(name) else None


def _opt_node(image: ElfImage) -> Node:
    """The named node "opt": a node in writable data whose name is a string "opt" of read-only data, with
    children (a pointer into the same data) and no ctl function of its own."""
    names = np.array(sorted({start + m.start() for seg in image.readonly_data() or image.readonly()
                             for start, data in readable_runs(image.mem, seg.address, seg.filesz)
                             for m in re.finditer(rb"(?<=\0)opt\0", bytes(data))}), dtype=np.uint64)
    if not len(names):
        raise TreeNotFound(f"no string \"opt\" in {image.path}'s read-only data")
    for seg in image.writable():
        for start, data in readable_runs(image.mem, seg.address, seg.filesz):
            skip = (-start) % 8
            words = np.frombuffer(data, dtype=np.uint64, count=(len(data) - skip) // 8, offset=skip)
            for index in np.flatnonzero(np.isin(words, names)):
                node = _node_at(image, start + skip + 8 * (int(index) - 1))
                if node is not None and node.name == "opt" and node.nchildren and \
                        seg.address <= node.children < seg.address + seg.memsz:
                    return node
    raise TreeNotFound(f"no mallctl node named \"opt\" in {image.path}'s data")


def cstring(image: ElfImage, address: int, limit: int = _MAX_STRING) -> str:
    """The NUL-terminated string at ADDRESS (ValueError when it does not end within LIMIT bytes)."""
    out = bytearray()
    while len(out) < limit:
        chunk = image.mem.read(address + len(out), 64 - (address + len(out)) % 64)
        end = chunk.find(b"\0")
        if end >= 0:
            return (out + chunk[:end]).decode(errors="replace")
        out += chunk
    raise ValueError(f"no string at {address:#x}")
