"""gperftools' tcmalloc on a real process, symbols hidden: cores/tcmalloc/tc_hold.c on each of Debian's builds
(cores/scripts/tcbuilds.py: 2.8.1, 2.10, 2.16 and 2.18.1 preloaded, the full 2.10 build, the minimal 2.10 linked into
the stripped program) writes tc_version and every MallocExtension numeric property at its snapshot; 'heapwalk
capture' of it, and gdb attached to it, give each of them; the spans its page map names are all the heap it
took from the system, one owner of the RSS; the verdict says where the free memory is, and what a release gives
back is what MallocExtension_ReleaseFreeMemory() then really gave back."""

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
from conftest import NO_SYMBOLS, ROOT, SYSROOTS, run_gdb
from tcmalloc_oracle import check, ledgers as _ledgers

pytestmark = pytest.mark.cores

CLI = Path(sys.executable).with_name("heapwalk")
BUILDS = list(tcbuilds.TC_BUILDS)


@pytest.fixture
def stopped(tmp_path, request):
    """cores/tcmalloc/tc_hold.c built and run on the parameter's tcmalloc (a build's name, or (name, environment)) to its
    snapshot: (process, its statistics, its tcmalloc, its output folder)."""
    name, env = request.param if isinstance(request.param, tuple) else (request.param, {})
    tc = tcbuilds.prepare_tcmalloc(SYSROOTS, name)
    run = tmp_path / "run"
    proc = harness.run_to_snapshot(tcbuilds.build_hold(tc, tmp_path), run, env={**tc.environment(), **env},
                                   launcher=tc.launcher())
    try:
        yield proc, json.loads((run / "stats.json").read_text()), tc, run
    finally:
        proc.kill()
        proc.wait()


def _check(doc: dict, stats: dict, tc: tcbuilds.Tcmalloc, pid: int) -> None:
    """DOC (a report's JSON) says every figure STATS printed (`tcmalloc_oracle.check`), and names each thread
    cache's thread: every thread of process PID has one (up to 2.15 by the cache's tid_, from 2.16 by the
    thread's TLS pointer to it)."""
    lwps = {int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()}
    assert {t["lwp"] for t in doc["tcmalloc"]["threads"]} == lwps
    check(doc, stats, tc.version)


def _drawn(html: str) -> dict[str, int]:
    """The bytes of each kind of run the page's heap maps draw."""
    sums: dict[str, int] = {}
    for g in heap_groups(html):
        for r in g["rects"]:
            if r.get("data-kind") and "data-bytes" in r and r.get("class") not in ("trim", "resident"):
                sums[r["data-kind"]] = sums.get(r["data-kind"], 0) + int(r["data-bytes"])
    return sums


def _own_leaks(tc: tcbuilds.Tcmalloc) -> list[int]:
    """The sizes of the objects gperftools itself leaks: up to 2.15 its InitModule allocates a default
    MallocExtension of 8 bytes (`new MallocExtension`), which its implementation replaces and nothing frees;
    from 2.16 none."""
    return [8] if tuple(int(n) for n in tc.version.split(".")[:2]) < (2, 16) else []


def _maps_and_scan(doc: dict, html: str, stats: dict, run: Path, tc: tcbuilds.Tcmalloc) -> None:
    """The page's span maps draw each property's bytes (in use and leaked: allocated; each cache's free objects;
    a central list's free objects and its spans' rounding: its free bytes; free spans), and the leak scan found
    as many objects as tc_hold's exiting thread kept (each at least its size), and gperftools' own (`_own_leaks`)."""
    p = stats["properties"]
    drawn = _drawn(html)
    assert drawn.get("in_use", 0) + drawn.get("leaked", 0) == p["generic.current_allocated_bytes"]
    assert drawn.get("tc_thread", 0) == p["tcmalloc.thread_cache_free_bytes"]
    assert drawn.get("tc_transfer", 0) == p["tcmalloc.transfer_cache_free_bytes"]
    assert drawn.get("tc_central", 0) + drawn.get("tc_rounding", 0) == p["tcmalloc.central_cache_free_bytes"]
    assert drawn.get("tc_free", 0) == p["tcmalloc.pageheap_free_bytes"]
    assert drawn.get("tc_returned", 0) == p["tcmalloc.pageheap_unmapped_bytes"]
    assert "unwalked" not in drawn
    assert all(f'<section id="{ident}">' in html for ident in ("classes", "free-spans", "threads", "maps"))
    parked, exited = _ledgers(run)
    leaks = doc["report"]["leaks"]
    assert leaks["in_use_bytes"] == p["generic.current_allocated_bytes"]
    assert leaks["in_use_count"] >= len(parked) + len(exited)
    own = _own_leaks(tc)
    assert leaks["leaked_count"] == len(exited) + len(own)
    assert leaks["leaked_bytes"] >= sum(exited.values()) + sum(own)


