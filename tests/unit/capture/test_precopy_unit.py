"""The capture's pre-copy (`heapwalk.capture.precopy`) without a process: which copies it keeps, which the final
stop forgets (soft-dirty, freed, or not the process's page alone), how the core writer takes the rest from
them, and the lines a capture prints.  The real thing, under a kernel that tracks soft-dirty pages:
tests/vm/test_precopy.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from heapwalk.capture import corewriter, precopy
from heapwalk.cli.capture import _pause_line
from heapwalk.capture.corewriter import PAGE, CoreSummary, PendingCore, Segment
from heapwalk.capture.precopy import NOT_COPIED, SOFT_DIRTY, ZEROS, Copies, _near_runs, _offset_pieces
from heapwalk.inferior.pages import MapsLine

BASE = 0x7F0000000000
PRESENT, SWAPPED, EXCLUSIVE = 1 << 63, 1 << 62, 1 << 56
OWN = PRESENT | EXCLUSIVE


def _page(byte: int) -> bytes:
    return bytes([byte]) * PAGE


def _copies(tmp_path, pages: list[bytes]) -> Copies:
    copies = Copies(os.open(tmp_path / "scratch", os.O_RDWR | os.O_CREAT, 0o600))
    offsets = copies.add(BASE, BASE + len(pages) * PAGE)
    copies.store(offsets, 0, memoryview(b"".join(pages)))
    copies.sort()
    return copies


def test_pages_of_zeros_are_not_stored_the_others_are_appended_in_order(tmp_path):
    copies = _copies(tmp_path, [_page(1), bytes(PAGE), _page(2), _page(3)])
    offsets = copies.runs[0][2]
    assert offsets.tolist() == [0, ZEROS, PAGE, 2 * PAGE]
    assert os.pread(copies.fd, 3 * PAGE, 0) == _page(1) + _page(2) + _page(3)
    # a copy taken again goes to the end; the old bytes are left behind
    copies.store(offsets, 0, memoryview(_page(9)))
    assert offsets[0] == 3 * PAGE and os.pread(copies.fd, PAGE, 3 * PAGE) == _page(9)


def test_the_stop_forgets_written_freed_and_shared_pages(tmp_path):
    copies = _copies(tmp_path, [_page(1)] * 6)
    entries = np.array([OWN, OWN | SOFT_DIRTY, 0, PRESENT, SWAPPED, SWAPPED | SOFT_DIRTY], dtype=np.uint64)
    again = copies.forget(lambda lo, hi: entries[(lo - BASE) // PAGE:(hi - BASE) // PAGE])
    # kept: a page of its own not written, a swapped-out page not written; forgotten: written, freed (not
    # there), present but not its alone (the zero page after a free and a read), swapped out after a write
    assert (copies.runs[0][2] != NOT_COPIED).tolist() == [True, False, False, False, True, False]
    assert again == 3 * PAGE          # the written one, the shared one, the swapped-out written one: there


def test_pieces_say_what_comes_from_the_copies_and_what_is_read(tmp_path):
    copies = _copies(tmp_path, [_page(1), _page(2), bytes(PAGE), bytes(PAGE), _page(5)])
    copies.runs[0][2][1] = NOT_COPIED
    assert copies.pieces(BASE - 2 * PAGE, BASE + 6 * PAGE) == [
        (BASE - 2 * PAGE, BASE, None),                 # before the run: read
        (BASE, BASE + PAGE, 0),                        # a copy
        (BASE + PAGE, BASE + 2 * PAGE, None),          # forgotten: read
        (BASE + 2 * PAGE, BASE + 4 * PAGE, ZEROS),     # copies of zeros, joined
        (BASE + 4 * PAGE, BASE + 5 * PAGE, 2 * PAGE),  # a copy
        (BASE + 5 * PAGE, BASE + 6 * PAGE, None)]      # after it: read


def test_copies_at_consecutive_offsets_are_one_piece():
    offsets = np.array([0, PAGE, 2 * PAGE, 7 * PAGE, ZEROS, NOT_COPIED, NOT_COPIED], dtype=np.int64)
    assert _offset_pieces(offsets, BASE) == [
        (BASE, BASE + 3 * PAGE, 0), (BASE + 3 * PAGE, BASE + 4 * PAGE, 7 * PAGE),
        (BASE + 4 * PAGE, BASE + 5 * PAGE, ZEROS), (BASE + 5 * PAGE, BASE + 7 * PAGE, None)]


def test_written_runs_close_together_are_read_again_in_one_read():
    assert _near_runs([(0, 10), (12, 20), (100, 110)], 5) == [(0, 20), (100, 110)]


class _Precopy:
    """What the core writer asks of a `precopy.Precopy`: its pieces and its scratch file."""

    def __init__(self, copies: Copies):
        self.copies = copies

    def pieces(self, lo, hi):
        return self.copies.pieces(lo, hi)


def test_the_core_takes_the_copies_after_the_stop_and_reads_only_the_rest(tmp_path):
    copies = _copies(tmp_path, [_page(1), _page(2), bytes(PAGE), _page(4)])
    copies.runs[0][2][1] = NOT_COPIED           # written since: read at the stop
    mapping = MapsLine(BASE, BASE + 4 * PAGE, "rw-p", 0, "00:00", 0, "")
    segment = Segment(BASE, BASE + 4 * PAGE, 6, 4 * PAGE, ((BASE, BASE + 4 * PAGE, "mem"),), mapping)
    out = os.open(tmp_path / "core", os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(out, PAGE + 4 * PAGE)
    pending = PendingCore(out, None, PAGE + 4 * PAGE, 1, lambda unread: b"notes", [], copies)
    to_read = corewriter._without_copies(segment, _Precopy(copies), pending, PAGE)
    assert to_read == ((BASE + PAGE, BASE + 2 * PAGE, "mem"),)
    os.pwrite(out, _page(7), 2 * PAGE)          # what the stop read of the written page
    summary = pending.finish()
    with open(tmp_path / "core", "rb") as f:
        data = f.read()
    assert data[PAGE:5 * PAGE] == _page(1) + _page(7) + bytes(PAGE) + _page(4)
    assert summary.written == 2 * PAGE          # what came from the copies (the stop's own write is its own)
    # the copies taken are let go of: the scratch file and the core never both hold them all
    assert os.fstat(copies.fd).st_blocks * 512 <= PAGE


def test_file_mappings_and_shared_memory_are_never_taken_from_copies():
    for perms, name, inode in (("rw-p", "/usr/lib/libx.so", 5), ("rw-s", "/dev/zero (deleted)", 7),
                               ("r--p", "[vvar]", 0)):
        assert not precopy.copied_kinds(MapsLine(BASE, BASE + PAGE, perms, 0, "fd:01", inode, name))
    assert precopy.copied_kinds(MapsLine(BASE, BASE + PAGE, "rw-p", 0, "00:00", 0, "[heap]"))


def test_a_kernel_without_soft_dirty_bits_is_named():
    reason = precopy.untracked_reason()
    assert reason is None or "soft-dirty" in reason


def test_the_pause_line_says_what_the_stop_read_and_what_came_from_the_copies():
    summary = CoreSummary(300 << 20, 200 << 20, 12)
    stopped_briefly = _pause_line(42, 0.05, summary, {
        "rounds": [{"read": 256 << 20, "seconds": 0.2, "stopped_before": 0.0},
                   {"read": 8 << 20, "seconds": 0.01, "stopped_before": 0.02}],
        "written_meanwhile": 1 << 20, "from_copies": 190 << 20}, False)
    assert stopped_briefly == ("heapwalk: process 42 was stopped for 0.05 s to read 10 MiB, what it wrote while "
                               "heapwalk copied its memory as it ran (190 MiB of the core from those copies; 1 stop "
                               "of 0.02 s before); it is running again\n")
    saved_little = _pause_line(42, 1.0, summary, {"rounds": [{"read": 256 << 20, "seconds": 0.2,
                                                              "stopped_before": 0.0}],
                                                  "written_meanwhile": 150 << 20, "from_copies": 60 << 20}, False)
    assert saved_little.splitlines()[1] == ("heapwalk: the copy made while it ran saved little: it wrote most of its "
                                            "memory again meanwhile (--stop-the-world stops it once, for the whole "
                                            "read)")
    whole = _pause_line(42, 1.5, summary, None, False)
    assert "stopped for 1.50 s while heapwalk read its memory (200 MiB that is not zeros" in whole
    found_stopped = _pause_line(42, 1.5, summary, None, True)         # a process stopped before stays stopped
    assert found_stopped.endswith("; it was stopped before the capture and is left stopped\n")


def test_stop_the_world_asks_for_no_copy():
    from heapwalk.cli.capture import _precopied
    assert _precopied(os.getpid(), Path("/nonexistent/core"), True) == (None, "")


def test_the_benchmark_prints_both_pauses_and_the_machine_s_speed():
    import bench_precopy
    line = bench_precopy.precopy_lines({"busy": {
        "mib": 8192, "rate": 1, "kernel": "6.1.0-50-amd64", "pause": 0.5, "stop_the_world_pause": 80.0,
        "from_copies": 8000 << 20, "written": 8100 << 20, "finish_seconds": 30.0,
        "rounds": [{"read": 8192 << 20, "seconds": 200.0}, {"read": 64 << 20, "seconds": 2.0}]}})
    assert line == ("pre-copy, 8,192 MiB process busy, writing 1 MiB/s (kernel 6.1.0-50-amd64 in qemu, reading 41 "
                    "MiB/s): pause 0.50 s, without pre-copy 80.00 s; 8,000 of 8,100 MiB from the copies, 2 reads "
                    "while it ran (202.0 s), the core finished in 30.0 s after")
