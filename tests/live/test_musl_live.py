"""musl's malloc in a live process (cores/musl/musl_hold.c on trixie's musl 1.2.5, linked dynamically and
statically stripped, stopped at its snapshot): gdb attached gives the ledger's allocations and bytes and a sound
check, and leaves the process stopped; `heapwalk capture` writes a core whose report is the same, the resident
bytes of the groups from the page map it recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import harness
import muslbuilds
from conftest import BINDIR, SYSROOTS, run_gdb
from services import process_state

pytestmark = pytest.mark.live

HEAPWALK = Path(sys.executable).parent / "heapwalk"


@pytest.fixture(params=["dynamic", "stripped"])
def stopped(request, tmp_path):
    """musl_hold at its snapshot, stopped: (its pid, its ledger: address -> size)."""
    musl = muslbuilds.prepare_musl(SYSROOTS, "trixie")
    exe = muslbuilds.build("musl_hold", BINDIR, musl, request.param)
    proc = harness.run_to_snapshot(exe, tmp_path / "run")
    try:
        ledger = {a: s for a, s in json.loads((tmp_path / "run" / "ledger.json").read_text())["live"]}
        yield proc.pid, ledger
    finally:
        proc.kill()
        proc.wait()


def _musl(doc: dict) -> dict:
    return doc["musl"]


def test_gdb_attached_gives_the_ledger_and_leaves_the_process_stopped(stopped, tmp_path):
    pid, ledger = stopped
    out = tmp_path / "live.json"
    result = run_gdb(["-p", str(pid)], [f"heapwalk report --no-leaks --json {out}", "heapwalk check"])
    said = " ".join((result.stdout + result.stderr).split())
    assert "musl's malloc consistent" in said and "Traceback" not in said, said
    assert _musl(json.loads(out.read_text()))["in_use"] == {"allocations": len(ledger),
                                                            "requested": sum(ledger.values())}
    assert process_state(pid) == "T"


def test_a_capture_reports_what_the_live_attach_does_with_the_resident_bytes(stopped, tmp_path):
    pid, ledger = stopped
    out = tmp_path / "cap" / "report.json"
    result = subprocess.run([str(HEAPWALK), "capture", str(pid), "--out", str(tmp_path / "cap"), "--no-leaks"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    assert _musl(doc)["in_use"]["requested"] == sum(ledger.values())
    arena = doc["report"]["arenas"][0]
    # every byte the program asked for was written (memset): resident, and no more than the groups hold
    assert _musl(doc)["in_use"]["requested"] - _musl(doc)["large"]["requested"] <= arena["rss"] <= \
        arena["system"]
    assert process_state(pid) == "T"
