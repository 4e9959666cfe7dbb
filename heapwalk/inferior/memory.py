"""Reading target memory in bulk.

Everything below the gdb layer reads the target through a `Memory`: a
``read(address, size) -> bytes`` that raises `ReadError` for memory the target
does not have.  `CachedMemory` wraps a raw reader (gdb's
``Inferior.read_memory``, or anything else) with a cache of aligned blocks, so
that walkers may read one field at a time without one call into gdb per field.
`image.ImageMemory` serves synthetic byte images to the unit tests.
"""

from __future__ import annotations

import bisect
import struct
from collections import OrderedDict
from typing import Callable, Protocol

from heapwalk.common.errors import HeapwalkError

__all__ = ["ReadError", "Memory", "CachedMemory", "u64", "u32", "hop_u64", "hop_read", "links_from",
           "read_once", "readable", "drop_cached", "memory_for_thread"]

_Q = struct.Struct("<Q")
_I = struct.Struct("<I")


class ReadError(HeapwalkError):
    """The target has no readable memory at ADDRESS (SIZE bytes were asked for)."""

    def __init__(self, address: int, size: int, reason: str = "unreadable"):
        super().__init__(f"cannot read {size} bytes at {address:#x}: {reason}")
        self.address = address
        self.size = size
        self.reason = reason


class Memory(Protocol):
    """What walkers need from a target: raw bytes by address."""

    def read(self, address: int, size: int) -> bytes: ...


def u64(mem: Memory, address: int) -> int:
    """Reads a little-endian 64-bit word."""
    return _Q.unpack(mem.read(address, 8))[0]


def hop_u64(mem: Memory, address: int) -> int:
    """The word at ADDRESS for a walk that hops across a big heap (a free list through gigabytes): from a block
    the cache holds, else read alone, so that the hops neither fill the cache nor push the blocks out of it
    (`CachedMemory.hop`)."""
    hop = getattr(mem, "hop", None)
    return hop(address) if hop is not None else u64(mem, address)


def hop_read(mem: Memory, address: int, size: int) -> bytes:
    """`hop_u64` of SIZE bytes (a header): read alone where MEM keeps a cache and no cached block holds them, so
    that a walk reading one small header from each of thousands of pages does not cache their blocks."""
    hop = getattr(mem, "hop_read", None)
    return hop(address, size) if hop is not None else mem.read(address, size)


def links_from(mem: Memory, head: int, count: int) -> list[int] | None:
    """A list whose nodes link the next by their first word, as far as MEM reads it at once: [HEAD, the link at
    HEAD, the link at that, ...], COUNT + 1 at most, ending early at a null link, at a node met before, or at one
    MEM cannot read at once (the caller goes on from there with `hop_u64`); None where MEM has no such reader."""
    follow = getattr(mem, "follow", None)
    return follow(head, count) if follow is not None else None


def read_once(mem: Memory, address: int, size: int) -> bytes | memoryview:
    """SIZE bytes at ADDRESS for a walk that reads them once and only looks (a page's blocks, a span's objects):
    past the cache where MEM keeps one (`CachedMemory.read_buffer`), so that it neither fills the cache nor
    loads a block a page at a time; ReadError as `read`."""
    return getattr(mem, "read_buffer", mem.read)(address, size)


def readable(mem: Memory, address: int) -> bool:
    """Can MEM read the word at ADDRESS?"""
    try:
        mem.read(address, 8)
    except ReadError:
        return False
    return True


def memory_for_thread(mem: Memory) -> Memory | None:
    """MEM as another thread may read it (`CachedMemory.for_thread`), or None where only the caller's may: what it
    cannot read there raises ReadError, as memory the target lacks does."""
    for_thread = getattr(mem, "for_thread", None)
    return for_thread() if for_thread is not None else None


def drop_cached(mem: Memory) -> None:
    """Lets MEM's cached blocks go, when it keeps any (`CachedMemory.drop`): for a phase that reads whole windows
    after one that read a field at a time."""
    if isinstance(mem, CachedMemory):
        mem.drop()


