"""A command this machine has not the memory for is refused before it starts, in one line that says what it
would need, what the machine has and what needs less, with gdb's exit status set; 'set heapwalk memory-check
off' runs it anyway; and the leak scan, weighed again once the blocks are known, is left out of a report that
says so last.  The machine's memory is made small for the test (`sizing.available_memory` patched in gdb); the
bench's smoke core is the heap."""

from __future__ import annotations

import pytest

from conftest import run_gdb
import bench

pytestmark = pytest.mark.cores


def _small(available: int, decode_per_gib: int | None = None) -> list[str]:
    """gdb commands that make this machine's memory AVAILABLE bytes, every heap worth a sentence, and (when
    given) the report's memory DECODE_PER_GIB bytes a GiB of heap."""
    rates = "" if decode_per_gib is None else f"; s.RATES['report'] = (2.5, {decode_per_gib})"
    return [f"python import heapwalk.analysis.sizing as s; s.available_memory = lambda meminfo=None: {available}; "
            f"s.SAID_FROM = 0{rates}"]


@pytest.fixture(scope="module")
def smoke():
    cap = bench.capture("smoke", bench.BUILD / "bin", "random")
    return [str(cap.exe), str(cap.core)]


def test_a_report_this_machine_has_not_the_memory_for_is_refused_before_it_starts(smoke):
    result = run_gdb(smoke, [*_small(1 << 20), "heapwalk report"])
    last = result.stdout.strip().splitlines()[-1] + result.stderr
    assert "of gdb's memory; this machine has 1 MiB available, not enough: 'heapwalk bins'" in last, last
    assert "'set heapwalk memory-check off' (the command line's --no-memory-check) runs it anyway" in last
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr and "arena" not in result.stdout.lower()
    anyway = run_gdb(smoke, [*_small(1 << 20), "set heapwalk memory-check off", "heapwalk report"])
    assert anyway.returncode == 0 and "leak" in anyway.stdout.lower(), anyway.stdout + anyway.stderr


def test_a_leak_scan_this_machine_has_not_the_memory_for_is_left_out_and_said_last(smoke):
    result = run_gdb(smoke, [*_small(4 << 20, 1), "heapwalk report"])
    said = result.stderr.strip().splitlines()[-1]                                # gdb's error: the last word
    assert said.startswith("heapwalk report: the report is partial: the leak scan of ") and "it was not made" in said, \
        result.stderr
    assert result.returncode == 1 and "malloc_trim" in result.stdout            # the rest of the report is there
    leaks = run_gdb(smoke, [*_small(4 << 20, 1), "heapwalk leaks"])
    assert "the leak scan of " in leaks.stdout + leaks.stderr and leaks.returncode == 1


def test_the_costs_and_the_progress_reach_the_command_line_on_gdbs_error_stream_only_when_asked(smoke):
    """What the command line shows a user at a terminal as it comes (`common.relay`): the cost said before the
    decode, the walk's and the scan's progress, each ended; nothing of it without HEAPWALK_RELAY."""
    quick = ["python import heapwalk.analysis.sizing as s; s.SAID_FROM = 0",
             "python import heapwalk.gdb.console as c; c._PROGRESS_AFTER = 0.0; c._RELAY_EVERY = 0.0"]
    relayed = run_gdb(smoke, [*quick, "heapwalk report"], env={"HEAPWALK_RELAY": "1"})
    lines = relayed.stderr.splitlines()
    assert any(line.startswith("heapwalk-say|heapwalk: ") and "may hold chunks: expect about" in line for line in lines)
    for label in ("walking chunks", "scanning for leaks"):
        steps = [line.split("|") for line in lines if line.startswith(f"heapwalk-progress|{label}|")]
        assert len(steps) > 1 and steps[-1][2:] == ["end", "0"], (label, steps[-3:])
        done = [int(d) for _, _, d, _ in steps[:-1]]
        assert done == sorted(done) and 0 < done[-1] <= int(steps[0][3])
    assert "heapwalk-" not in relayed.stdout
    plain = run_gdb(smoke, [*quick, "heapwalk report"])
    assert "heapwalk-progress" not in plain.stdout + plain.stderr and "heapwalk-say" not in plain.stdout + plain.stderr
    assert "may hold chunks" not in plain.stdout             # not a terminal: nothing said
