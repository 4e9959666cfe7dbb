"""mimalloc's options as the process holds them: its table of options (one entry of 32 bytes per option: the
value, whether it was read from the environment yet, the option's own index, a pointer to its name and to its
legacy name), found in the library's data by the indices 0, 1, 2... its entries carry, each entry's name read
from the pointer.  What the process runs with, whatever the defaults of its build: the purge delay, eager
commit, arenas reserved."""

from __future__ import annotations

import numpy as np

from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["find_options", "MiOption"]

_ENTRY = 4              # words per entry
_MIN = 8                # entries a table holds at least
_INIT = ("not read yet", "default", "from the environment")


class MiOption(tuple):
    """(value, how it was set: "default", "from the environment" or "not read yet")."""

    @property
    def value(self) -> int:
        return self[0]

    @property
    def how(self) -> str:
        return self[1]


def find_options(mem: Memory, base: int, words: np.ndarray) -> dict[str, MiOption]:
    """Option name -> MiOption, from the table in the object's data whose entries carry their own indices, 0 up
    (empty when none is found)."""
    if len(words) < _ENTRY * _MIN:
        return {}
    index = (words >> np.uint64(32)).astype(np.int64)
    init = (words & np.uint64(0xFFFFFFFF)).astype(np.int64)
    starts = np.flatnonzero((index[1:len(words) - _ENTRY * _MIN] == 0) & (init[1:len(words) - _ENTRY * _MIN] < 3))
    for i in starts.tolist():
        count = 0
        while i + _ENTRY * count + 3 < len(words) and int(index[i + 1 + _ENTRY * count]) == count \
                and int(init[i + 1 + _ENTRY * count]) < 3:
            count += 1
        if count < _MIN:
            continue
        names = [_name(mem, int(words[i + _ENTRY * k + 2])) for k in range(count)]
        if all(names):
            return {name: MiOption((int(words[i + _ENTRY * k]) - ((1 << 64) if int(words[i + _ENTRY * k]) >> 63
                                                                  else 0), _INIT[int(init[i + 1 + _ENTRY * k])]))
                    for k, name in enumerate(names)}
    return {}


def _name(mem: Memory, at: int) -> str:
    """The option name at AT (lowercase letters and underscores), or ''."""
    if not at:
        return ""
    raw = b""
    for size in (48, 16):
        try:
            raw = mem.read(at, size).split(b"\0", 1)[0]
            break
        except ReadError:
            continue
    text = raw.decode("ascii", "replace")
    return text if text and all(c.islower() or c == "_" for c in text) else ""
