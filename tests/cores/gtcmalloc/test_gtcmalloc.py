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
from browser import heap_groups
from conftest import GTC_MODES, NO_SYMBOLS, SYSROOTS, run_gdb
from heapwalk.gtcmalloc.allocator import NOT_GIVEN

pytestmark = pytest.mark.cores

CLI = Path(sys.executable).with_name("heapwalk")
@pytest.fixture(params=list(GTC_MODES))
def stopped(tmp_path, request):
    """rust_gtc run to its snapshot in one mode: (process, the properties it wrote, the mode, the blocks it
    leaked)."""
    program = tcbuilds.prepare_google(SYSROOTS)
    run = tmp_path / "run"
    proc = harness.run_to_snapshot(program, run, env=GTC_MODES[request.param])
    try:
        yield proc, json.loads((run / "stats.json").read_text())["properties"], request.param, _ledger(run)
    finally:
        proc.kill()
        proc.wait()


def _drawn(html: str) -> dict[str, int]:
    """The bytes of each kind of run the page's maps of Google's tcmalloc's page heaps draw."""
    sums: dict[str, int] = {}
    for group in heap_groups(html):
        if group.get("data-label", "").startswith("Google's tcmalloc"):
            for r in group["rects"]:
                if r.get("data-kind") and "data-bytes" in r and r.get("class") not in ("trim", "resident"):
                    sums[r["data-kind"]] = sums.get(r["data-kind"], 0) + int(r["data-bytes"])
    return sums


def _ledger(run: Path) -> dict[int, int]:
    """The blocks the reproducer leaked (address -> size), from the hex text it wrote."""
    return {int(a, 16): int(n, 16) for a, n in (line.split() for line in (run / "leaks.txt").read_text().split("\n")
                                               if line)}


def _maps_and_scan(doc: dict, html: str, want: dict, leaked: dict[int, int]) -> None:
    """The page's maps draw each property's bytes exactly (in use, leaked and the proxies of sampled allocations:
    what tcmalloc counts in use; each cache's free objects; the central lists' free objects and their spans'
    rounding; the page heap's free and given-back pages), and the leak scan found exactly the blocks the
    reproducer leaked, over every object in use but the proxies."""
    drawn = _drawn(html)
    assert drawn.get("in_use", 0) + drawn.get("leaked", 0) + drawn.get("gtc_proxy", 0) == \
        want["generic.current_allocated_bytes"]
    assert drawn.get("gtc_thread", 0) == want["tcmalloc.thread_cache_free"]
    assert drawn.get("gtc_transfer", 0) == want["tcmalloc.transfer_cache_free"]
    assert drawn.get("gtc_cpu", 0) == want["tcmalloc.cpu_free"]
    assert drawn.get("gtc_central", 0) + drawn.get("gtc_rounding", 0) == want["tcmalloc.central_cache_free"]
    assert drawn.get("gtc_pages", 0) == want["tcmalloc.page_heap_free"] + want["tcmalloc.page_heap_unmapped"]
    assert "unwalked" not in drawn
    leaks = doc["report"]["leaks"]
    assert leaks["in_use_bytes"] + drawn.get("gtc_proxy", 0) == want["generic.current_allocated_bytes"]
    assert leaks["leaked_count"] == len(leaked) and leaks["leaked_bytes"] >= sum(leaked.values())
    assert drawn.get("leaked", 0) == leaks["leaked_bytes"]


def _figures(doc: dict, want: dict, mode: str, pid: int) -> None:
    """DOC (a report's JSON) holds every property WANT printed, each equal, and the caches of MODE: every CPU's
    slab, or a thread cache for each thread of process PID."""
    got = doc["gtcmalloc"]["properties"]
    assert len(got) == 30 and got == {k: want[k] for k in got}
    assert set(want) == set(got) | set(NOT_GIVEN)            # every property tcmalloc gives: given, or said not to be
    assert doc["gtcmalloc"]["per_cpu_caches_active"] is (mode == "per-cpu")
    if mode == "per-cpu":
        assert doc["gtcmalloc"]["cpus"]["count"] == os.cpu_count() and doc["gtcmalloc"]["cpus"]["slabs"]
    else:
        lwps = {int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()}
        assert lwps <= {t["lwp"] for t in doc["gtcmalloc"]["threads"]}
    sampled = doc["gtcmalloc"]["sampled"]          # about one allocation in 2 MiB is sampled: a span of its own
    assert sampled and all(0 < s["requested"] <= s["bytes"] and s["bytes"] % 8192 == 0 for s in sampled)
    row = doc["report"]["arenas"][0]
    assert row["in_use"] == want["generic.current_allocated_bytes"] and row["system"] == want["generic.heap_size"]


def test_a_capture_and_gdb_attached_give_every_figure_tcmalloc_printed(stopped, tmp_path):
    """The capture's report and gdb's, symbols hidden: every property, the caches of the mode, the check clean;
    its page heaps one owner of the RSS, the whole of what tcmalloc took from the system, its metadata another;
    the page's maps draw every property (`_maps_and_scan`), and the leak scan finds exactly the blocks the
    reproducer leaked, each at least its size, and 'chunk' inside one of them names it, in use and leaked; the
    process goes on as before once continued."""
    proc, want, mode, leaked = stopped
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
    _maps_and_scan(doc, (tmp_path / "out" / "report.html").read_text(), want, leaked)
    first = min(leaked)
    live = run_gdb(["-p", str(proc.pid)], [f"heapwalk report --no-leaks --json {tmp_path / 'live.json'}",
                                           "heapwalk check", f"heapwalk leaks --json {tmp_path / 'leaks.json'}",
                                           f"heapwalk chunk {first + 8:#x} --json {tmp_path / 'chunk.json'}",
                                           "heapwalk bins"], iex=[NO_SYMBOLS])
    assert live.returncode == 0, live.stdout + live.stderr
    assert "Google's tcmalloc consistent: checked" in live.stdout
    chunk = json.loads((tmp_path / "chunk.json").read_text())
    assert chunk["use"] == "in use" and first in (chunk.get("object"), chunk.get("allocation"))
    assert "leaked" in json.dumps(chunk["reach"]) and "size classes, most free bytes first" in live.stdout
    found = json.loads((tmp_path / "leaks.json").read_text())["leaked"]
    assert {b["address"]: b["size"] >= leaked.get(b["address"], 1 << 62) for b in found} == \
        {a: True for a in leaked}
    _figures(json.loads((tmp_path / "live.json").read_text()), want, mode, proc.pid)
    os.kill(proc.pid, signal.SIGCONT)
    assert proc.wait(timeout=60) == 0
