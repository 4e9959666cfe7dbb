"""The command line shows what heapwalk in gdb relays to a user at a terminal (`common.relay`), on its standard
error as the lines come: a cost said on a line of its own, a progress line written over the last one and wiped
when the work ends."""

from __future__ import annotations

import io

from heapwalk.cli.gdbmi import Gdb
from heapwalk.common.relay import PROGRESS, SAY


def test_progress_lines_are_written_over_each_other_and_wiped_and_sayings_keep_their_line(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    gdb = Gdb.__new__(Gdb)           # no gdb behind it: only the relay is shown
    gdb._shown = ""
    gdb._relayed(f"{SAY}|heapwalk: 13.0 GiB of memory may hold chunks: expect about 30 s")
    gdb._relayed(f"{PROGRESS}|walking chunks|{1 << 30}|{4 << 30}")
    first = gdb._shown
    gdb._relayed(f"{PROGRESS}|walking chunks|{2 << 30}|{4 << 30}")
    assert first == "walking chunks: 1.0 of 4.0 GiB (25%)" and gdb._shown == "walking chunks: 2.0 of 4.0 GiB (50%)"
    gdb._relayed(f"{PROGRESS}|walking chunks|end|0")
    assert gdb._shown == ""
    text = err.getvalue()
    assert text.startswith("heapwalk: 13.0 GiB of memory may hold chunks: expect about 30 s\n")
    second = "walking chunks: 2.0 of 4.0 GiB (50%)"
    assert text.endswith("\n" + first + "\r" + " " * len(first) + "\r" + second + "\r" + " " * len(second) + "\r")
