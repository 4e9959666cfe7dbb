"""gperftools' tcmalloc on a real process, symbols hidden: cores/tc_hold.c on Debian's libtcmalloc-minimal4
(LD_PRELOAD) writes every MallocExtension numeric property at its snapshot; 'heapwalk capture' of it, and gdb
attached to it, give each of them; the spans its page map names are all the heap it took from the system, one
owner of the RSS; and the verdict says where the free memory is and what a release gives back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from conftest import NO_SYMBOLS, ROOT, run_gdb

pytestmark = pytest.mark.cores

CLI = Path(sys.executable).with_name("heapwalk")
LIBRARY = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")


@pytest.fixture
def stopped(tmp_path, request):
    """cores/tc_hold.c built and run on Debian's tcmalloc to its snapshot (with the environment the test's
    parameter gives, if any): (process, its statistics)."""
    exe = tmp_path / "tc_hold"
    subprocess.run(["gcc", "-O1", "-Wall", "-pthread", "-o", str(exe), str(ROOT / "cores" / "tc_hold.c"), "-ldl"],
                   check=True)
    run = tmp_path / "run"
    proc = harness.run_to_snapshot(exe, run, env={"LD_PRELOAD": str(LIBRARY), **getattr(request, "param", {})})
    try:
        yield proc, json.loads((run / "stats.json").read_text())
    finally:
        proc.kill()
        proc.wait()


def _check(doc: dict, stats: dict) -> None:
    tc = doc["tcmalloc"]
    assert tc["version"] == "2.10" and tc["page_size"] == 8192
    want = stats["properties"]
    assert {k: v for k, v in tc["properties"].items() if k in want} == want     # all it printed, each equal
    assert f"{len(tc['threads'])}              Thread heaps in use" in stats["stats"]


def test_a_capture_gives_every_figure_tcmalloc_printed(stopped, tmp_path):
    """The capture's report: every numeric property tcmalloc gave at the snapshot; its spans are one owner of
    the RSS, all of its heap size; the verdict names the page heap's free spans and what releases them."""
    proc, stats = stopped
    result = subprocess.run([str(CLI), "capture", str(proc.pid), "--out", str(tmp_path / "out"), "--no-symbols"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    _check(doc, stats)
    rows = {r["name"]: r for r in doc["report"]["rss_by_owner"]["rows"]}
    spans = rows["tcmalloc: spans"]
    assert spans["mapped"] == doc["tcmalloc"]["pageheap"]["system_bytes"] and spans["bytes"] > 0
    said = " ".join(result.stdout.split())
    assert "The page heap's" in said and "MallocExtension::ReleaseFreeMemory()" in said


@pytest.mark.parametrize("stopped", [{}, {"TCMALLOC_AGGRESSIVE_DECOMMIT": "t"}], indirect=True,
                         ids=["default", "aggressive-decommit"])
def test_gdb_attached_says_the_same(stopped, tmp_path):
    """gdb -p on the stopped process, symbols hidden: the same figures, read live (and with aggressive decommit,
    whose free spans go back to the system at once: unmapped bytes, the setting itself); and check finds its
    spans add up to its heap size, its thread caches' list sound."""
    proc, stats = stopped
    out = tmp_path / "report.json"
    result = run_gdb(["-p", str(proc.pid)], [f"heapwalk report --no-leaks --json {out}", "heapwalk check"],
                     iex=[NO_SYMBOLS])
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    _check(doc, stats)
    assert "tcmalloc: gperftools 2.10" in result.stdout and "tcmalloc consistent: checked" in result.stdout
    if doc["tcmalloc"]["properties"]["tcmalloc.aggressive_memory_decommit"]:
        assert doc["tcmalloc"]["properties"]["tcmalloc.pageheap_unmapped_bytes"] > 0
        assert "TCMALLOC_AGGRESSIVE_DECOMMIT=t (from the next start)" not in result.stdout
