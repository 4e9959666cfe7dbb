"""Microsoft's mimalloc on a real process, symbols hidden: cores/mimalloc/mi_hold.c on Debian's build and on releases built
from the sources registry packages bundle (cores/scripts/mibuilds.py: 2.0.9; 2.0.6, 2.0.7; 2.1.2, whose segments come
from arenas) writes
mimalloc's own statistics (mi_stats_print_out, mi_process_info) at its snapshot and a ledger of every block in
use in each thread's heap (mi_heap_visit_blocks), four threads parked and one exited (its segments abandoned);
heapwalk's report of its core, and of gdb attached to it, gives each figure: committed bytes to the byte,
reserved as mimalloc rounds it, the segments, abandoned segments and pages, and each heap's blocks in use and
their bytes.  mimalloc 3 (trixie's 3.0.1: pages cut from arenas, no segments) is held to the same: its committed
bytes, its abandoned pages (full pages live threads give up, and an exited thread's), its arenas, each heap's
blocks, and the blocks every thread keeps wherever they are (the "l" lines).  A stripped Rust service on the
mimalloc crate (cores/mimalloc/rust_mi: 3.3.2, and 2.3.2 with the crate's v2 feature) writes the same files and is held
to the same."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import harness
import mibuilds
from conftest import FULL_MATRIX, NO_SYMBOLS, SYSROOTS, capture_mimalloc, run_gdb
from mimalloc_oracle import UNITS as _UNITS, check as _check, common, current as _current, ledger as _ledger
from heapwalk.mimalloc.find import version_of
from heapwalk.analysis.report import human as _human
from heapwalk.mimalloc.layout import layout_for
from heapwalk.mimalloc.v3.layout import layout3_for

pytestmark = pytest.mark.cores

CLI = Path(sys.executable).with_name("heapwalk")


@pytest.fixture
def stopped(tmp_path, request):
    """cores/mimalloc/mi_hold.c (or the Rust reproducer) run on the parameter's mimalloc (a build's name) to its snapshot:
    (process, its output folder, its version, whether the program links it: then it says no version)."""
    mi = mibuilds.prepare_mimalloc(SYSROOTS, request.param)
    run = tmp_path / "run"
    proc = harness.run_to_snapshot(mibuilds.build_hold(tmp_path, mi), run, env=mi.environment())
    proc.hw_collapses = _collapses()   # what khugepaged did before the snapshot
    try:
        yield proc, run, mi.version, mi.linked
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("build", ["bookworm", *(b for b in mibuilds.MI_BUILT if b < "3"), "2.1.2-linked",
                                   "2.3.2-linked", "rust-v2"])
def test_a_core_gives_every_figure_mimalloc_printed(tmp_path, build):
    """The CLI on the core of mi_hold, symbols hidden, on Debian's 2.0.9 and the releases built from their
    sources (2.0.6, 2.0.7: other layouts, segments of 64 MiB; 2.1.2 also linked into the stripped
    program, which then says no version): every figure as mimalloc printed it, every heap's blocks as its ledger
    lists them; the verdict names the abandoned segments and the memory waiting to be purged."""
    cap = capture_mimalloc(build)
    mi = mibuilds.prepare_mimalloc(SYSROOTS, build)
    version = mi.version
    out = tmp_path / "report.json"
    result = subprocess.run([str(CLI), "report", "--no-symbols", "--no-leaks", "--json", str(out), str(cap.core),
                             str(cap.exe)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    _check(json.loads(out.read_text()), cap.directory, version, said=not mi.linked)
    said = " ".join(result.stdout.split())
    assert f"mimalloc: mimalloc {version}" in said or mi.linked and "mimalloc: mimalloc (version not said)" in said
    assert re.search(r"\d+ segments \(\d+ MiB\) are abandoned: their threads exited with", said)
    assert "wait for the purge delay" in said


@pytest.mark.parametrize("build", ["bookworm", "2.1.2", "2.3.2", "rust-v2"])
def test_leaks_are_the_exited_thread_s_blocks_and_check_finds_it_sound(tmp_path, build):
    """gdb on the core, symbols hidden: the leak scan finds exactly the blocks the exited thread kept and forgot
    (its ledger's, in its abandoned segments), no other; check walks every page, segment and queue and finds
    nothing wrong; chunk names a block in use (and what reaches it), one freed by its thread (local free list),
    one freed by another thread, and a leaked one; map draws every segment.  On 2.0.9 and on 2.1.2 (segments
    taken from arenas)."""
    cap = capture_mimalloc(build)
    out = tmp_path / "leaks.json"
    ledgers = _ledger(cap.directory)
    exited = next(e for e in ledgers.values() if e["how"] == "exits")["blocks"]
    parked = ledgers["ledger-1.txt"]
    local = next(int(line.split()[1], 16) for line in (cap.directory / "ledger-1.txt").read_text().splitlines()
                 if line.startswith("f "))
    cross = next(int(line.split()[1], 16) for line in (cap.directory / "ledger-main.txt").read_text().splitlines()
                 if line.startswith("f "))
    chunks = [min(parked["blocks"]), local, cross, min(exited)]
    result = run_gdb([str(cap.exe), str(cap.core)], ["heapwalk check", f"heapwalk leaks --json {out}",
                                                     *(f"heapwalk chunk {a:#x}" for a in chunks), "heapwalk map"],
                     iex=[NO_SYMBOLS])
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stdout.split())
    assert "mimalloc consistent: checked every page's counters" in said
    leaked = {b["address"]: b["size"] for b in json.loads(out.read_text())["leaked"]}
    assert leaked == exited
    assert re.search(f"{chunks[0]:#x}: block {chunks[0]:#x} of .*?: in use page .*? reached: data of {cap.exe.name}",
                     said)
    assert f"{chunks[1]:#x}: block {chunks[1]:#x}" in said and "free, on its page's local free list" in said
    assert re.search(f"{chunks[2]:#x}: block {chunks[2]:#x} .*?: free, on its (page's thread free|heap's delayed-free) "
                     "list", said)
    assert "abandoned (its thread exited)) leaked: nothing reachable points to it" in said
    assert "segment at" in said and "(huge)" in said


@pytest.mark.parametrize("stopped", ["bookworm", "2.1.2", "2.3.2", "rust-v2", *mibuilds.MI_LIVE], indirect=True)
def test_gdb_attached_says_the_same(stopped, tmp_path):
    """gdb -p on the stopped process, symbols hidden: the same figures, read live; threads lists each heap with
    its thread; the options are those the process runs with; what the verdict says mi_collect(true) on the main
    thread gives back is what it then took off mimalloc's commit (to the byte) and the RSS: on 2.0.9 the abandoned
    segments' waiting slices, on 2.1.2 also the cached thread data and the arenas' blocks waiting for a purge.
    Also on one release of each layout measured between 2.1.2 and 2.3.2 (2.1.4 to 2.3.1: read live only).  From
    2.1 to 2.3.1 a purge makes mimalloc's committed statistic drift low, as the verdict says: they run with a
    purge delay that lets nothing be purged before the snapshot (`mibuilds.drift_delay`)."""
    proc, run, version, linked = stopped
    doc, said = _attached(proc, tmp_path)
    _check(doc, run, version, said=not linked)
    assert f"mimalloc heaps ({len(doc['mimalloc']['heaps'])})" in said
    delay = "decommit_delay" if version < "2.1" else "purge_delay"        # renamed in 2.1
    drifts = layout_for(version_of(json.loads((run / "stats.json").read_text())["version"])).stat_drifts
    wait = mibuilds.drift_delay(version)
    assert doc["mimalloc"]["options"][delay] == ({"value": wait, "set": "from the environment"} if wait else
                                                 {"value": 25 if version < "2.1" else 10, "set": "default"})
    assert f"wait for the purge delay ({delay}: " in " ".join(said.split())
    idle = re.search(r"(\d+(?:\.\d+)?) (MiB|GiB) of free spans are committed but not in RAM", " ".join(said.split()))
    if version == "2.0.9":          # the huge and large blocks mi_hold touched only in part, then freed
        spans = sum(o["free"]["free spans"] for o in doc["mimalloc"]["owners"])
        assert idle and 0 < float(idle[1]) * _UNITS[idle[2]] < spans
    assert ("own committed figure (mi_stats_print, mi_process_info) is not this one once it has purged" in
            " ".join(said.split())) == drifts
    if version == "2.1.2":          # its collect purges only what waited past the delay
        time.sleep(max(0.0, (run / "stats.json").stat().st_mtime + wait / 1000 + 1 - time.time()))
    collected = _collect(proc, run)
    taken = collected["commit_before"] - collected["commit_after"]
    # from 2.1.4 to 2.3.1 the statistic falls by more than the memory collect purges (its count drifts low, as
    # the verdict says: the RSS below is what it gives back)
    assert 0 < doc["mimalloc"]["totals"]["collect_decommits"] == taken or drifts and version > "2.1.2" and \
        0 < doc["mimalloc"]["totals"]["collect_decommits"] < taken
    _gives_back(doc["mimalloc"]["collect_resident"], collected)


@contextmanager
def _run_with(tmp_path: Path, build: str, **env: str):
    """mi_hold on mimalloc BUILD with the environment's ENV added, stopped at its snapshot while the block runs:
    (process, its output folder); killed after."""
    mi = mibuilds.prepare_mimalloc(SYSROOTS, build)
    run = tmp_path / "run"
    proc = harness.run_to_snapshot(mibuilds.build_hold(tmp_path, mi), run, env={**mi.environment(), **env})
    proc.hw_collapses = _collapses()   # what khugepaged did before the snapshot
    try:
        yield proc, run
    finally:
        proc.kill()
        proc.wait()


def _from_the_system(tmp_path: Path, build: str):
    """mi_hold on mimalloc BUILD with MIMALLOC_DISALLOW_ARENA_ALLOC=1 (`_run_with`)."""
    return _run_with(tmp_path, build, MIMALLOC_DISALLOW_ARENA_ALLOC="1")


@pytest.mark.parametrize("build, reserve", [("bookworm", "1GiB"), ("bookworm", "4GiB"), ("2.0.6", "4GiB")])
def test_mimalloc_2_0_reserved_arena(tmp_path, build, reserve):
    """2.0 run with MIMALLOC_RESERVE_OS_MEMORY: an arena reserved and committed at its start, from which it takes
    its segments (pinned: never decommitted), then from the system once it is full (1 GiB), or not (4 GiB: the
    arena lies above the addresses the segment map covers, and holds every segment).  gdb -p, symbols hidden:
    every figure as mimalloc printed it, its committed bytes to the byte with the arena's unused blocks and
    description; the verdict names the ends of the blocks huge segments take whole, and the arena's blocks no
    segment uses, committed for good (4 GiB: none of them resident); check finds it sound; what
    mi_collect(true) then gives back is the estimate (nothing from the arena's segments).  2.0.6's arenas do not
    carry their number (their place in the table gives it)."""
    with _run_with(tmp_path, build, MIMALLOC_RESERVE_OS_MEMORY=reserve) as (proc, run):
        doc, said = _attached(proc, tmp_path)
        result = run_gdb(["-p", str(proc.pid)], ["heapwalk check"], iex=[NO_SYMBOLS])
        collected = _collect(proc, run)
    version = "2.0.9" if build == "bookworm" else build
    _check(doc, run, version)
    m = doc["mimalloc"]
    size = int(reserve[0]) << 30
    assert m["totals"]["arenas"] == 1 and m["arenas"] == [{"id": 1, "start": m["arenas"][0]["start"], "bytes": size}]
    assert (m["totals"]["arena_free"] > 0) == (reserve == "4GiB")
    pinned = re.search(r"1 arena of (\d) GiB is committed as a whole \(reserve_os_memory: (\d+) KiB, from the "
                       r"environment\): (\d+(?:\.\d+)?) GiB of its blocks hold no segment, 0 B of it resident",
                       " ".join(said.split()))
    assert (pinned is not None) == (reserve == "4GiB")
    if pinned:
        assert int(pinned[1]) << 30 == size == int(pinned[2]) << 10
        assert abs(float(pinned[3]) * (1 << 30) - m["totals"]["arena_free"]) < 0.01 * (1 << 30)
    assert re.search(r"its own \(\d+(\.\d+)? MiB of it the ends of the arena blocks huge segments take whole\)",
                     " ".join(said.split()))
    assert "mimalloc consistent" in result.stdout and not doc["findings"], result.stdout
    assert m["totals"]["collect_decommits"] == collected["commit_before"] - collected["commit_after"]
    assert (m["totals"]["collect_decommits"] == 0) == (reserve == "4GiB")


def test_segments_from_the_system_are_held_by_the_segment_map_s_parts(tmp_path):
    """2.3.2 run with MIMALLOC_DISALLOW_ARENA_ALLOC=1: every segment comes from the system (below 48 TiB), and the
    segment map's parts (taken from the system too) hold them.  gdb -p, symbols hidden: every figure as mimalloc
    printed it, its committed bytes to the byte with the parts in them; check finds it all sound."""
    with _from_the_system(tmp_path, "2.3.2") as (proc, run):
        doc, said = _attached(proc, tmp_path)
        result = run_gdb(["-p", str(proc.pid)], ["heapwalk check"], iex=[NO_SYMBOLS])
    _check(doc, run, "2.3.2")
    m = doc["mimalloc"]
    assert m["totals"]["arenas"] == 0 and m["options"]["disallow_arena_alloc"]["set"] == "from the environment"
    facts = {f["what"]: f["how"] for f in m["discovery"]}
    assert re.search(r"its table of parts at 0x[0-9a-f]+: 1 parts, \d+ segments from the system", facts["segment map"])
    assert "mimalloc consistent" in result.stdout and not doc["findings"]


@pytest.mark.parametrize("build, delay", [("bookworm", None), ("2.0.6", None), ("bookworm", "0")])
def test_mimalloc_2_0_segment_cache(tmp_path, build, delay):
    """2.0 with MI_HOLD_CACHE: the exiting thread fills and frees whole segments, which wait in mimalloc's segment
    cache (out of its segment map, their stamp and commit mask kept); with MI_HOLD_MAIN the main thread first
    frees most of a segment's pages (their slices wait for the purge delay, the last page retired).  gdb -p,
    symbols hidden: every figure as mimalloc printed it (its committed bytes to the byte, the cached segments in
    them), a row of their own, the verdict's sentence on them; check finds it sound; mi_collect(true) then empties
    the cache, reclaims the abandoned segments and frees the main thread's retired page (2.0.9 decommits what
    waits in those segments then, 2.0.6 nothing): it takes off the commit and the RSS what the verdict says.
    With MIMALLOC_SEGMENT_DECOMMIT_DELAY=0 the cache decommits each segment as it takes it (its header gone): the
    cache's table in mimalloc's data still names them, each still mapped (/proc/PID/maps), nothing of it
    committed, and the reserved figure counts them."""
    env = {"MI_HOLD_CACHE": "512", "MI_HOLD_MAIN": "16",
           **({"MIMALLOC_SEGMENT_DECOMMIT_DELAY": delay} if delay else {})}
    with _run_with(tmp_path, build, **env) as (proc, run):
        doc, said = _attached(proc, tmp_path)
        result = run_gdb(["-p", str(proc.pid)], ["heapwalk check"], iex=[NO_SYMBOLS])
        kept = doc["mimalloc"]["segment_cache"]
        mapped = [_mapped_in(proc.pid, s["address"], s["address"] + s["bytes"]) for s in kept]
        collected = _collect(proc, run)
    assert all(mapped) and all(s["committed"] == 0 for s in kept) == (delay == "0")
    _check(doc, run, "2.0.9" if build == "bookworm" else build)
    m = doc["mimalloc"]
    cached = m["totals"]["segments_cached"]
    row = next(o for o in m["owners"] if o["owner"] == "segment cache")
    assert cached >= 2 and row["segments"] == cached == len(kept) and row["in_use"] == 0
    assert any(f["what"] == "segment cache" and f["how"].startswith("at 0x") for f in m["discovery"])
    assert m["owners"][0]["purge_pending"] > 8 << 20
    assert re.search(rf"{cached} freed segments \(\d+ MiB, (none of it committed|[\d.]+ MiB committed, [\d.]+ MiB "
                     r"resident)\) wait in mimalloc's segment cache for reuse", " ".join(said.split()))
    assert "mimalloc consistent" in result.stdout and not doc["findings"], result.stdout
    assert m["totals"]["collect_decommits"] == collected["commit_before"] - collected["commit_after"]
    _gives_back(m["collect_resident"], collected)


def _mapped_in(pid: int, lo: int, hi: int) -> bool:
    """Whether the process PID maps every byte from LO to HI (/proc/PID/maps)."""
    spans = sorted((int(a, 16), int(b, 16)) for a, b in (line.split()[0].split("-") for line in
                                                          Path(f"/proc/{pid}/maps").read_text().splitlines()))
    for a, b in spans:
        if a <= lo < b:
            lo = b
    return lo >= hi


def _committed_in(pid: int, ranges: list[tuple[int, int]]) -> int:
    """The bytes of RANGES the process PID has committed: mimalloc reserves with no access and commits by
    giving access (/proc/PID/maps)."""
    out = 0
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        span, perms = line.split()[:2]
        lo, hi = (int(x, 16) for x in span.split("-"))
        if perms.startswith("rw"):
            out += sum(max(0, min(hi, b) - max(lo, a)) for a, b in ranges)
    return out


def test_mimalloc_3_6_pages_from_the_system_and_its_own_figures(tmp_path):
    """sid's 3.6.0 run with MIMALLOC_DISALLOW_ARENA_ALLOC=1: every page comes from the system, its mi_page_t in
    the table at the start of its own 256 MiB-aligned memory.  gdb -p, symbols hidden: mimalloc's own figures,
    read from its statistics, are those mi_process_info gave, to the byte; heapwalk's committed bytes are what
    the process has committed (its pages' slices past their tables, and the page map), which mimalloc's own
    figure is below once it has freed such pages (it takes each one's whole rounded reservation off): the
    verdict says so; each heap's blocks are its ledger's, and check finds it sound."""
    with _from_the_system(tmp_path, "sid") as (proc, run):
        doc, said = _attached(proc, tmp_path)
        result = run_gdb(["-p", str(proc.pid)], ["heapwalk check", "heapwalk map"], iex=[NO_SYMBOLS])
        pages = [(int(a, 16), int(b, 16)) for a, b in
                 re.findall(r"page at 0x[0-9a-f]+ \(from the system\)\s+(0x[0-9a-f]+)-(0x[0-9a-f]+)", result.stdout)]
        held = _committed_in(proc.pid, [(a + 65536, b) for a, b in pages])
    stats = json.loads((run / "stats.json").read_text())
    t = doc["mimalloc"]["totals"]
    assert t["arenas"] == 0 and t["os_pages"] == len(pages) > 800
    assert t["own_committed"] == stats["process"]["current_commit"] and t["own_reserved"] == t["reserved"]
    page_map = t["reserved"] - sum(b - a for a, b in pages)         # its table and sub-maps, all committed
    assert t["committed"] == held + page_map > t["own_committed"]
    assert f"its committed figure is {_human(t['committed'] - t['own_committed'])} below what its pages and" in \
        " ".join(said.split())
    kept, ledgers = _kept(run)
    heaps = {h["address"]: h for h in doc["mimalloc"]["heaps"]}
    assert all(heaps[e["heap"]]["in_use"] == sum(e["blocks"].values()) for e in ledgers.values())
    assert "mimalloc consistent" in result.stdout and not doc["findings"]


def _attached(proc, tmp_path: Path) -> tuple[dict, str]:
    """gdb -p on PROC, symbols hidden: report's JSON and the output of report and threads; every heap's thread
    found (its LWP; 3.6's theap of mimalloc's own data has none)."""
    out = tmp_path / "report.json"
    result = run_gdb(["-p", str(proc.pid)], [f"heapwalk report --no-leaks --json {out}", "heapwalk threads"],
                     iex=[NO_SYMBOLS])
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    lwps = {int(task.name) for task in Path(f"/proc/{proc.pid}/task").iterdir()}
    assert {h["lwp"] for h in doc["mimalloc"]["heaps"] if h["kind"] not in ("other", "mimalloc's own")} == lwps
    return doc, result.stdout


def _collect(proc, run: Path) -> dict:
    """PROC let go: it runs mi_collect(true), writes what it took off its commit and RssAnon, and exits.  Also
    whether khugepaged collapsed a huge page anywhere since PROC was started (`_collapses`)."""
    proc.send_signal(signal.SIGCONT)
    assert proc.wait(timeout=60) == 0
    out = json.loads((run / "collect.json").read_text())
    out["collapsed"] = _collapses() != getattr(proc, "hw_collapses", None)
    return out


def _collapses() -> int | None:
    """How many huge pages khugepaged has collapsed on this machine (None where the kernel does not say)."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("thp_collapse_alloc "):
            return int(line.split()[1])
    return None


def _gives_back(estimate: int, collected: dict) -> None:
    """The RssAnon mi_collect(true) took off is ESTIMATE (heapwalk's figure, from the page map at the snapshot),
    within the page or two other memory of the process may move meanwhile.  When khugepaged collapsed a huge
    page while the process was stopped, the holes of the range it collapsed were filled with zeroed pages that
    collect then gives back too: the drop may only be larger."""
    drop = collected["rss_anon_before"] - collected["rss_anon_after"]
    if collected["collapsed"]:
        assert drop >= estimate - (16 << 10)
    else:
        assert abs(estimate - drop) <= 16 << 10


def _snapshots(run: Path) -> dict[str, dict]:
    """From 3.2: each theap walked again at the snapshot (snapshot-N.txt): its address and its blocks."""
    out = {}
    for path in sorted(run.glob("snapshot-*.txt")):
        lines = [line.split() for line in path.read_text().splitlines()]
        out[path.name] = {"how": "parks", "heap": int(lines[0][1], 16),
                          "blocks": {int(p[1], 16): int(p[2], 16) for p in lines if p[0] == "b"}}
    return out


def _kept(run: Path) -> tuple[dict[int, int], dict[str, dict]]:
    """mimalloc 3: every block the threads keep (their "l" lines, less those freed after), and the ledgers (from
    3.2 the walks at the snapshot)."""
    ledgers = _snapshots(run) or _ledger(run)
    freed, kept = set(), {}
    for path in sorted(run.glob("ledger-*.txt")):
        lines = [line.split() for line in path.read_text().splitlines()]
        freed |= {int(p[1], 16) for p in lines if p[0] == "f"}
        kept.update({int(p[1], 16): int(p[2], 16) for p in lines if p[0] == "l"})
    return {a: n for a, n in kept.items() if a not in freed}, ledgers


def _check3(doc: dict, run: Path, version: str, said: bool = True) -> None:
    """DOC (a report's JSON) gives the figures mimalloc 3 VERSION printed in RUN: committed to the byte, reserved
    to its rounding, the abandoned pages and the arenas as it counts them; each parked thread's heap holds its
    walk's blocks, the abandoned pages the kept blocks no heap walk saw, and all of it every kept block.  A
    build linked into the program does not say its version (not SAID)."""
    stats, m = common(doc, run, version, said)
    totals = m["totals"]
    if version >= "3.6":                            # its own figures read from its statistics
        assert (totals["own_committed"], totals["own_reserved"]) == (totals["committed"], totals["reserved"])
    theaps = tuple(map(int, version.split("."))) >= (3, 2, 0)
    if not theaps:                                    # from 3.2 its count of abandoned pages is not kept up to date
        assert totals["pages_abandoned"] == _current(stats["stats"], "-abandoned")[0] > 0
    assert totals["pages_abandoned"] > 0
    assert totals["arenas"] == int(re.search(r"arenas\s*:\s+(\d+)", stats["stats"]).group(1)) > 0
    # each thread's huge block (40 MiB): past an arena's largest object to 3.1.5, not from 3.1.6
    assert totals["os_pages"] == (5 if tuple(map(int, version.split("."))) < (3, 1, 6) else 0)
    kept, ledgers = _kept(run)
    heaps = {h["address"]: h for h in m["heaps"]}
    # 3.1 may give up a thread's full pages after its own walk (its periodic collect does), and
    # there is no walk at the snapshot (the main thread walks the others' theaps from 3.2): its heap holds at
    # most what its walk saw, the rest is in the abandoned pages (the main thread takes some, freeing in them)
    exact = theaps or version < "3.1"
    walked = {}
    for name, entry in ledgers.items():
        if entry["how"] != "exits":
            held, seen = heaps[entry["heap"]]["in_use"], sum(entry["blocks"].values())
            assert held == seen if exact else held <= seen or entry["how"] == "main", name
            walked.update(entry["blocks"])
    got = next(o for o in m["owners"] if o["owner"] == "abandoned pages")
    if exact:
        rest = {a: n for a, n in kept.items() if a not in walked}
        assert (got["blocks"], got["in_use"]) == (len(rest), sum(rest.values())) and rest
    main = ledgers["snapshot-main.txt" if theaps else "ledger-main.txt"]["blocks"]
    own = sum(n for a, n in main.items() if a not in kept)     # the main thread's own blocks
    assert sum(o["in_use"] for o in m["owners"]) == sum(kept.values()) + own
    assert all(o["in_use"] + sum(o["free"].values()) + o["overhead"] == o["reserved"] for o in m["owners"])


@pytest.mark.parametrize("build", ["trixie", "3.1.5-linked", "3.3.2", "3.3.2-linked", "3.4.3", "rust", "sid"])
def test_mimalloc_3_s_core_gives_every_figure_it_printed(tmp_path, build):
    """The CLI on the core of mi_hold on trixie's mimalloc 3.0.1, and on 3.1.5 and 3.3.2 linked into the stripped
    program (no version said, no entry point exported), symbols hidden: every figure as mimalloc printed it, every
    heap's blocks and the abandoned pages' as the ledgers list them; the verdict names the abandoned pages and
    what waits for the purge.  Also on sid's 3.6.0, whose pages' mi_page_t sit in a table at the start of each
    256 MiB area, and whose own data (theaps, thread data) is allocated in a theap of its own: its row."""
    cap = capture_mimalloc(build)
    mi = mibuilds.prepare_mimalloc(SYSROOTS, build)
    out = tmp_path / "report.json"
    result = subprocess.run([str(CLI), "report", "--no-symbols", "--no-leaks", "--json", str(out), str(cap.core),
                             str(cap.exe)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    _check3(doc, cap.directory, mi.version, said=not mi.linked)
    said = " ".join(result.stdout.split())
    named = "mimalloc (version not said)" if mi.linked else f"mimalloc {mi.version}"
    assert f"mimalloc: {named}" in said and re.search(r"pages of 64 KiB slices, in \d arenas", said)
    heaps = doc["mimalloc"]["heaps"]
    assert len({h["thread_id"] for h in heaps if h["kind"] != "mimalloc's own"}) == 5
    theap_meta = mi.version >= "3.6"
    assert [h["kind"] for h in heaps].count("mimalloc's own") == theap_meta
    assert ("mimalloc's own data" in {o["owner"] for o in doc["mimalloc"]["owners"]}) == theap_meta
    assert re.search(r"\d+ pages \(\d+ MiB\) are abandoned, with \d+ MiB of blocks in use", said)
    assert re.search(r"of free arena slices are committed and wait for the purge delay \(purge_delay: \d+ ms", said)


#: the builds the leak test of mimalloc 3 runs on: Debian's, the crate's and one linked release in make test, every
#: release with HEAPWALK_FULL_MATRIX=1 (each one's every figure is held to its own by the tests above)
MI3_LEAK_BUILDS = ["trixie", "3.3.2-linked", "rust", "sid"] + (["3.3.2", "3.4.3"] if FULL_MATRIX else [])


@pytest.mark.parametrize("build", MI3_LEAK_BUILDS)
def test_mimalloc_3_s_leaks_are_the_exited_thread_s_blocks(tmp_path, build):
    """gdb on the core of mimalloc 3, symbols hidden: the leak scan finds the blocks the exited thread kept (its
    "l" lines), wherever its pages went, and no other; check finds every page, arena and queue sound; chunk
    names a block in use, one on a local free list, one on a thread-free list, a leaked one, and a free slice
    of an arena; map draws the pages."""
    cap = capture_mimalloc(build)
    ledgers = _ledger(cap.directory)
    exited = {int(p[1], 16): int(p[2], 16) for p in (line.split() for line in
              (cap.directory / "ledger-4.txt").read_text().splitlines()) if p[0] == "l"}
    local = next(int(line.split()[1], 16) for line in (cap.directory / "ledger-1.txt").read_text().splitlines()
                 if line.startswith("f "))
    cross = next(int(line.split()[1], 16) for line in (cap.directory / "ledger-main.txt").read_text().splitlines()
                 if line.startswith("f "))
    parked = min(ledgers["ledger-1.txt"]["blocks"])
    out, check = tmp_path / "leaks.json", tmp_path / "report.json"
    subprocess.run([str(CLI), "report", "--no-symbols", "--no-leaks", "--json", str(check), str(cap.core),
                    str(cap.exe)], capture_output=True, text=True, timeout=600, check=True)
    last = json.loads(check.read_text())["mimalloc"]["arenas"][-1]
    unused = last["start"] + last["bytes"] - 65536          # the last arena's last slice: never used here
    result = run_gdb([str(cap.exe), str(cap.core)], ["heapwalk check", f"heapwalk leaks --json {out}",
                                                     *(f"heapwalk chunk {a:#x}" for a in (parked, local, cross,
                                                                                          min(exited), unused)),
                                                     "heapwalk map"], iex=[NO_SYMBOLS])
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stdout.split())
    assert re.search(r"mimalloc consistent: checked every page's counters against its free lists; each page's heap "
                     r"against its owner thread; every arena page against the arena's bitmap and slices; every "
                     r"heap's page queues, link by link \(\d arenas, \d+ pages, [56] heaps\)", said)
    slot = last["bytes"] // 65536 - 1
    assert f"{unused:#x}: a free slice (number {slot}) of arena {last['id']} at {last['start']:#x}" in said
    # a conservative scan can only miss a leak: a stale word (an old frame of a parked thread's stack, the
    # untouched tail of a block another thread keeps) keeps a block reached; never more than a few here
    leaked = {b["address"]: b["size"] for b in json.loads(out.read_text())["leaked"]}
    assert leaked.items() <= exited.items() and len(leaked) >= 0.99 * len(exited)
    assert re.search(f"{parked:#x}: block {parked:#x} of .*?: in use page .*? reached: data of {cap.exe.name}", said)
    # from 3.2 the main thread's walks at the snapshot moved the pages' local and thread free lists to their free
    # lists; 3.0.1's show each list
    theaps = mibuilds.prepare_mimalloc(SYSROOTS, build).version >= "3.2"
    assert re.search(f"{local:#x}: block {local:#x} .*?: free, on its page's {'' if theaps else 'local '}free list",
                     said)
    assert re.search(f"{cross:#x}: block {cross:#x} .*?: free, on its page's {'' if theaps else 'thread '}free list",
                     said)
    assert "abandoned (its thread gave it up, or exited)), blocks from" in said
    assert "nothing reachable points to it" in said
    os_pages = json.loads(check.read_text())["mimalloc"]["totals"]["os_pages"]
    assert "arena 1 at 0x" in said and ("page at" in said and "(from the system)" in said) == (os_pages > 0)


@pytest.mark.parametrize("stopped", ["trixie", "3.3.2", "rust", "sid", "3.6.0", *mibuilds.MI_LIVE3], indirect=True)
def test_mimalloc_3_attached_says_the_same_and_what_collect_gives_back(stopped, tmp_path):
    """gdb -p on the stopped process on mimalloc 3.0.1, 3.3.2, sid's 3.6.0 and 3.6.0 built as a release from its
    sources, and one release of each other layout (`mibuilds.MI_LIVE3`), symbols hidden: the same figures, read
    live (to 3.3.1 the verdict says mimalloc's own committed figure drifts below once it has purged);
    threads lists each heap with its thread; what the verdict says mi_collect(true) on the main thread gives back
    (the arenas' free slices waiting for their purge, the main thread's empty pages) is what it then took off
    mimalloc's commit, to the byte (3.0.1; 3.3.2 takes nothing off), and off the RSS."""
    proc, run, version, linked = stopped
    doc, said = _attached(proc, tmp_path)
    _check3(doc, run, version, said=not linked)
    assert f"mimalloc heaps ({len(doc['mimalloc']['heaps'])})" in said
    assert doc["mimalloc"]["options"]["purge_delay"]["set"] == "default"
    drifts = layout3_for(version_of(json.loads((run / "stats.json").read_text())["version"])).stat_drifts
    assert ("own committed figure (mi_stats_print, mi_process_info) is not this one once it has purged" in
            " ".join(said.split())) == drifts
    collected = _collect(proc, run)
    totals = doc["mimalloc"]["totals"]
    # from 3.2 a purge on Linux leaves the committed figure as it was
    assert totals["collect_decommits"] == collected["commit_before"] - collected["commit_after"]
    assert totals["collect_purges"] == (totals["collect_decommits"] or totals["collect_purges"]) > 0
    _gives_back(doc["mimalloc"]["collect_resident"], collected)


def _present_pages(pid: int) -> tuple[dict[str, frozenset[int]], set[str], int]:
    """The pages present in each mapping of PID (by its start: their page numbers), the mappings of a file, and
    its RssAnon in KiB."""
    out, files = {}, set()
    with open(f"/proc/{pid}/pagemap", "rb", buffering=0) as fh:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if line.endswith(("[vsyscall]", "[vvar]", "[vdso]")):
                continue
            entries = np.frombuffer(os.pread(fh.fileno(), (end - start) // 4096 * 8, start // 4096 * 8),
                                    dtype=np.uint64)
            out[f"{start:#x}"] = frozenset(np.flatnonzero(entries >> np.uint64(63)).tolist())
            if fields[4] != "0":
                files.add(f"{start:#x}")
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return out, files, int(status["RssAnon"].split()[0])


@pytest.mark.parametrize("stopped", ["bookworm", "trixie", "3.3.2", "sid"], indirect=True)
def test_reading_a_live_process_maps_no_page_in_it(stopped):
    """gdb -p, symbols hidden: report (with the leak scan), check and map read mimalloc's segments or arenas,
    bitmaps and page map (mostly never-touched reservations) and fault no page in: every mapping's present
    pages are what they were, and the RssAnon within the kernel's bookkeeping."""
    proc = stopped[0]
    before, files, anon_before = _present_pages(proc.pid)
    result = run_gdb(["-p", str(proc.pid)], ["heapwalk report", "heapwalk check", "heapwalk map"],
                     iex=[NO_SYMBOLS])
    after, _, anon_after = _present_pages(proc.pid)
    assert result.returncode == 0 and "mimalloc consistent" in result.stdout, result.stderr
    # RssAnon within two pages: the kernel's own bookkeeping when gdb attaches (as tests/live/test_untouched.py)
    assert abs(anon_after - anon_before) <= 8
    assert before.keys() == after.keys()
    # no page is present that was not: a file's pages may leave (the page cache is reclaimed while other
    # tests write their cores), anonymous memory's may not
    assert {at: after[at] - before[at] for at in after if after[at] - before[at]} == {}
    assert {at: before[at] - after[at] for at in before if before[at] - after[at] and at not in files} == {}


@pytest.mark.parametrize("stopped", ["sid"], indirect=True)
def test_a_release_not_measured_is_named_in_one_line(stopped):
    """A mimalloc release heapwalk has not measured (sid's 3.6.0, its layout taken out of those heapwalk knows
    for this test) is named, with what heapwalk decodes, in one line and an error status: never a report
    without it."""
    forget = "python import heapwalk.mimalloc.v3.layout as L; L.LAYOUTS3 = L.LAYOUTS3[:-1]"
    result = run_gdb(["-p", str(stopped[0].pid)], [forget, "heapwalk report --no-leaks"], iex=[NO_SYMBOLS])
    said = " ".join((result.stdout + result.stderr).split())
    assert re.search(r"mimalloc 3\.6\.0 is not a version heapwalk has measured \(it decodes 2\.0\.5, .*3\.4\.3",
                     said)
    assert "mimalloc holds" not in result.stdout and result.returncode != 0
