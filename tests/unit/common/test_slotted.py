"""Dataclasses made with slots (`common.slotted`): no dictionary an instance, and everything else a dataclass
gives (defaults and factories, equality, repr, replace, pickling, properties and methods)."""

from __future__ import annotations

import dataclasses
import pickle
import sys

import pytest

from heapwalk.common.slotted import slotted


@slotted
@dataclasses.dataclass
class Record:
    """A record with a default, a factory and a field left out of comparisons."""

    at: int
    size: int = 16
    parts: list = dataclasses.field(default_factory=list)
    note: str = dataclasses.field(default="", compare=False)

    @property
    def end(self) -> int:
        return self.at + self.size


def test_a_slotted_record_holds_no_dictionary_and_is_still_a_dataclass():
    one, two = Record(0x1000), Record(0x1000, note="other")
    assert not hasattr(one, "__dict__") and Record.__slots__ == ("at", "size", "parts", "note")
    assert one == two and one.end == 0x1010 and one.parts is not two.parts
    assert repr(one) == "Record(at=4096, size=16, parts=[], note='')"
    assert dataclasses.replace(one, size=32).end == 0x1020
    assert pickle.loads(pickle.dumps(Record(1, 2, [3], "x"))) == Record(1, 2, [3])
    with pytest.raises(AttributeError):
        one.other = 1
    assert Record.__qualname__ == "Record" and Record.__doc__.startswith("A record")


def test_a_slotted_record_is_smaller():
    @dataclasses.dataclass
    class Plain:
        a: int = 0
        b: int = 0
        c: int = 0
    plain = Plain()
    assert sys.getsizeof(slotted(Plain)()) < sys.getsizeof(plain) + sys.getsizeof(plain.__dict__)
