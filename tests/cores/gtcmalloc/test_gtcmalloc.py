"""Google's tcmalloc, as production links it into a program: cores/tcmalloc/rust_gtc, a stripped Rust program on
the tcmalloc-better crate (Google's sources, built by cargo from the registry), run with its per-CPU caches on
(GLIBC_TUNABLES=glibc.pthread.rseq=0: glibc then leaves rseq to tcmalloc) and off (glibc's default: each thread on
a thread cache).  At its snapshot it wrote tcmalloc's numeric properties (MallocExtension's); 'heapwalk capture'
from the host and gdb attached live, symbols hidden, must give each of them exactly, find tcmalloc's state
consistent, and say which caches it runs on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import harness
import tcbuilds
from conftest import GTC_MODES, NO_SYMBOLS, SYSROOTS, run_gdb

pytestmark = pytest.mark.cores

CLI = Path(sys.executable).with_name("heapwalk")
@pytest.fixture(params=list(GTC_MODES))
def stopped(tmp_path, request):
    """rust_gtc run to its snapshot in one mode: (process, the properties it wrote, the mode)."""
    program = tcbuilds.prepare_google(SYSROOTS)
    run = tmp_path / "run"
    proc = harness.run_to_snapshot(program, run, env=GTC_MODES[request.param])
    try:
        yield proc, json.loads((run / "stats.json").read_text())["properties"], request.param
    finally:
        proc.kill()
        proc.wait()


def _figures(doc: dict, want: dict, mode: str, pid: int) -> None:
    """DOC (a report's JSON) holds every property WANT printed, each equal, and the caches of MODE: every CPU's
    slab, or a thread cache for each thread of process PID."""
    got = doc["gtcmalloc"]["properties"]
    assert len(got) == 13 and got == {k: want[k] for k in got}
    assert doc["gtcmalloc"]["per_cpu_caches_active"] is (mode == "per-cpu")
    if mode == "per-cpu":
        assert doc["gtcmalloc"]["cpus"]["count"] == os.cpu_count() and doc["gtcmalloc"]["cpus"]["slabs"]
    else:
        lwps = {int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()}
        assert lwps <= {t["lwp"] for t in doc["gtcmalloc"]["threads"]}
    row = doc["report"]["arenas"][0]
    assert row["in_use"] == want["generic.current_allocated_bytes"] and row["system"] == want["generic.heap_size"]


def test_a_capture_and_gdb_attached_give_every_figure_tcmalloc_printed(stopped, tmp_path):
    """The capture's report and gdb's, symbols hidden: every property, the caches of the mode, the check clean;
    its page heaps one owner of the RSS, the whole of what tcmalloc took from the system, its metadata another;
    the process goes on as before once continued."""
    proc, want, mode = stopped
    result = subprocess.run([str(CLI), "capture", str(proc.pid), "--out", str(tmp_path / "out"), "--no-symbols"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    said = " ".join(result.stdout.split())
    assert "Google's tcmalloc (" in said and "is Google's" not in said
    assert ("per-CPU caches on" if mode == "per-cpu" else "Its per-CPU caches are off") in said
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    _figures(doc, want, mode, proc.pid)
    rows = {r["name"]: r for r in doc["report"]["rss_by_owner"]["rows"]}      # its page heaps' mappings: all it took
    pages = rows["Google's tcmalloc: page heaps"]
    assert pages["mapped"] == want["generic.heap_size"] + want["tcmalloc.page_heap_unmapped"] and pages["bytes"] > 0
    assert rows["Google's tcmalloc: metadata"]["bytes"] > 0
    live = run_gdb(["-p", str(proc.pid)], [f"heapwalk report --no-leaks --json {tmp_path / 'live.json'}",
                                           "heapwalk check"], iex=[NO_SYMBOLS])
    assert live.returncode == 0, live.stdout + live.stderr
    assert "Google's tcmalloc consistent: checked" in live.stdout
    _figures(json.loads((tmp_path / "live.json").read_text()), want, mode, proc.pid)
    os.kill(proc.pid, signal.SIGCONT)
    assert proc.wait(timeout=60) == 0
