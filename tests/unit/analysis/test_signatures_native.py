"""The signatures' C pass against numpy's: words in images, at their edges, in the gaps between them (where the C
pass answers without a search), load addresses, text, and no images at all."""

from __future__ import annotations

import numpy as np
import pytest

from heapwalk.analysis import signed

IMAGES = [(0x5555_0000_0000, 0x5555_0001_0000, "prog"), (0x5555_0000_8000, 0x5555_0000_9000, "prog"),
          (0x7F00_0000_0000, 0x7F00_0010_0000, "libc"), (0x7F00_0020_0000, 0x7F00_0030_0000, "libm"),
          (0x7FFF_F000_0000, 0x7FFF_F000_1000, "vdso")]


def _words(images) -> np.ndarray:
    rng = np.random.default_rng(76)
    edges = [x + d for lo, hi, _ in images for x in (lo, hi) for d in (-8, -1, 0, 1, 8)]
    inside = [lo + int(rng.integers(0, hi - lo)) for lo, hi, _ in images for _ in range(50)]
    text = [int.from_bytes(t, "little") for t in (b"GET /ind", b"abcd\0\0\0\0", b"abc\0\0\0\0\0", b"\x7fabcdefg")]
    heap = rng.integers(0x7E00_0000_0000, 0x7E10_0000_0000, size=2000, dtype=np.uint64).tolist()
    anywhere = rng.integers(0, 2 ** 64 - 1, size=2000, dtype=np.uint64, endpoint=True).tolist()
    return np.array(edges + inside + text + heap + anywhere + [0, 2 ** 64 - 1, 2 ** 63], dtype=np.uint64)


@pytest.mark.parametrize("images", [IMAGES, IMAGES[2:3], []], ids=["several", "one", "none"])
def test_c_as_numpy(images, monkeypatch):
    words = _words(IMAGES)
    native = signed.signatures(words, images)             # in C where built (`pip install`), else numpy's too
    monkeypatch.setattr(signed, "signature_words", lambda *args: None)
    assert native.tolist() == signed.signatures(words, images).tolist()
    named = np.count_nonzero(native > 1)
    assert named >= 50 * len(images) - 5 and (named == 0) == (not images)