@pytest.mark.parametrize("stopped", BUILDS, indirect=True)
def test_a_capture_gives_every_figure_tcmalloc_printed(stopped, tmp_path):
    """The capture's report: every numeric property tcmalloc gave at the snapshot; its spans are one owner of
    the RSS, all of its heap size, and its metadata another, its metadata bytes to the page; its page's maps draw each property, and its leak scan finds what the
    reproducer leaked (`_maps_and_scan`); the verdict names the page heap's free spans and what releases them; and
    what it says a release gives back (the free spans' resident bytes) is what the process's anonymous RSS then
    fell by when it called MallocExtension_ReleaseFreeMemory()."""
    proc, stats, tc, run = stopped
    result = subprocess.run([str(CLI), "capture", str(proc.pid), "--out", str(tmp_path / "out"), "--no-symbols"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    _check(doc, stats, tc, proc.pid)
    rows = {r["name"]: r for r in doc["report"]["rss_by_owner"]["rows"]}
    spans = rows["tcmalloc: spans"]
    assert spans["mapped"] == doc["tcmalloc"]["pageheap"]["system_bytes"] and spans["bytes"] > 0
    p = stats["properties"]      # the metadata: what tcmalloc counts, beyond its heap, in its physical bytes
    metadata = p["generic.total_physical_bytes"] - p["generic.heap_size"] + p["tcmalloc.pageheap_unmapped_bytes"]
    claimed = rows["tcmalloc: metadata"]       # in whole pages: each range's last page is partly handed out
    assert 0 <= claimed["mapped"] - metadata < 4096 * claimed["count"] and claimed["bytes"] > 0
    said = " ".join(result.stdout.split())
    assert "The page heap's" in said and "MallocExtension::ReleaseFreeMemory()" in said and " of it in RAM" in said
    _maps_and_scan(doc, (tmp_path / "out" / "report.html").read_text(), stats, run, tc)
    os.kill(proc.pid, signal.SIGCONT)
    assert proc.wait(timeout=60) == 0
    release = json.loads((run / "release.json").read_text())
    assert release["pageheap_free_before"] == stats["properties"]["tcmalloc.pageheap_free_bytes"]
    assert release["pageheap_free_after"] == 0
    page_heap = doc["report"]["arenas"][0]
    assert page_heap["trim"] == release["rss_anon_before"] - release["rss_anon_after"] > 0


@pytest.mark.parametrize("stopped", ["bullseye", "sid", "bookworm-linked"], indirect=True)
def test_leaks_and_chunk_name_each_object(stopped, tmp_path):
    """gdb -p on the stopped process, symbols hidden: 'heapwalk leaks' lists exactly the blocks the exiting
    thread kept (each of its class's size), and gperftools' own (`_own_leaks`); 'heapwalk chunk' says a
    parked thread's kept block is in use and what reaches it, the exiting thread's leaked, and the last block
    a parked thread freed free (in its cache, a transfer cache or its span's list); 'heapwalk check' walks
    every free list and finds them sound."""
    proc, stats, tc, run = stopped
    freed: list[int] = []
    parked, exited = _ledgers(run, freed)
    kept, lost = min(parked), min(exited)
    out = tmp_path / "leaks.json"
    commands = [f"heapwalk leaks --json {out}", f"heapwalk chunk {kept:#x}", f"heapwalk chunk {lost + 1:#x}",
                *(f"heapwalk chunk {a:#x}" for a in freed), "heapwalk check"]
    result = run_gdb(["-p", str(proc.pid)], commands, iex=[NO_SYMBOLS])
    assert result.returncode == 0, result.stderr
    leaked = {c["address"]: c["size"] for c in json.loads(out.read_text())["leaked"]}
    extra = {a: n for a, n in leaked.items() if a not in exited}
    assert set(exited) <= set(leaked) and list(extra.values()) == _own_leaks(tc)
    assert all(leaked[a] >= n for a, n in exited.items())
    said = result.stdout
    lines = said.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{kept:#x}: "))
    assert lines[at].endswith("in use")
    assert lines[at + 2].strip().startswith(("reached: stack of thread", "reached: TLS of thread"))   # its array
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{lost + 1:#x}: "))
    assert f"{lost:#x}" in lines[at] and lines[at + 2].strip().startswith("leaked: nothing reachable points to it")
    for a in (a for a in freed if a not in parked and a not in exited):    # not taken again by another thread
        line = next(line for line in lines if line.startswith(f"{a:#x}: "))
        assert ": free, in thread " in line or ": free, in the transfer cache" in line or "span's list" in line \
            or "in a free span" in line, line
    assert "tcmalloc consistent: checked" in said and "every free object" in said


@pytest.mark.parametrize("stopped", [*BUILDS, ("bookworm", {"TCMALLOC_AGGRESSIVE_DECOMMIT": "t"})],
                         indirect=True, ids=[*BUILDS, "aggressive-decommit"])
def test_gdb_attached_says_the_same(stopped, tmp_path):
    """gdb -p on the stopped process, symbols hidden: the same figures, read live (and with aggressive decommit,
    whose free spans go back to the system at once: unmapped bytes, the setting itself); check finds its
    spans add up to its heap size and its free and returned bytes, its thread caches' list sound; threads
    lists every cache; bins' classes hold, with the large spans, the bytes allocated, and their central lists'
    bytes the central cache's."""
    proc, stats, tc, _ = stopped
    out = tmp_path / "report.json"
    bins = tmp_path / "bins.json"
    result = run_gdb(["-p", str(proc.pid)], [f"heapwalk report --no-leaks --json {out}", "heapwalk check",
                                              "heapwalk threads", f"heapwalk bins --json {bins}"], iex=[NO_SYMBOLS])
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    _check(doc, stats, tc, proc.pid)
    classes = json.loads(bins.read_text())["classes"]
    large = doc["tcmalloc"]["spans"]["in_use"]["bytes"] - sum(c["span_pages"] for c in classes) * 8192
    assert sum(c["in_use"] * c["size"] for c in classes) + large == stats["properties"]["generic.current_allocated_bytes"]
    assert sum(c["central_bytes"] for c in classes) == stats["properties"]["tcmalloc.central_cache_free_bytes"]
    assert f"tcmalloc: gperftools {tc.version}" in result.stdout and "tcmalloc consistent: checked" in result.stdout
    assert f"tcmalloc thread caches ({len(doc['tcmalloc']['threads'])})" in result.stdout
    if doc["tcmalloc"]["properties"]["tcmalloc.aggressive_memory_decommit"]:
        assert doc["tcmalloc"]["properties"]["tcmalloc.pageheap_unmapped_bytes"] > 0
        assert "TCMALLOC_AGGRESSIVE_DECOMMIT=t (from the next start)" not in result.stdout


_SHAPES = """
import gdb
from heapwalk.gdb import session
from heapwalk.tcmalloc import find, discovery as D
import numpy as np
t = session._target()
f = find.find_tcmalloc(t.mem, t.space.mappings)
d = D.discover_tcmalloc(t.mem, f)
base, words = D.writable_words(t.mem, f.image)
sizes = np.frombuffer(t.mem.read(d.sizemap, 4 * d.classes), dtype=np.int32)
heads = {int(w) for w in words[words > 0x10000].tolist() if D._is_first_cache(t.mem, int(w), d.layout, sizes)}
print("SHAPES", D._metadata(t.mem, f), D._metadata_by_shape(t.mem, base, words),
      f.image.dynamic_symbol(D._OVERALL), D._overall_by_shape(base, words, D._claimed(t.mem, d.thread_heaps, d.layout)),
      d.thread_heaps, sorted(heads))
"""


@pytest.mark.parametrize("stopped", [b for b in BUILDS if not tcbuilds.TC_BUILDS[b].linked], indirect=True)
def test_the_shapes_find_what_the_symbols_say(stopped, tmp_path):
    """Where the library exports them, the symbols and the shapes a stripped program is searched by name the
    same places: the metadata counter, the thread caches' limit, the first thread cache."""
    proc, _, _, _ = stopped
    script = tmp_path / "shapes.py"
    script.write_text(_SHAPES)
    result = subprocess.run(["gdb", "-nx", "-batch", "-x", str(ROOT / "gdbinit"), "-p", str(proc.pid), "-x",
                             str(script)], capture_output=True, text=True, timeout=300)
    line = next((l for l in result.stdout.splitlines() if l.startswith("SHAPES ")), None)
    assert line, result.stdout + result.stderr
    metadata, metadata_shape, overall, overall_shape, head, heads = line.split(" ", 6)[1:]
    assert metadata == metadata_shape != "None" and overall == overall_shape != "None"
    assert heads == f"[{head}]"
