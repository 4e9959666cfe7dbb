"""Dataclasses made with __slots__ (as Python 3.10's ``dataclass(slots=True)``, which 3.9 lacks): for records
kept by the ten thousand, whose instances then hold no dictionary each."""

from __future__ import annotations

import dataclasses

__all__ = ["slotted"]


def slotted(cls: type) -> type:
    """The dataclass CLS made again with a slot for each of its fields and no instance dictionary (its defaults
    stay in its __init__).  A class that sets attributes other than its fields must not be slotted."""
    names = tuple(f.name for f in dataclasses.fields(cls))
    body = {k: v for k, v in cls.__dict__.items() if k not in names and k not in ("__dict__", "__weakref__")}
    body["__slots__"] = names
    made = type(cls)(cls.__name__, cls.__bases__, body)
    made.__qualname__ = cls.__qualname__
    return made
