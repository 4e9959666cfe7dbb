"""What each block's first word says it is: its signature (a C++ object's vtable, a C struct's pointer to a
constant table: a word pointing into a read-only mapping of a loaded file; or text), kept as a small code a block
(`Signed`) with the table of the values the codes stand for, so that the leak scan keeps a byte a block for it
(two once a program has more than 254 signatures, four past 65,534), not the eight of the word."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from heapwalk.analysis.lookup import text_words
from heapwalk.analysis.tally import signature_words

__all__ = ["Signed", "signatures", "begins_with_text", "NONE", "TEXT_CODE"]

#: the codes of a block without a signature and of one that begins with text (also their values)
NONE, TEXT_CODE = 0, 1


class Signed:
    """The signature of each of COUNT blocks, as a code (uint8, widened as the signatures outgrow it) into
    VALUES (the signatures: 0 none, 1 text, else the address the first word holds); blocks are given theirs a
    window at a time (`add`)."""

    def __init__(self, count: int, images: Sequence[tuple[int, int, str]]):
        self.images = tuple(images)
        self._bounds = _image_bounds(self.images)
        self.codes = np.zeros(count, dtype=np.uint8)
        self._values: list[int] = [NONE, TEXT_CODE]
        self._code_of: dict[int, int] = {}

    @classmethod
    def of_words(cls, first_words: np.ndarray, images: Sequence[tuple[int, int, str]]) -> "Signed":
        """The signatures of blocks whose first words are FIRST_WORDS (uint64, one a block)."""
        out = cls(len(first_words), images)
        out.add(0, first_words)
        return out

    def add(self, first: int, words: np.ndarray) -> None:
        """The blocks FIRST, FIRST + 1, ... begin with WORDS (uint64): their signatures."""
        sig = signatures(words, self.images, self._bounds)
        codes = self.codes[first:first + len(words)]
        codes[:] = sig == TEXT_CODE                      # TEXT_CODE where it holds text, NONE elsewhere
        named = np.flatnonzero(sig > TEXT_CODE)
        if not len(named):
            return
        values, inverse = np.unique(sig[named], return_inverse=True)
        known = np.array([self._code(int(v)) for v in values.tolist()], dtype=np.uint32)
        wide = np.min_scalar_type(len(self._values) - 1)
        if wide.itemsize > self.codes.itemsize:
            self.codes = self.codes.astype(np.uint16 if wide.itemsize == 2 else np.uint32)
            codes = self.codes[first:first + len(words)]
        codes[named] = known[inverse]

    def _code(self, value: int) -> int:
        code = self._code_of.get(value)
        if code is None:
            code = self._code_of[value] = len(self._values)
            self._values.append(value)
        return code

    @property
    def values(self) -> np.ndarray:
        """The signature each code stands for (uint64)."""
        return np.array(self._values, dtype=np.uint64)

    def of(self, rows: np.ndarray) -> np.ndarray:
        """The signatures (uint64) of the blocks at ROWS."""
        return self.values[self.codes[rows]]


def _image_bounds(images: Sequence[tuple[int, int, str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IMAGES (start, end, name, in order) as `signatures` reads them: their starts, their ends and each file's
    load address (uint64 arrays)."""
    return (np.array([lo for lo, _, _ in images], dtype=np.uint64),
            np.array([hi for _, hi, _ in images], dtype=np.uint64), np.array(_load_addresses(images), dtype=np.uint64))


def signatures(first_words: np.ndarray, images: Sequence[tuple[int, int, str]],
               bounds: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Each block's signature as a number: its first word when that points into a read-only mapping of a
    loaded file (IMAGES: start, end, name, in order; BOUNDS, when given, their `_image_bounds`) other than the
    file's first byte (a load address, as in a link_map, not a type), 1 when it begins with text, 0 otherwise."""
    starts, ends, loads = bounds if bounds is not None else _image_bounds(images)
    native = signature_words(first_words, starts, ends, loads)
    if native is not None:
        return native
    out = np.zeros(len(first_words), dtype=np.uint64)
    if images:
        i = np.searchsorted(starts, first_words, side="right") - 1
        inside = np.flatnonzero((i >= 0) & (first_words < ends[np.maximum(i, 0)]))
        inside = inside[~np.isin(first_words[inside], loads)]
        out[inside] = first_words[inside]
    out[begins_with_text(first_words) & (out == 0)] = 1
    return out


_HIGH = np.uint64(0x8080808080808080)


def begins_with_text(words: np.ndarray, native: bool = True) -> np.ndarray:
    """Whether each of WORDS (uint64, as stored: little-endian) holds text: its first four bytes printable ASCII
    (0x20 to 0x7e) and each of the others printable or zero.  In C when built (and NATIVE); else in numpy, each
    byte judged by its own bit 7 after an add that cannot carry into the next byte (its bit 7 cleared first),
    all eight at once."""
    judged = text_words(words) if native else None
    if judged is not None:
        return judged
    low = words & ~_HIGH                                   # each byte below 0x80
    printable = low + np.uint64(0x6060606060606060)        # bit 7: the byte is 0x20 or more
    above = low + np.uint64(0x0101010101010101)            # bit 7: 0x7f or more
    printable &= ~above
    printable &= ~words                                    # and below 0x80 itself
    low += np.uint64(0x7F7F7F7F7F7F7F7F)                   # bit 7: not zero
    low |= words
    zero = np.bitwise_not(low, out=low)                    # bit 7: zero
    printable &= _HIGH
    zero |= printable
    zero &= _HIGH
    return ((printable & np.uint64(0x80808080)) == np.uint64(0x80808080)) & (zero == _HIGH)


def _load_addresses(images: Sequence[tuple[int, int, str]]) -> list[int]:
    """The lowest address of each file among IMAGES."""
    first: dict[str, int] = {}
    for lo, _, name in images:
        first[name] = min(lo, first.get(name, lo))
    return sorted(first.values())
