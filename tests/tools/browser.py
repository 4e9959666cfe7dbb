"""A real headless browser for the tests of heapwalk's HTML pages: Debian's chromium, driven through the
DevTools protocol over a pipe (--remote-debugging-pipe: JSON messages ended by NUL on file descriptors 3 and
4), so no web driver or client library is needed.  `Browser.open(path)` loads a page; `evaluate` runs an
expression in it; `screenshot` returns a PNG of the whole page at a given window width; `pdf` prints it."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import zlib
from html.parser import HTMLParser
from pathlib import Path

__all__ = ["Browser", "CHROMIUM", "png_pixels", "heap_groups", "chunks_per_arena", "cut_off"]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--disable-extensions", "--disable-dev-shm-usage", "--remote-debugging-pipe"]


class BrowserError(RuntimeError):
    pass


class Browser:
    """One chromium process with one page; use as a context manager."""

    def __init__(self, timeout: float = 60.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="heapwalk-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # the child's fd 3 reads our commands, its fd 4 writes the replies
        os.set_inheritable(to_child_r, True)
        os.set_inheritable(from_child_w, True)

        def fds() -> None:
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)
        self.proc = subprocess.Popen([CHROMIUM, *_FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=fds, close_fds=False)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next = 0
        self.events: list[dict] = []
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._call("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def _message(self) -> dict:
        """The next message chromium sends, waiting up to the timeout."""
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise BrowserError("chromium did not answer in time")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium closed its pipe (exit status {self.proc.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._message()
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def call(self, method: str, params: dict | None = None) -> dict:
        """A DevTools command sent to the page."""
        return self._call(method, params, self.session)

    def _wait_event(self, method: str) -> dict:
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._message())

    def open(self, path: Path, width: int = 1200, height: int = 900) -> None:
        """Loads the file PATH in a window WIDTH x HEIGHT pixels, and waits for its load event."""
        self.resize(width, height)
        self.events.clear()
        self.call("Page.navigate", {"url": Path(path).resolve().as_uri()})
        self._wait_event("Page.loadEventFired")

    def resize(self, width: int, height: int = 900) -> None:
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                           "deviceScaleFactor": 1, "mobile": False})

    def evaluate(self, expression: str):
        """The value of a JavaScript EXPRESSION in the page (JSON-serialisable)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, clip: tuple[int, int, int, int] | None = None) -> bytes:
        """A PNG of the whole page (beyond the window's height), or of CLIP (x, y, width, height) of it."""
        params: dict = {"format": "png", "captureBeyondViewport": True}
        if clip:
            params["clip"] = dict(zip(("x", "y", "width", "height"), clip), scale=1)
        data = self.call("Page.captureScreenshot", params)["data"]
        return base64.b64decode(data)

    def pdf(self) -> bytes:
        """The page printed to PDF (A4), as a printer would get it."""
        data = self.call("Page.printToPDF", {"paperWidth": 8.27, "paperHeight": 11.69})["data"]
        return base64.b64decode(data)


def png_pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit truecolour PNG such as chromium's screenshots."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    at, idat, header = 8, b"", None
    while at < len(png):
        length = int.from_bytes(png[at:at + 4], "big")
        kind, body = png[at + 4:at + 8], png[at + 8:at + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        at += 12 + length
    width, height = int.from_bytes(header[0:4], "big"), int.from_bytes(header[4:8], "big")
    depth, colour = header[8], header[9]
    assert depth == 8 and colour in (2, 6), f"unexpected PNG format {depth}/{colour}"
    step = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * step
    rows, prev = [], bytes(stride)
    for y in range(height):
        line = raw[y * (stride + 1):(y + 1) * (stride + 1)]
        rows.append(prev := _unfilter(line[0], bytearray(line[1:]), prev, step))
    return width, height, rows


def _unfilter(kind: int, line: bytearray, prev: bytes, step: int) -> bytes:
    for i in range(len(line)):
        left = line[i - step] if i >= step else 0
        up = prev[i]
        corner = prev[i - step] if i >= step else 0
        if kind == 1:
            line[i] = (line[i] + left) & 255
        elif kind == 2:
            line[i] = (line[i] + up) & 255
        elif kind == 3:
            line[i] = (line[i] + (left + up) // 2) & 255
        elif kind == 4:
            p = left + up - corner
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
            line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
    return bytes(line)


class _Groups(HTMLParser):
    """Collects the heap maps' groups of a page: each <g class="heap"> with its attributes and its
    rectangles' attributes."""

    def __init__(self):
        super().__init__()
        self.groups: list[dict] = []
        self._open = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "g" and a.get("class") == "heap":
            self.groups.append({**a, "rects": []})
            self._open = True
        elif tag == "rect" and self._open:
            self.groups[-1]["rects"].append(a)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag):
        if tag == "g":
            self._open = False


def heap_groups(html: str) -> list[dict]:
    """The heap maps' groups in the text of a page (or an SVG): attributes, and "rects" (each's attributes)."""
    parser = _Groups()
    parser.feed(html)
    return parser.groups


def chunks_per_arena(groups: list[dict]) -> dict[int, dict[str, int]]:
    """Arena number -> chunks per kind, from the groups' data-chunks."""
    out: dict[int, dict[str, int]] = {}
    for g in groups:
        arena = out.setdefault(int(g["data-arena"]), {})
        for pair in g["data-chunks"].split():
            kind, n = pair.split("=")
            arena[kind] = arena.get(kind, 0) + int(n)
    return out


#: what of the page a reader cannot see at the window's width: an element past the window's edge and in no box
#: that scrolls; text clipped inside its own box; and, for each box that scrolls, whether it hides part of its
#: table (its first header's text and its widths)
_CUT = """(() => {
  const vw = document.documentElement.clientWidth, out = {cut: [], hidden: []};
  const scrolls = el => { for (let p = el.parentElement; p && p !== document.body; p = p.parentElement)
                            if (/(auto|scroll)/.test(getComputedStyle(p).overflowX)) return true;
                          return false; };
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (!r.width && !r.height) continue;
    const name = el.tagName + ' "' + (el.textContent || '').trim().slice(0, 40) + '"';
    if ((r.right > vw + 0.5 || r.left < -0.5) && !scrolls(el)) out.cut.push(name);
    const s = getComputedStyle(el);
    if (['hidden', 'clip'].includes(s.overflowX) && el.tagName !== 'svg' && el.scrollWidth > el.clientWidth + 1)
      out.cut.push('clipped ' + name);
  }
  for (const box of document.querySelectorAll('.scroll'))
    if (box.scrollWidth > box.clientWidth + 1)
      out.hidden.push(((box.querySelector('th') || box).textContent || '').trim().slice(0, 30) + ' ' +
                      box.clientWidth + ' < ' + box.scrollWidth);
  return out;
})()"""


def cut_off(browser: Browser, width: int) -> dict:
    """What the page open in BROWSER hides at WIDTH pixels: {"cut": elements past the window's edge outside any
    box that scrolls, or clipped; "hidden": the boxes that scroll and hide part of their table}."""
    browser.resize(width)
    return browser.evaluate(_CUT)
