"""heapwalk on a live (stopped) process gives exactly what it gives on that process's core."""

from __future__ import annotations

import pytest

import harness
from conftest import BINDIR, glibc, heapwalk_json

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
    assert live == core
