"""Memory made of byte images at chosen addresses: the synthetic targets of the unit tests."""

from __future__ import annotations

import struct

from heapwalk.inferior.memory import ReadError

__all__ = ["ImageMemory"]

_Q = struct.Struct("<Q")


class ImageMemory:
    """Memory made of (address, bytes) segments: synthetic targets for tests."""

    def __init__(self, segments: dict[int, bytes | bytearray] | None = None):
        self.segments: dict[int, bytearray] = {a: bytearray(b) for a, b in (segments or {}).items()}

    def add(self, address: int, data: bytes | bytearray) -> None:
        self.segments[address] = bytearray(data)

    def read(self, address: int, size: int) -> bytes:
        for base, data in self.segments.items():
            if base <= address and address + size <= base + len(data):
                return bytes(data[address - base:address - base + size])
        raise ReadError(address, size)

    def span_at(self, address: int) -> tuple[int, memoryview]:
        """(start, bytes) of the segment holding ADDRESS (see `CachedMemory.span_at`)."""
        for base, data in self.segments.items():
            if base <= address < base + len(data):
                return base, memoryview(data)
        raise ReadError(address, 1)

    def write(self, address: int, data: bytes) -> None:
        """Test helper: patches bytes inside an existing segment."""
        for base, seg in self.segments.items():
            if base <= address and address + len(data) <= base + len(seg):
                seg[address - base:address - base + len(data)] = data
                return
        raise ReadError(address, len(data))

    def write_u64(self, address: int, value: int) -> None:
        """Test helper: patches a word inside an existing segment."""
        self.write(address, _Q.pack(value & (2**64 - 1)))

    def write_u32(self, address: int, value: int) -> None:
        """Test helper: patches a 32-bit word inside an existing segment."""
        self.write(address, (value & 0xFFFFFFFF).to_bytes(4, "little"))