def u32(mem: Memory, address: int) -> int:
    return _I.unpack(mem.read(address, 4))[0]


class CachedMemory:
    """A block cache in front of a raw reader.

    Reads are served from aligned blocks of BLOCK bytes kept in an LRU of at
    most MAX_BLOCKS blocks' bytes.  A block that cannot be read whole is read
    page by page, and unreadable pages are remembered, so a hole costs one
    failed read.  A miss in a block whose previous block is not cached loads
    one page, not the block: walkers hopping along lists (a thread's tcache,
    free lists through gigabytes) read 4 KiB a hop instead of 64 KiB (several
    times cheaper through gdb).  A block whose previous block is cached, or
    whose pages are wanted again (more than once while the cache has room,
    PAGES_BEFORE_BLOCK times once it is full), is loaded whole, so that a
    walk from low to high addresses, or about a small heap, reads blocks.
    """

    #: pages of a block loaded one at a time, once the cache is full, before the next miss in it loads it whole
    PAGES_BEFORE_BLOCK = 8

    BLOCK = 1 << 16
    PAGE = 1 << 12

    def __init__(self, raw_read: Callable[[int, int], bytes], max_blocks: int = 512,
                 regions: list[tuple[int, int]] | None = None,
                 raw_buffer: Callable[[int, int], memoryview] | None = None,
                 raw_links: Callable[[int, int], list[int]] | None = None, read_ahead=None,
                 on_thread: Callable[[], CachedMemory] | None = None):
        self._raw = raw_read
        self._on_thread = on_thread      # makes a reader of the same memory any thread may use, or None
        self._raw_buffer = raw_buffer
        self._raw_links = raw_links
        self._ahead = read_ahead         # a `readahead.ReadAhead` over RAW_BUFFER's own first reader, or None
        self._blocks: OrderedDict[int, bytes | dict[int, bytes | None]] = OrderedDict()
        self._capacity = max_blocks * (self.BLOCK // self.PAGE)   # in pages
        self._held = 0                                            # pages the cache holds
        self._full = False                                        # has the cache had to drop a block yet?
        self._starts: list[int] = []
        self._ends: list[int] = []
        # the fast path of `read`: the block served last, and the known region it lies in
        self._last_base, self._last_data = -(1 << 70), b""
        self._region = (0, 1 << 64) if not regions else (0, 0)
        for start, end in sorted(regions or ()):
            if self._ends and start <= self._ends[-1]:
                self._ends[-1] = max(self._ends[-1], end)
            else:
                self._starts.append(start)
                self._ends.append(end)

    def for_thread(self) -> CachedMemory | None:
        """A reader of the same bytes for another thread of heapwalk's own (its cache and read-ahead its own; a
        core file's reads, never gdb's), or None where reads need gdb (a live process)."""
        return None if self._on_thread is None else self._on_thread()

    def drop(self) -> None:
        """Lets every cached block go (up to 128 MiB in gdb, `adapter.gdb_memory`), and a window read ahead that
        no read took (`let_go_ahead`); the next reads load them again."""
        self.let_go_ahead()
        self._blocks.clear()
        self._held, self._full = 0, False
        self._last_base, self._last_data = -(1 << 70), b""

    def _known(self, address: int, size: int) -> bool:
        """Is [address, address+size) inside the target's regions (always, when none were given)?"""
        if not self._starts:
            return True
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address + size <= self._ends[i]:
            self._region = (self._starts[i], self._ends[i])
            return True
        return False

    def _load_block(self, base: int) -> bytes | dict[int, bytes | None]:
        try:
            data = bytes(self._raw(base, self.BLOCK))
            if len(data) == self.BLOCK:
                return data
        except Exception:
            pass
        pages: dict[int, bytes | None] = {}
        for page in range(base, base + self.BLOCK, self.PAGE):
            try:
                data = bytes(self._raw(page, self.PAGE))
                pages[page] = data if len(data) == self.PAGE else None
            except Exception:
                pages[page] = None
        return pages

    def _block(self, base: int, page: int) -> bytes | dict[int, bytes | None]:
        """The block at BASE, as the cache holds it, for a read at PAGE: its bytes, or its pages by address
        (None for an unreadable one; a page not loaded yet is absent, for `_page` to load)."""
        block = self._blocks.get(base)
        if block is None:
            block = self._load_block(base) if self._whole(base) else {}
        elif isinstance(block, bytes) or page in block or len(block) < (self.PAGES_BEFORE_BLOCK if self._full else 1):
            self._blocks.move_to_end(base)
            return block
        else:
            block = self._load_block(base)
        self._keep(base, block)
        return block

    def _whole(self, base: int) -> bool:
        """Should a miss at the block at BASE load the whole block (not only the page wanted)?"""
        return isinstance(self._blocks.get(base - self.BLOCK), bytes)

    def _keep(self, base: int, block: bytes | dict[int, bytes | None]) -> None:
        """Holds BLOCK (new, or in place of the one held at BASE) as the most recent, dropping the least recent
        blocks beyond the capacity."""
        old = self._blocks.pop(base, None)
        self._held += self._pages_of(block) - (self._pages_of(old) if old is not None else 0)
        self._blocks[base] = block
        if self._held > self._capacity:
            self._trim()

    def _trim(self) -> None:
        while self._held > self._capacity and len(self._blocks) > 1:
            self._full = True
            self._held -= self._pages_of(self._blocks.popitem(last=False)[1])

    def _pages_of(self, block: bytes | dict[int, bytes | None]) -> int:
        return self.BLOCK // self.PAGE if isinstance(block, bytes) else len(block)

    def _page(self, block: dict[int, bytes | None], page: int) -> bytes | None:
        """The page at PAGE of a block held as pages (the most recent), loaded when the cache does not have it
        yet; None when it is unreadable."""
        if page not in block:
            try:
                data = bytes(self._raw(page, self.PAGE))
                block[page] = data if len(data) == self.PAGE else None
            except Exception:
                block[page] = None
            self._held += 1
            if self._held > self._capacity:
                self._trim()
        return block[page]

    def _piece(self, address: int, size: int) -> bytes:
        """SIZE bytes at ADDRESS, all within one block."""
        base = address & ~(self.BLOCK - 1)
        block = self._block(base, address & ~(self.PAGE - 1))
        if isinstance(block, bytes):
            self._last_base, self._last_data = base, block
            off = address - base
            return block[off:off + size]
        out = bytearray()
        while size:
            page = address & ~(self.PAGE - 1)
            data = self._page(block, page)
            if data is None:
                raise ReadError(address, size)
            off = address - page
            take = min(size, self.PAGE - off)
            out += data[off:off + take]
            address += take
            size -= take
        return bytes(out)

    def read(self, address: int, size: int) -> bytes:
        off = address - self._last_base
        if 0 <= off and off + size <= self.BLOCK and size >= 0 and \
                self._region[0] <= address and address + size <= self._region[1]:
            return self._last_data[off:off + size]  # within the block served last: the walkers' common case
        if address < 0 or size < 0 or address + size > 1 << 64:
            raise ReadError(address, size, "address out of range")
        if not self._known(address, size):
            raise ReadError(address, size, "not in the target's memory")
        if size >= self.BLOCK * 4:
            return self._read_large(address, size)
        return self._read_blocks(address, size)

    def hop(self, address: int) -> int:
        """The 8-byte word at ADDRESS, from a cached block when one holds it, else read alone and not kept."""
        return _Q.unpack(self.hop_read(address, 8))[0]

    def hop_read(self, address: int, size: int) -> bytes:
        """SIZE bytes at ADDRESS, from a cached block when one holds them, else read alone and not kept."""
        at = address & (self.BLOCK - 1)
        block = self._blocks.get(address - at)
        if isinstance(block, bytes) and at + size <= len(block):
            return block[at:at + size]
        if address < 0 or address + size > 1 << 64 or not self._known(address, size):
            raise ReadError(address, size, "not in the target's memory")
        try:
            data = self._raw(address, size)
        except Exception:
            data = b""
        if len(data) != size:
            raise ReadError(address, size)
        return bytes(data)

    def follow(self, head: int, count: int) -> list[int] | None:
        """`links_from` through the raw reader's own walk (RAW_LINKS; None without one), cut at the first node
        outside the target's regions (`hop_u64` would not read it)."""
        if self._raw_links is None:
            return None
        links = self._raw_links(head, count)
        for i, node in enumerate(links[:-1]):
            if not self._known(node, 8):
                return links[:i + 1]
        return links

    def span_at(self, address: int) -> tuple[int, bytes | memoryview]:
        """(start, bytes) of the readable span around ADDRESS that reads are served from: its cached block,
        or the readable page of a block with holes, cut to the target's region.  For walkers that parse many
        small pieces lying near each other without a call per piece.  ReadError when ADDRESS is unreadable."""
        low, high = self._region
        if not low <= address < high:
            if not 0 <= address < 1 << 64 or not self._known(address, 1):
                raise ReadError(address, 1, "not in the target's memory")
            low, high = self._region
        base = address & ~(self.BLOCK - 1)
        block = self._blocks.get(base)
        if not isinstance(block, bytes):
            block = self._block(base, address & ~(self.PAGE - 1))
        if not isinstance(block, bytes):
            base = address & ~(self.PAGE - 1)
            block = self._page(block, base)
            if block is None:
                raise ReadError(address, 1)
        if low <= base and base + len(block) <= high:
            return base, block
        start, end = max(base, low), min(base + len(block), high)
        return start, memoryview(block)[start - base:end - base]

    def read_buffer(self, address: int, size: int) -> bytes | memoryview:
        """SIZE bytes at ADDRESS for a reader that only looks, once (the chunk walk's windows, a page's blocks):
        a span of a page or more comes straight from the raw reader's own buffer when it has one, saving a copy
        and leaving the cache as it is (read ahead, `prefetch`, when it was asked for); else as `read`."""
        if not self._buffered(address, size):
            return self.read(address, size)
        data = self._ahead.take(address, size) if self._ahead is not None else None
        if data is not None and len(data) == size:
            return data
        return self._read_large(address, size, self._raw_buffer)

    def prefetch(self, address: int, size: int) -> None:
        """Has SIZE bytes at ADDRESS read ahead for `read_buffer`, where a reader any thread may call was given."""
        if self._ahead is not None:
            region = self._region                  # the fast path's, as the reads left it
            if self._buffered(address, size):
                self._ahead.start(address, size)
            self._region = region

    def let_go_ahead(self) -> None:
        """Lets a window read ahead go that no read took (a walk that stopped before it)."""
        if self._ahead is not None:
            self._ahead.let_go()

    def _buffered(self, address: int, size: int) -> bool:
        """Whether `read_buffer` takes SIZE bytes at ADDRESS from the raw reader's buffer."""
        return self._raw_buffer is not None and size >= self.PAGE and address >= 0 and size >= 0 \
            and address + size <= 1 << 64 and self._known(address, size)

    def _read_large(self, address: int, size: int, raw=None) -> bytes | memoryview:
        """One raw read for big spans (heap segments), falling back to blocks; RAW, when given, is a reader
        whose buffer is returned as it is."""
        try:
            data = raw(address, size) if raw is not None else bytes(self._raw(address, size))
            if len(data) == size:
                return data
        except Exception:
            pass
        return self._read_blocks(address, size)

    def _read_blocks(self, address: int, size: int) -> bytes:
        out = []
        while size:
            take = min(size, self.BLOCK - (address & (self.BLOCK - 1)))
            out.append(self._piece(address, take))
            address += take
            size -= take
        return b"".join(out)

