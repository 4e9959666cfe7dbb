"""Heap maps as a PNG ('heapwalk map --png FILE'), for a ticket or a chat where an SVG will not show: the
strips of `heapmaps.svg_maps` painted pixel by pixel (each column a stack of its kinds' colours, damage marked
over its column, the trim and resident bands under each strip) with their labels and a legend, in pure Python
and numpy: a tiny built-in font of capitals, digits and signs, and the PNG written with zlib."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import numpy as np

from heapwalk.analysis.report import human
from heapwalk.common.mapkinds import DAMAGE, MAP_KINDS, drawing_order, of_use
from heapwalk.output.heapmaps import BAND_COLOURS, COLOURS, NAMES, bands, columns, kinds_drawn, marks
from heapwalk.common.view import HeapStrip

__all__ = ["png_maps", "png_bytes"]

#: 3 x 5 glyphs, a string of five rows each ('#' on); letters are drawn as capitals, but for the x of 0x
_GLYPHS = {
    "0": "###/#.#/#.#/#.#/###", "1": ".#./##./.#./.#./###", "2": "###/..#/###/#../###", "3": "###/..#/.##/..#/###",
    "4": "#.#/#.#/###/..#/..#", "5": "###/#../###/..#/###", "6": "###/#../###/#.#/###", "7": "###/..#/.#./.#./.#.",
    "8": "###/#.#/###/#.#/###", "9": "###/#.#/###/..#/###",
    "A": ".#./#.#/###/#.#/#.#", "B": "##./#.#/##./#.#/##.", "C": ".##/#../#../#../.##", "D": "##./#.#/#.#/#.#/##.",
    "E": "###/#../##./#../###", "F": "###/#../##./#../#..", "G": ".##/#../#.#/#.#/.##", "H": "#.#/#.#/###/#.#/#.#",
    "I": "###/.#./.#./.#./###", "J": "..#/..#/..#/#.#/.#.", "K": "#.#/#.#/##./#.#/#.#", "L": "#../#../#../#../###",
    "M": "#.#/###/###/#.#/#.#", "N": "##./#.#/#.#/#.#/#.#", "O": ".#./#.#/#.#/#.#/.#.", "P": "##./#.#/##./#../#..",
    "Q": ".#./#.#/#.#/##./.##", "R": "##./#.#/##./#.#/#.#", "S": ".##/#../.#./..#/##.", "T": "###/.#./.#./.#./.#.",
    "U": "#.#/#.#/#.#/#.#/###", "V": "#.#/#.#/#.#/#.#/.#.", "W": "#.#/#.#/###/###/#.#", "X": "#.#/#.#/.#./#.#/#.#",
    "Y": "#.#/#.#/.#./.#./.#.", "Z": "###/..#/.#./#../###",
    " ": ".../.../.../.../...", "-": ".../.../###/.../...", ".": ".../.../.../.../.#.", ",": ".../.../.../.#./#..",
    ":": ".../.#./.../.#./...", "(": ".#./#../#../#../.#.", ")": ".#./..#/..#/..#/.#.", "/": "..#/..#/.#./#../#..",
    "_": ".../.../.../.../###", "+": ".../.#./###/.#./...", "=": ".../###/.../###/...", "?": "###/..#/.#./.../.#.",
    "x": ".../.../#.#/.#./#.#", "'": ".#./.#./.../.../...", ";": ".../.#./.../.#./#..", "%": "#.#/..#/.#./#../#.#",
}
_FONT = {ch: np.array([[c == "#" for c in row] for row in rows.split("/")], dtype=bool)
         for ch, rows in _GLYPHS.items()}
_SCALE, _LEFT, _ROW, _BAND = 2, 8, 28, 5
#: PNG's filter type 'Up' (a byte the pixel above it less)
_UP = 2
_TEXT = 5 * _SCALE                      # a line of text's height
_STRIP = _TEXT + 6 + _ROW + 2 + 2 * _BAND + 1 + 12   # label, strip, bands, gap


def _rgb(colour: str) -> np.ndarray:
    return np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.uint8)


def _palette(order: np.ndarray) -> np.ndarray:
    """Each kind's colour, in ORDER (of indexes in MAP_KINDS), and white after them (a pixel no kind
    reaches)."""
    return np.array([_rgb(COLOURS[MAP_KINDS[k]]) for k in order.tolist()] + [_rgb("#ffffff")])


def _text(img: np.ndarray, x: int, y: int, text: str, colour: str = "#222222") -> int:
    """Writes TEXT at (X, Y) (its top left) in the built-in font; returns the x after it."""
    ink = _rgb(colour)
    for ch in text:
        ch = ch if ch in _FONT else ch.upper()
        glyph = np.repeat(np.repeat(_FONT.get(ch, _FONT["?"]), _SCALE, 0), _SCALE, 1)
        h, w = glyph.shape
        if x + w > img.shape[1] or y + h > img.shape[0]:
            break
        img[y:y + h, x:x + w][glyph] = ink
        x += w + _SCALE
    return x


def _paint_strip(img: np.ndarray, strip: HeapStrip, width: int, y: int) -> None:
    """One strip's label, its columns (each a stack of its kinds, top down in drawing order), damage marks
    and bands, from row Y."""
    label = f"{strip.label}  {strip.start:#x}-{strip.end:#x}  {human(strip.end - strip.start)}"
    _text(img, _LEFT, y, label + (f" (and {human(strip.beyond)} reserved)" if strip.beyond else ""))
    top = y + _TEXT + 6
    edges, counts = columns(strip, width)
    order = drawing_order()
    damage = counts[:, of_use(DAMAGE)].sum(axis=1)
    counts = counts[:, order]
    xs = _LEFT + np.arange(len(counts) + 1) * width // len(counts)
    repeat = np.diff(xs)
    cuts = np.rint(np.cumsum(counts, axis=1) * _ROW / np.maximum(counts.sum(axis=1, keepdims=True), 1)).astype(int)
    kind_at = (cuts[:, None, :] <= np.arange(_ROW)[None, :, None]).sum(axis=2)   # column x pixel row
    palette = _palette(order)
    img[top:top + _ROW, xs[0]:xs[-1]] = np.repeat(palette[kind_at], repeat, axis=0).transpose(1, 0, 2)
    damaged = np.repeat(damage > 0, repeat)
    if damaged.any():
        wide = damaged.copy()
        wide[1:] |= damaged[:-1]
        wide[:-1] |= damaged[1:]
        right = min(xs[-1] + 1, img.shape[1])
        wide = np.concatenate((wide, damaged[-1:]))[:right - xs[0]]
        img[top:top + _ROW, xs[0]:right][:, wide] = _rgb(COLOURS[MAP_KINDS[of_use(DAMAGE)[0]]])
    trim, resident = marks(strip, edges)
    spans = np.diff(edges.astype(np.int64))
    for row, values, colour in ((top + _ROW + 2, trim, BAND_COLOURS["trim"]),
                                (top + _ROW + 3 + _BAND, resident, BAND_COLOURS["resident"])):
        if values is None:
            continue
        ink = _rgb(colour).astype(float)
        share = 0.3 + 0.7 * values / spans
        shade = (255 - share[:, None] * (255 - ink)).astype(np.uint8)
        shade[values == 0] = 255
        img[row:row + _BAND, xs[0]:xs[-1]] = np.repeat(shade, repeat, axis=0)


def _text_width(text: str) -> int:
    return len(text) * 4 * _SCALE


def _legend_places(entries: list[tuple[str, str]], width: int) -> list[tuple[int, int]]:
    """Where each legend entry starts, (x, line), wrapped at WIDTH."""
    places, x, line = [], _LEFT, 0
    for name, _ in entries:
        size = _TEXT + 4 + _text_width(name) + 14
        if x + size > width + _LEFT and x > _LEFT:
            x, line = _LEFT, line + 1
        places.append((x, line))
        x += size
    return places


def _legend(img: np.ndarray, y: int, entries: list[tuple[str, str]], places: list[tuple[int, int]]) -> None:
    for (name, colour), (x, line) in zip(entries, places):
        top = y + line * (_TEXT + 8)
        img[top:top + _TEXT, x:x + _TEXT] = _rgb(colour)
        _text(img, x + _TEXT + 4, top, name)


def png_maps(strips: Sequence[HeapStrip], width: int = 1024) -> bytes:
    """A PNG of STRIPS, WIDTH columns each (one pixel a column), labelled, with a legend of what is drawn;
    painted and compressed a strip at a time (the picture of a heap of many strips is never whole in memory)."""
    entries = [(NAMES[k], COLOURS[k]) for k in kinds_drawn(strips)]
    if bands(strips):
        entries.append((bands(strips), BAND_COLOURS["trim"]))
    if any(s.resident is not None for s in strips):
        entries.append(("resident", BAND_COLOURS["resident"]))
    places = _legend_places(entries, width)
    legend = ((1 + places[-1][1]) if places else 0) * (_TEXT + 8) + 8
    rows = _Rows(width + 2 * _LEFT, 8 + len(strips) * _STRIP + legend)
    rows.add(_blank(8, width))
    for strip in strips:
        img = _blank(_STRIP, width)
        _paint_strip(img, strip, width, 0)
        rows.add(img)
    img = _blank(legend, width)
    _legend(img, 0, entries, places)
    rows.add(img)
    return rows.png()


def _blank(height: int, width: int) -> np.ndarray:
    """HEIGHT white rows of a picture of WIDTH columns and its margins."""
    return np.full((height, width + 2 * _LEFT, 3), 255, dtype=np.uint8)


class _Rows:
    """A PNG's pixel rows (RGB), filtered and compressed as they come, block by block."""

    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.above = np.zeros(width * 3, dtype=np.uint8)   # (the row above the first: none, all zero)
        self.packer = zlib.compressobj(3)
        self.out: list[bytes] = []

    def add(self, img: np.ndarray) -> None:
        """The next rows, IMG (rows x width x 3, uint8)."""
        rows = img.reshape(len(img), self.width * 3)
        raw = np.empty((len(rows), self.width * 3 + 1), dtype=np.uint8)
        raw[:, 0] = _UP                 # each row as its difference from the row above: a strip's rows repeat
        np.subtract(rows[:1], self.above, out=raw[:1, 1:])
        np.subtract(rows[1:], rows[:-1], out=raw[1:, 1:])
        if len(rows):
            self.above = rows[-1].copy()
        self.out.append(self.packer.compress(raw))

    def png(self) -> bytes:
        """The PNG file of the rows added (as many as its height)."""
        return _png(self.width, self.height, b"".join(self.out) + self.packer.flush())


def png_bytes(img: np.ndarray) -> bytes:
    """An RGB image (height x width x 3, uint8) as the bytes of a PNG file."""
    height, width, _ = img.shape
    rows = _Rows(width, height)
    rows.add(img)
    return rows.png()


def _png(width: int, height: int, packed: bytes) -> bytes:
    """The PNG file of WIDTH x HEIGHT RGB pixels whose filtered rows, compressed, are PACKED."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", packed) + chunk(b"IEND", b""))
