"""heapwalk on a live (stopped) process gives exactly what it gives on that process's core."""

from __future__ import annotations

import pytest

import harness
from conftest import BINDIR, glibc, heapwalk_json, run_gdb

pytestmark = pytest.mark.live


def _state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("g,name,symbols", [
    ("system", "bins", True), ("system", "thread_arenas", True), ("system", "second_heap", True),
    ("sid", "thread_arenas", False), ("bullseye", "many_arenas", False),
])
def test_live_attach_equals_the_core_of_the_same_process(g, name, symbols, tmp_path):
    settings = glibc(g).gdb_settings(symbols)
    cap = harness.capture(name, tmp_path / "captures", BINDIR, keep=True, sysroot=glibc(g).sysroot)
    try:
        live = heapwalk_json(["-p", str(cap.pid)], tmp_path, iex=settings)
        assert _state_of(cap.pid) == "T", "the process is left stopped, as it was"
        core = heapwalk_json([str(cap.exe), str(cap.core)], tmp_path, iex=settings)
    finally:
        cap.kill()
    assert live["target"].startswith("process ") and core["target"].startswith("core file ")
    del live["target"], core["target"]
    # which pages are resident: the live process's page map says; gcore's core cannot, and heapwalk counts
    # its all-zero pages as not resident, so it can only say less
    for a, c in zip(live["arenas"], core["arenas"]):
        for name in ("madvise_resident", "systrim_resident", "resident"):
            assert a["trim"][name] >= c["trim"].pop(name)
            a["trim"].pop(name)
    # a live process's threads have their names (gdb reads them); gcore's core holds none
    assert all(t.pop("name") for t in live["threads"]) and not any(t.pop("name") for t in core["threads"])
    assert live == core


def _writable_memory(pid: int) -> dict[tuple[int, int], bytes]:
    """Every private writable mapping of PID (heaps, arenas, libc's data, stacks), read from /proc/PID/mem."""
    out = {}
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if not fields[1].startswith("rw") or (len(fields) > 5 and fields[5].startswith("[v")):
                continue
            data = bytearray()
            for page in range(start, end, 1 << 20):
                try:
                    mem.seek(page)
                    data += mem.read(min(1 << 20, end - page))
                except OSError:
                    data += b"?"  # unreadable (a guard page): the same before and after
            out[(start, end)] = bytes(data)
    return out


_SELECT_LAST_THREAD_FRAME_1 = ("python max(gdb.selected_inferior().threads(), key=lambda t: t.num).switch(); "
                               "gdb.execute('frame 1', to_string=True)")
_SHOW_SELECTION = ("python print('selection thread %d frame %d pc %#x' % (gdb.selected_thread().num, "
                   "gdb.selected_frame().level(), gdb.selected_frame().pc()))")


@pytest.mark.parametrize("g,name", [("system", "thread_arenas"), ("sid", "mmapped")])
def test_report_and_check_leave_a_live_process_untouched(g, name, tmp_path):
    """Read-only: every writable byte of the process (heaps, arenas, mp_, tcache, stacks) is the same before
    and after a full heapwalk report and check on the live process; gdb's permissions are restored, and the
    thread and frame the user selected are selected again."""
    cap = harness.capture(name, tmp_path / "captures", BINDIR, keep=True, sysroot=glibc(g).sysroot)
    try:
        before = _writable_memory(cap.pid)
        result = run_gdb(["-p", str(cap.pid)], [_SELECT_LAST_THREAD_FRAME_1, _SHOW_SELECTION,
                                                "heapwalk report", "heapwalk check", "heapwalk chunks --limit 0",
                                                "heapwalk threads", "show may-write-memory",
                                                "show may-call-functions", _SHOW_SELECTION],
                         iex=glibc(g).gdb_settings(False))
        after = _writable_memory(cap.pid)
        assert _state_of(cap.pid) == "T"
    finally:
        cap.kill()
    assert "heap consistent" in result.stdout and "Traceback" not in result.stdout + result.stderr
    assert "Permission to write into target memory is on" in result.stdout
    assert "Permission to call functions in the program is on" in result.stdout
    before_sel, after_sel = [line for line in result.stdout.splitlines() if line.startswith("selection ")]
    assert before_sel == after_sel and " frame 1 " in before_sel, result.stdout
    # the kernel may grow a stack mapping downwards when a debugger reads near it: compare by the end address,
    # over what both readings hold (every byte that existed before)
    before_by_end = {end: data for (_, end), data in before.items()}
    after_by_end = {end: data for (_, end), data in after.items()}
    assert before_by_end.keys() == after_by_end.keys()
    changed = [hex(end) for end, data in before_by_end.items() if after_by_end[end][-len(data):] != data]
    assert not changed, f"mappings changed: {changed}"
