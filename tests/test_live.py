"""heapwalk on a live (stopped) process gives exactly what it gives on that process's core."""

from __future__ import annotations

import pytest

import harness
from conftest import BINDIR, heapwalk_json

pytestmark = pytest.mark.live


def _state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("name", ["bins", "thread_arenas", "second_heap"])
def test_live_attach_equals_the_core_of_the_same_process(name, tmp_path):
    cap = harness.capture(name, tmp_path / "captures", BINDIR, keep=True)
    try:
        live = heapwalk_json(["-p", str(cap.pid)], tmp_path)
        assert _state_of(cap.pid) == "T", "the process is left stopped, as it was"
        core = heapwalk_json([str(cap.exe), str(cap.core)], tmp_path)
    finally:
        cap.kill()
    assert live["target"].startswith("process ") and core["target"].startswith("core file ")
    del live["target"], core["target"]
    assert live == core
