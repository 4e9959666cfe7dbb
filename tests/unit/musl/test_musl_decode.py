"""mallocng decoded from synthetic memory written as musl writes it (tests/tools/musl_synth.py): every allocation
at the address malloc returned with the size asked for (at a slot's start or at an offset into it, a few bytes
reserved or many), the groups' bytes balanced by slot state, a group inside another's slot counted once; the
context found by its shape, a symbol that disagrees refused; and each kind of damage named at the bytes that are
wrong, the walk going on."""

from __future__ import annotations

import struct

import pytest

from heapwalk.common.findings import Severity
from heapwalk.musl.account import tally
from heapwalk.musl.check import check_musl
from heapwalk.musl.decode import decode_musl
from heapwalk.musl.discovery import MuslUnknown, context_shape, locate_context
from heapwalk.musl.layout import IB, UNIT
from heapwalk.musl.model import AVAILABLE, FREED, UNUSED
from musl_synth import AREA, CTX, Heap


def _heap() -> tuple[Heap, dict, dict]:
    h = Heap()
    small = h.group(2, 5)                       # 48-byte slots
    h.allocate(small, 0, 40)
    second = h.allocate(small, 1, 20)
    h.allocate(small, 2, 20, offset=1)
    h.allocate(small, 4, 44)
    h.free(small, second)
    big = h.group(20, 4, active=2)              # 1152-byte slots, two activated
    h.allocate(big, 0, 1000)                    # 144 bytes reserved: the count in the slot's last word
    h.ring(2, [small])
    h.ring(20, [big])
    return h, small, big


def _decode(h: Heap):
    return decode_musl(h.mem, CTX, "test", "", "", 4096)


def test_every_allocation_is_read_at_its_address_with_its_size():
    h, small, big = _heap()
    state = _decode(h)
    assert not state.findings
    assert dict(zip(state.used_addr.tolist(), state.used_size.tolist())) == h.live
    in_small = [p for p in h.live if small["mem"] < p < small["mem"] + 4096]
    assert [p for p in in_small if (p - small["mem"] - UNIT) % 48] == [small["mem"] + UNIT + 2 * 48 + UNIT]


def test_the_groups_bytes_balance_by_slot_state():
    h, small, big = _heap()
    t = tally(_decode(h))
    assert t.in_use == sum(h.live.values())
    assert t.free == {FREED: 48, AVAILABLE: 48 + 1152, UNUSED: 2 * 1152}
    assert t.system == t.in_use + t.free_total + t.overhead == 4096 * (small["maplen"] + big["maplen"]) + 4096
    assert t.trapped == t.free_total and not check_musl(_decode(h), h.mem)


def test_a_group_inside_a_slot_of_another_is_counted_once():
    h = Heap()
    outer = h.group(26, 3)                      # 3264-byte slots
    slot = outer["mem"] + UNIT
    inner = h.group(3, 7, at=slot, maplen=0)    # 7 slots of 64 bytes in outer's first slot
    h.mem.write(slot - 3, bytes([6 << 5]))      # the container's header: slot 0, holding a group
    h.mem.write(slot - 2, struct.pack("<H", 0))
    outer["avail"] &= ~1
    h._meta(outer)
    h.allocate(inner, 3, 50)
    state = _decode(h)
    assert not state.findings and state.nested == {1: 0}
    t = tally(state)
    assert t.in_use == 50 and t.system == 4096 * outer["maplen"] + 4096
    assert t.system == t.in_use + t.free_total + t.overhead
    assert t.groups == {"mapped": 1, "nested": 1}


def test_the_context_is_found_by_its_shape_and_a_symbol_must_agree():
    h, _, _ = _heap()
    assert context_shape(h.mem, CTX) == ""
    assert context_shape(h.mem, CTX + 8) != ""

    class Found:
        path = "synthetic"
    with pytest.raises(MuslUnknown, match="does not have mallocng's shape"):
        _locate(h, Found, CTX + 8)
    assert _locate(h, Found, CTX)[0] == CTX


def _locate(h, found, symbol_at):
    import heapwalk.musl.discovery as discovery
    saved = discovery._by_shape
    discovery._by_shape = lambda mem, f: 0
    try:
        return locate_context(h.mem, found, lambda name: symbol_at)
    finally:
        discovery._by_shape = saved


def _errors(h: Heap) -> list:
    state = _decode(h)
    return [f for f in check_musl(state, h.mem) if f.severity is Severity.ERROR]


def test_a_meta_area_off_the_secret_is_named_at_the_area():
    h, _, _ = _heap()
    h.mem.write_u64(AREA, 0x1234)
    found = _errors(h)
    assert found[0].address == AREA and "not the context's secret" in found[0].message


def test_a_group_that_does_not_point_back_is_named_at_its_header_and_left_out():
    h, small, big = _heap()
    h.mem.write_u64(big["mem"], big["meta"] + 8)
    state = _decode(h)
    assert [f.address for f in state.findings] == [big["mem"]]
    assert len(state.groups) == 1 and len(state.used_addr) == 3


def test_a_slot_header_written_over_is_named_at_the_header():
    h, small, _ = _heap()
    p = small["mem"] + UNIT
    h.mem.write(p - 3, bytes([3]))              # slot 0's header now says slot 3
    found = _errors(h)
    assert [f.address for f in found] == [p - IB] and "says slot 3" in found[0].message


def test_a_freed_slot_whose_header_says_in_use_is_named():
    h, small, _ = _heap()
    p = small["mem"] + UNIT + 48
    h.mem.write(p - 3, bytes([1]))              # the freed slot 1's header restored: a free the masks missed
    h.mem.write(p - 2, struct.pack("<H", 3))
    found = _errors(h)
    assert [f.address for f in found] == [p - IB] and "is in use" in found[0].message


def test_a_broken_ring_of_groups_is_named_at_the_meta_whose_link_is_wrong():
    h, small, big = _heap()
    small["next"] = big["meta"]
    h._meta(small)
    found = _errors(h)
    assert [f.address for f in found] == [small["meta"] + 8] and "does not point back" in found[0].message


def test_musls_older_malloc_is_named_in_one_line(monkeypatch):
    """musl's C library without mallocng's table (musl before 1.2.1, oldmalloc): refused, saying which it is."""
    import heapwalk.musl.allocator as allocator
    from heapwalk.common.errors import CannotDecode
    from heapwalk.face import Context
    from heapwalk.musl.find import MuslImage

    class Image:
        path = "/lib/ld-musl-x86_64.so.1"

    class Target:
        mem = None

        class space:
            mappings = []

    monkeypatch.setattr(allocator, "find_musl", lambda mem, mappings: MuslImage(Image(), 0, "1.1.24"))
    with pytest.raises(CannotDecode, match=r"without mallocng \(musl before 1\.2\.1, whose malloc, oldmalloc"):
        allocator.MUSL.load(Context(Target()))
