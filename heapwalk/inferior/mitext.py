"""The text of a gdb command captured with ``gdb.execute(..., to_string=True)``, whatever interpreter gdb runs.

Under gdb/MI (as the heapwalk command line drives gdb, through pygdbmi), gdb 18 returns a command's output as
MI stream records (``~"Local core dump file:\\n"``) instead of the text the console shows; gdb 10 to 17 return
the text.  `console_text` gives the text in both cases, so the parsers of 'info target', 'info files' and
'info proc mappings' read the same lines everywhere.  Pure Python, no gdb.
"""

from __future__ import annotations

import re

__all__ = ["console_text", "c_string"]

_STREAM = re.compile(r'^([~@&])"(.*)"$')
_OTHER_MI = re.compile(r"^([\^*+=].*|\(gdb\)\s*)$")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f",
            "v": "\v", "e": "\x1b"}


def c_string(body: str) -> str:
    """The text of an MI C-string's BODY (what lies between its quotes): backslash escapes and octal bytes
    (gdb writes the bytes of UTF-8 text as octal escapes) decoded."""
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\" or i + 1 == len(body):
            out += ch.encode()
            i += 1
            continue
        nxt = body[i + 1]
        octal = re.match(r"[0-7]{1,3}", body[i + 1:])
        if octal:
            out.append(int(octal.group(0), 8) & 0xFF)
            i += 1 + len(octal.group(0))
        else:
            out += _ESCAPES.get(nxt, nxt).encode()
            i += 2
    return out.decode(errors="replace")


def console_text(captured: str) -> str:
    """The console text of CAPTURED: itself when it is text; the console stream records' strings joined when
    it is MI output (every line a stream record or another MI record)."""
    lines = [line for line in captured.splitlines() if line.strip()]
    if not lines or not any(_STREAM.match(line) for line in lines):
        return captured
    if not all(_STREAM.match(line) or _OTHER_MI.match(line) for line in lines):
        return captured
    return "".join(c_string(m.group(2)) for m in map(_STREAM.match, lines) if m and m.group(1) == "~")
