"""jemalloc, decoded from cores of processes run on Debian's libjemalloc2 (5.2.1 from bullseye, 5.3.0 from
bookworm), and on the same jemallocs linked into the program (libjemalloc-dev's archive, the program
stripped: no exported entry point, no symbol), with no debug symbols: every arena's page counters, decay settings and purge counters, and every
small bin's statistics equal what malloc_stats_print(..., "J") printed at the snapshot; each thread's
arena and decay ticker match the reproducer's ledger."""

from __future__ import annotations

import functools
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (BINDIR, JEMALLOC_BUILDS, JEMALLOC_COUNTED, JEMALLOC_VERSIONS, JEMALLOCS, NO_SYMBOLS, SYSROOTS,
                      capture_jemalloc, run_gdb)
import harness
import sysroots
from oracle import jemalloc_arena_view, jemalloc_printed_view
from heapwalk.analysis.report import human
from heapwalk.common.findings import Kind, Severity
from heapwalk.jemalloc.decode import collect_jemalloc
from heapwalk.jemalloc.discovery import JeDiscovery
from heapwalk.jemalloc.layout import LAYOUTS
from heapwalk.inferior.image import ImageMemory
from heapwalk.inferior.threads import ThreadRegs

pytestmark = pytest.mark.cores


def _old(suite: str) -> bool:
    """Is SUITE's jemalloc older than 5.3 (5.1.0, 5.2.1: threads that begin with free() get no decay ticker)?"""
    return tuple(int(n) for n in JEMALLOC_VERSIONS[suite].split(".")) < (5, 3, 0)

def _gdb_json(tmp: Path, suite: str, command: str) -> tuple[str, dict]:
    """(the text, the JSON) of 'heapwalk COMMAND --json' on je_dns's core under SUITE's jemalloc, symbols
    hidden; the command must succeed without a traceback."""
    cap = capture_jemalloc(suite, "je_dns")
    out = tmp / f"{suite}-{command}.json"
    result = run_gdb([str(cap.exe), str(cap.core)], [f"heapwalk {command} --json {out}"], iex=[NO_SYMBOLS])
    assert result.returncode == 0 and out.exists(), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    return " ".join(result.stdout.split()), json.loads(out.read_text())


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    """decoded(suite) -> (heapwalk's JSON, the printed statistics, the ledger) of je_dns on SUITE's jemalloc."""
    tmp = tmp_path_factory.mktemp("jemalloc")

    @functools.cache
    def compute(suite: str):
        directory = capture_jemalloc(suite, "je_dns").directory
        stats = json.loads((directory / "stats.json").read_text())["jemalloc"]
        return _gdb_json(tmp, suite, "arenas")[1], stats, json.loads((directory / "ledger.json").read_text())
    return compute


@pytest.mark.parametrize("suite", JEMALLOC_BUILDS)
def test_the_version_and_every_arena_are_found_without_symbols(decoded, suite):
    doc, stats, ledger = decoded(suite)
    assert doc["allocator"] == "jemalloc"
    assert doc["jemalloc"]["version"] == stats["version"]
    printed = sorted(int(i) for i in stats["stats.arenas"] if i.isdigit())
    assert [a["index"] for a in doc["jemalloc"]["arenas"]] == printed
    # Debian's library: the atexit hook after its exported malloc_stats_print
    shared = suite in (*JEMALLOCS, *sysroots.JEMALLOC_GLIBC)
    assert doc["discovery"]["narenas_total"]["found_by"].startswith(
        "the arena loop after malloc_stats_print" if shared else "arenas.lookup's function")
    assert doc["discovery"]["rtree"]["value"] is not None
    # the variable a user sets the build's options with: MALLOC_CONF, or JE_MALLOC_CONF under Redis's prefix
    assert doc["discovery"]["conf_variable"]["value"] == harness.prepare_jemalloc(SYSROOTS, suite).conf_variable
    assert doc["discovery"]["tsd_tls_offset"]["value"] is not None


@pytest.mark.parametrize("suite", JEMALLOC_BUILDS)
def test_every_arena_and_bin_is_what_malloc_stats_print_printed(decoded, suite):
    """Per arena and per bin, to the page and the region; the arena the reproducer printed from is left out
    (printing changed it after its figures were taken)."""
    doc, stats, ledger = decoded(suite)
    compared = 0
    for arena in doc["jemalloc"]["arenas"]:
        if arena["index"] == ledger["stats_arena"]:
            continue
        printed = stats["stats.arenas"][str(arena["index"])]
        assert len(arena["bins"]) == len(printed["bins"]) == len(stats["arenas"]["bin"])
        assert jemalloc_arena_view(arena, printed) == jemalloc_printed_view(printed, arena["index"], ledger), \
            arena["index"]
        compared += 1
    assert compared >= 7
    assert [(b["size"], b["nregs"]) for b in doc["jemalloc"]["arenas"][0]["bins"]] == \
        [(b["size"], b["nregs"]) for b in stats["arenas"]["bin"]]


@pytest.mark.parametrize("suite", JEMALLOC_BUILDS)
def test_each_thread_has_its_arena_and_the_decay_ticker_the_version_gives_it(decoded, suite):
    """jemalloc 5.2.1 sets up a thread's decay ticker on its first allocation that ticks, so a thread whose
    first call was free() has none; 5.3.0 keeps one ticker in every initialised tsd."""
    doc, stats, ledger = decoded(suite)
    threads = {t["lwp"]: t for t in doc["jemalloc"]["threads"]}
    for entry in ledger["threads"]:
        t = threads[entry["lwp"]]
        if entry["role"] == "idle":
            assert t["state"] == 6 and t["arena"] is None and not t["decay_ticker"]
            continue
        if entry["role"] == "main":
            assert t["arena"] == ledger["stats_arena"]
            continue
        # a debug build fills with junk (opt.junk), which keeps every tsd on the slow path: nominal_slow
        assert t["state"] == (1 if "debug" in suite else 0) and t["arena"] == entry["arena"]
        assert t["allocated"] > 4_000_000 and t["deallocated"] >= t["allocated"]
        expected = entry["role"] == "malloc_first" if _old(suite) else True
        assert t["decay_ticker"] is expected, entry


@pytest.mark.parametrize("suite", JEMALLOC_BUILDS)
def test_arenas_purge_only_where_a_thread_holds_the_decay_ticker(decoded, suite):
    """The DNS server's bug, in numbers: with a 100 ms decay time and time passing, the arenas of threads
    that began with free() never purge under 5.2.1 (dirty_npurge 0, their dirty pages kept); under 5.3.0
    every worker's arena purges."""
    doc, stats, ledger = decoded(suite)
    arenas = {a["index"]: a for a in doc["jemalloc"]["arenas"]}
    workers = [t for t in ledger["threads"] if t["role"] in ("free_first", "malloc_first")]
    assert len({t["arena"] for t in workers}) == len(workers) == 6
    for t in workers:
        arena = arenas[t["arena"]]
        assert arena["dirty_decay_ms"] == 100
        purges = not _old(suite) or t["role"] == "malloc_first"
        assert (arena["dirty_npurge"] > 0) is purges, (t, arena["dirty_npurge"])
    never = sorted(f["address"] for f in doc["findings"] if f["kind"] == "no_decay")
    assert never == sorted(arenas[t["arena"]]["address"] for t in workers
                           if _old(suite) and t["role"] == "free_first")


@pytest.mark.parametrize("suite", JEMALLOC_BUILDS)
def test_the_options_are_what_mallctl_says_without_symbols(decoded, suite):
    """opt.*, read through mallctl's own table of names: every option malloc_stats_print printed, with its
    value, and opt.max_background_threads (which it does not print) as the reproducer read it with mallctl."""
    doc, stats, ledger = decoded(suite)
    opt = doc["jemalloc"]["opt"]
    assert {k: opt.get(k, "missing") for k in stats["opt"]} == stats["opt"]
    assert opt["max_background_threads"] == ledger["opt.max_background_threads"]
    assert opt["dirty_decay_ms"] == 100 and opt["narenas"] == 8     # MALLOC_CONF of the reproducer
    assert doc["discovery"]["opt"]["found_by"].startswith("mallctl's \"opt\" node at ")
    assert doc["jemalloc"]["background_thread"] is ledger["background_thread"] is False


@pytest.mark.parametrize("suite", [*JEMALLOC_BUILDS, *JEMALLOC_COUNTED])
def test_background_threads_turned_on_at_run_time_are_said_to_run(suite, tmp_path):
    """A program that turns jemalloc's background threads on at run time (mallctl "background_thread", as Redis
    does; opt.background_thread stays false), on every build: heapwalk reads the run-time flag as mallctl read
    it at the snapshot, on shared, linked and prefixed builds of every version; the verdict says they purge on
    time, never that background_thread is off, and the threads table names them."""
    cap = capture_jemalloc(suite, "je_hold", "background")
    ledger = json.loads((cap.directory / "ledger.json").read_text())
    assert ledger["background_thread"] is True
    out = tmp_path / "report.json"
    cli = Path(sys.executable).with_name("heapwalk")
    result = subprocess.run([str(cli), "report", "--no-symbols", "--no-leaks", "--json", str(out), str(cap.core),
                             str(cap.exe)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert doc["jemalloc"]["opt"]["background_thread"] is False
    assert doc["jemalloc"]["background_thread"] is True, doc["discovery"]["background_thread"]
    said = " ".join(result.stdout.split())
    assert "background_thread is off" not in said and "background_thread is not known" not in said
    assert "jemalloc's background thread" in said


@pytest.mark.parametrize("suite", JEMALLOC_BUILDS)
def test_thread_caches_hold_what_tcache_bytes_counts(decoded, suite):
    """Per arena, tcache_bytes equals the printed figure; per thread, the cache's bins add up to it for the
    arena the cache is registered with, which is the thread's arena."""
    doc, stats, ledger = decoded(suite)
    threads = doc["jemalloc"]["threads"]
    cached = 0
    for arena in doc["jemalloc"]["arenas"]:
        printed = stats["stats.arenas"][str(arena["index"])]["tcache_bytes"]
        assert arena["tcache_bytes"] == printed
        assert sum(t["tcache"]["bytes"] for t in threads if t["tcache"]["arena"] == arena["index"]) == printed
        cached += printed
    assert cached > 500_000
    for t in threads:
        assert t["tcache"]["bytes"] == sum(b["size"] * b["ncached"] for b in t["tcache"]["bins"])
        assert t["tcache"]["arena"] == t["arena"]
        assert all(b["ncached"] > 0 for b in t["tcache"]["bins"])


def _arena(layout, size: int) -> bytearray:
    """SIZE bytes of a synthetic arena of LAYOUT, zero but for what every sound arena has: its dirty, muzzy
    and retained containers' states."""
    arena = bytearray(size)
    for off, state in zip((layout.dirty_state, layout.muzzy_state, layout.retained_state), (1, 2, 3)):
        struct.pack_into("<I", arena, off, state)
    return arena


def test_a_thread_cache_list_that_loops_is_a_finding_not_a_hang():
    """An arena whose list of thread caches loops without returning to its head: tcache_bytes unknown, and a
    finding at the descriptor the loop returns to."""
    layout = LAYOUTS[(5, 3, 0)]
    arenas_at, arena_at, base = 0x10000, 0x40000, 0x90000
    d1, d2, d3, bins = 0x20000, 0x20100, 0x20200, 0x30000
    arena = _arena(layout, layout.arena_size + 36 * layout.bin_size)
    struct.pack_into("<Q", arena, layout.base, base)
    struct.pack_into("<Q", arena, layout.tcache_descriptors, d1)
    mem = ImageMemory({arenas_at: struct.pack("<Q", arena_at), arena_at: arena, base: bytes(4096),
                       d1: struct.pack("<3Q", d2, 0, bins) + bytes(232), d2: struct.pack("<3Q", d3, 0, bins)
                       + bytes(232), d3: struct.pack("<3Q", d2, 0, bins), bins: bytes(73 * 24)})
    disc = JeDiscovery((5, 3, 0), "5.3.0-test", layout, "libjemalloc.so.2", 0, arenas_at, 1, None,
                       opt={"tcache_max": 32768})
    (a,) = collect_jemalloc(mem, disc, []).arenas
    assert a.tcache_bytes is None
    assert [(f.kind, f.address) for f in a.findings] == [(Kind.ARENA, d2)]


def test_option_values_read_as_jemalloc_prints_them():
    """A 16.16 fixed-point option as malloc_stats_print writes it, and nhbins from each version's option."""
    from heapwalk.jemalloc.opt import fixed_point_text
    from heapwalk.jemalloc.tcache import nhbins
    assert [fixed_point_text(v) for v in (0x4000, 0x10000, 3276, 0xFFFFFFFF, 0x28000)] == \
        ["0.25", "1.0", "0.04998779296875", "-1", "2.5"]
    assert nhbins(LAYOUTS[(5, 2, 1)], {"lg_tcache_max": 15}) == 41
    assert nhbins(LAYOUTS[(5, 2, 1)], {"lg_tcache_max": 3}) == 36
    assert nhbins(LAYOUTS[(5, 3, 0)], {"tcache_max": 32768}) == 41
    assert nhbins(LAYOUTS[(5, 3, 0)], {"tcache_max": 1000}) == 21
    assert nhbins(LAYOUTS[(5, 3, 0)], {}) is None


def test_an_arena_whose_memory_is_gone_is_a_finding_at_its_address():
    """arenas[] naming an arena the target does not hold: a finding at that address, the others decoded."""
    layout = LAYOUTS[(5, 3, 0)]
    arenas_at, gone, good, base = 0x10000, 0x7f0000000000, 0x20000, 0x80000
    arena = _arena(layout, layout.arena_size + 36 * layout.bin_size)
    struct.pack_into("<I", arena, layout.nthreads, 3)
    struct.pack_into("<Q", arena, layout.nactive, 17)
    struct.pack_into("<Q", arena, layout.base, base)
    mem = ImageMemory({arenas_at: struct.pack("<3Q", good, gone, 0), good: arena, base: bytes(4096)})
    disc = JeDiscovery((5, 3, 0), "5.3.0-test", layout, "libjemalloc.so.2", 0, arenas_at, 3, None)
    state = collect_jemalloc(mem, disc, [ThreadRegs(1, 100, 0x1000)])
    assert [(a.index, a.nthreads, a.pactive) for a in state.arenas] == [(0, 3, 17)]
    assert [(f.severity, f.kind, f.address) for f in state.findings] == [(Severity.ERROR, Kind.ARENA, gone)]
    assert state.threads[0].arena is None and state.threads[0].ticker is None


def test_an_arena_whose_base_and_bins_are_gone_keeps_its_pages_and_names_them():
    """jemalloc 5.2.1's arena with its base and one bin shard where the target has nothing: its page counters
    are decoded, and a finding at the base and at the bin says which figures leave them out."""
    layout = LAYOUTS[(5, 2, 1)]
    arenas_at, arena_at, shards, gone_base, gone_bin = 0x10000, 0x20000, 0x90000, 0x7f0000000000, 0x7f1000000000
    arena = _arena(layout, layout.arena_size)
    struct.pack_into("<Q", arena, layout.nactive, 5)
    struct.pack_into("<Q", arena, layout.base, gone_base)
    for i in range(36):
        struct.pack_into("<Q", arena, layout.bins + 8 * i, gone_bin if i == 7 else shards)
    mem = ImageMemory({arenas_at: struct.pack("<Q", arena_at), arena_at: arena, shards: bytes(layout.bin_size)})
    disc = JeDiscovery((5, 2, 1), "5.2.1-test", layout, "libjemalloc.so.2", 0, arenas_at, 1, None)
    state = collect_jemalloc(mem, disc, [])
    (a,) = state.arenas
    assert a.pactive == 5 and a.resident == 5 * 4096 and a.mapped == 0
    assert sorted(f.address for f in state.all_findings()) == [gone_base, gone_bin]
    assert all(f.severity is Severity.ERROR and f.kind is Kind.ARENA for f in state.all_findings())


@pytest.mark.parametrize("suite", JEMALLOC_BUILDS)
def test_threads_and_arenas_say_it_in_text(decoded, suite):
    """'heapwalk threads' lists each thread's arena and ticker; 'heapwalk arenas' ends with the arenas that
    never decay, named with their remedy (5.2.1), and with none under 5.3.0."""
    cap = capture_jemalloc(suite, "je_dns")
    result = run_gdb([str(cap.exe), str(cap.core)], ["heapwalk threads", "heapwalk arenas"], iex=[NO_SYMBOLS])
    out = " ".join(result.stdout.split())
    assert result.returncode == 0 and "Traceback" not in out + result.stderr
    assert "jemalloc threads" in out and "never initialised" in out and "decay ticker" in out
    doc, stats, ledger = decoded(suite)
    free_first = [t for t in ledger["threads"] if t["role"] == "free_first"]
    warned = [f"arena {t['arena']} at " for t in free_first if f"warning: arena {t['arena']} at " in out]
    if _old(suite):
        assert len(warned) == len(free_first) == 3 and "MALLOC_CONF=dirty_decay_ms:0" in out
    else:
        assert not warned and "never been purged" not in out


#: the builds the command line runs on: one of each kind (Debian's shared libraries, one linked in, Redis's
#: prefix and quantum, sid's on its own glibc, whose core names ld.so as its program, a debug build); every
#: build is decoded in gdb by the tests around
JEMALLOC_CLI = (*JEMALLOCS, "bullseye-linked", "redis-5.2.1", "sid", "5.3.0-debug")


@pytest.mark.parametrize("suite", JEMALLOC_CLI)
def test_the_command_line_reports_a_jemalloc_core(suite, tmp_path):
    """'heapwalk report CORE' on a jemalloc core: where the memory is, the threads and the verdict, the JSON
    with the report in it, and --xml refused in one line (malloc_info's XML is glibc's) unless glibc's malloc
    is used beside (a program that calls jemalloc under a prefix)."""
    cap = capture_jemalloc(suite, "je_dns")
    cli = Path(sys.executable).with_name("heapwalk")
    out = tmp_path / "report.json"
    result = subprocess.run([str(cli), "report", str(cap.core), "--no-symbols", "--json", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "where the memory is" in text and "jemalloc threads" in text and "verdict:" in text
    doc = json.loads(out.read_text())
    assert doc["allocator"] == "jemalloc" and len(doc["jemalloc"]["arenas"]) == 8
    assert doc["report"]["verdict"][0].startswith("Held free by jemalloc")
    refused = subprocess.run([str(cli), "report", str(cap.core), "--xml", str(tmp_path / "x.xml")],
                             capture_output=True, text=True, timeout=300)
    if "glibc" in doc.get("allocators", []):     # glibc's malloc used beside jemalloc: its XML is written
        assert refused.returncode == 0 and (tmp_path / "x.xml").read_text().startswith("<malloc version=")
    else:
        assert refused.returncode == 2 and "malloc_info XML" in refused.stderr and "Traceback" not in refused.stderr


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """reported(suite) -> (the report's text, its JSON) of je_dns on SUITE's jemalloc."""
    tmp = tmp_path_factory.mktemp("jereport")

    @functools.cache
    def compute(suite: str):
        return _gdb_json(tmp, suite, "report")
    return compute


@pytest.mark.parametrize("suite", JEMALLOC_BUILDS)
def test_the_report_puts_every_mapped_byte_of_every_arena_somewhere(reported, decoded, suite):
    """Per arena: in use, free in thread caches, slabs, dirty and muzzy pages, and metadata add up to what
    malloc_stats_print calls mapped; the regions the caches hold count in the arena they came from (the
    workers freed all they allocated, so their arenas have nothing in use; the blocks the main thread
    allocated for them sit in their caches, counted in arena 0)."""
    text, doc = reported(suite)
    _, stats, ledger = decoded(suite)
    rows = {a["number"]: a for a in doc["report"]["arenas"]}
    for index, row in rows.items():
        assert row["balanced"], row
        assert row["in_use"] + sum(row["free"].values()) + row["overhead"] == row["system"]
        assert row["system"] == stats["stats.arenas"][str(index)]["mapped"] or index in (0, ledger["stats_arena"])
        printed = stats["stats.arenas"][str(index)]
        assert row["free"]["dirty"] == printed["pdirty"] * 4096
    workers = [t for t in ledger["threads"] if t["role"] in ("free_first", "malloc_first")]
    assert all(rows[t["arena"]]["in_use"] == 0 for t in workers)
    threads = doc["jemalloc"]["threads"]
    assert sum(r["free"]["tcache"] for r in rows.values()) == sum(t["tcache"]["bytes"] for t in threads)
    from_main = sum(o["bytes"] for t in threads for o in t["tcache"]["from_arenas"] if o["arena"] == 0)
    assert rows[0]["free"]["tcache"] == from_main > 0
    assert doc["report"]["totals"]["trim"] == sum(a["pdirty"] + a["pmuzzy"] for a in doc["jemalloc"]["arenas"]) * 4096
    assert "where the memory is" in text and "decay frees" in text and "slabs by size class" in text
    buffer = ledger["stats_buffer"]
    printer = buffer["size"] if buffer is not None and buffer["internal"] else 0   # counted while it printed
    assert doc["report"]["metadata"]["metadata"] == stats["stats"]["metadata"] - printer
    assert "metadata (malloc_stats_print's): " in text


@pytest.mark.parametrize("suite", JEMALLOC_BUILDS)
def test_the_verdict_names_the_arenas_that_do_not_decay_and_the_remedies(reported, decoded, suite):
    """Under 5.2.1 the verdict says which arenas never purge, why, and dirty_decay_ms among the remedies with
    their cost; under 5.3.0 every worker arena's dirty pages are said to decay."""
    text, doc = reported(suite)
    _, _, ledger = decoded(suite)
    verdict = doc["report"]["verdict"]
    assert verdict[0].startswith("Held free by jemalloc, not a leak")
    assert "how much of the free memory is in RAM a plain core does not say ('heapwalk capture' does)" in verdict[0]
    free_first = sorted(t["arena"] for t in ledger["threads"] if t["role"] == "free_first")
    stuck = [s for s in verdict if s.startswith("Not decaying")]
    if _old(suite):
        (sentence,) = stuck
        assert f"arenas {', '.join(map(str, free_first))} have never been purged" in sentence
        assert "MALLOC_CONF=dirty_decay_ms:0" in sentence and "background_thread:true" in sentence
        assert "at each thread's start" in sentence and "jemalloc 5.3" in sentence
    else:
        assert not stuck
        assert any("will be returned gradually over dirty_decay_ms (100 ms)" in s for s in verdict)
    assert any("retained (opt.retain)" in s for s in verdict)
    assert "verdict:" in text


def test_the_command_line_diffs_jemalloc_snapshots(reported, tmp_path):
    """'heapwalk diff' on two jemalloc reports: the same one twice shows nothing grown; an arena whose dirty
    pages grew in B is named with its growth."""
    _, doc = reported("bookworm")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(doc))
    grown = json.loads(json.dumps(doc))
    row = grown["report"]["arenas"][2]
    row["free"]["dirty"] += 8 << 20
    row["system"] += 8 << 20
    b.write_text(json.dumps(grown))
    cli = Path(sys.executable).with_name("heapwalk")
    same = subprocess.run([str(cli), "diff", str(a), str(a), "--json", str(tmp_path / "same.json")],
                          capture_output=True, text=True, timeout=120)
    assert same.returncode == 0, same.stderr
    assert json.loads((tmp_path / "same.json").read_text())["grew"] == []
    diffed = subprocess.run([str(cli), "diff", str(a), str(b), "--json", str(tmp_path / "d.json")],
                            capture_output=True, text=True, timeout=120)
    assert diffed.returncode == 0, diffed.stderr
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["grew"] == [row["number"]] and d["growth"]["system"] == d["growth"]["free"] == 8 << 20


@pytest.mark.parametrize("suite", JEMALLOC_BUILDS)
def test_check_finds_a_real_jemalloc_core_consistent(suite, tmp_path):
    """'heapwalk check' on je_dns: every counter agrees and every cached region lies in a slab (or a large
    extent) of its bin's class; warnings (the arenas that never decay) do not make it damaged."""
    cap = capture_jemalloc(suite, "je_dns")
    out = tmp_path / "check.json"
    result = run_gdb([str(cap.exe), str(cap.core)], [f"heapwalk check --json {out}", "p $heapwalk_errors"],
                     iex=[NO_SYMBOLS])
    assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr, result.stderr
    doc = json.loads(out.read_text())
    assert doc["allocator"] == "jemalloc" and doc["clean"] and doc["errors"] == 0
    assert doc["checked"]["cached_regions"] > 5000 and doc["checked"]["arenas"] == 8
    assert doc["warnings"] == (3 if _old(suite) else 0)
    assert "$1 = 0" in result.stdout


def test_check_names_a_double_free_and_a_counter_that_disagrees():
    """A region cached by two threads is a double free at its address, a region whose extent is of another
    size class (a 64-byte bin's region in a 32-byte slab) is named with both classes, and a bin whose regions in use are not its allocations less its
    frees is an error at its arena."""
    from heapwalk.jemalloc.check import check_jemalloc
    layout = LAYOUTS[(5, 3, 0)]
    arenas_at, arena_at, base, rtree, leaf, extent, slab = 0x10000, 0x40000, 0x90000, 0x1000000, 0x2000000, \
        0x3000000, 0x7f0000400000
    arena = _arena(layout, layout.arena_size + 36 * layout.bin_size)
    struct.pack_into("<Q", arena, layout.base, base)
    bin3 = layout.bins + 3 * layout.bin_size + layout.bin_stats
    struct.pack_into("<4Q", arena, bin3, 10, 2, 10, 7)         # nmalloc 10, ndalloc 2, nrequests, curregs 7
    struct.pack_into("<Q", arena, bin3 + 64, 1)                # curslabs 1
    root = bytearray(8 * 0x40000)
    struct.pack_into("<Q", root, 8 * ((slab >> 30) & 0x3FFFF), leaf)
    leaf_bytes = bytearray(8 * 0x40000)
    struct.pack_into("<Q", leaf_bytes, 8 * ((slab >> 12) & 0x3FFFF), (2 << 48) | extent | 1)   # class 2 slab
    mem = ImageMemory({arenas_at: struct.pack("<Q", arena_at), arena_at: arena, base: bytes(4096),
                       rtree: bytes(layout.rtree_root) + root, leaf: leaf_bytes, extent: struct.pack("<Q", 0)})
    threads, stacks = [], 0x500000
    for number in (1, 2):
        fs = 0x800000 * number
        tsd = bytearray(layout.tsd_size)
        tsd[layout.tsd_state] = 0
        struct.pack_into("<Q", tsd, layout.tsd_arena, arena_at)
        struct.pack_into("<Q", tsd, layout.tsd_tcache_arena, arena_at)
        stack = stacks + 0x1000 * number
        struct.pack_into("<Q", tsd, layout.tsd_tcache_bins[0] + 24 * 2, stack)            # bin 2 (32 B)
        struct.pack_into("<H", tsd, layout.tsd_tcache_bins[0] + 24 * 2 + 20, (stack + 8) & 0xFFFF)
        struct.pack_into("<Q", tsd, layout.tsd_tcache_bins[0] + 24 * 4, stack + 0x100)    # bin 4 (64 B)
        struct.pack_into("<H", tsd, layout.tsd_tcache_bins[0] + 24 * 4 + 20, (stack + 0x108) & 0xFFFF)
        mem.add(fs - 0x1000, bytes(tsd))
        mem.add(stack, struct.pack("<Q", slab) + bytes(0xF8) + struct.pack("<Q", slab + 0x40))
        threads.append(ThreadRegs(number, 100 + number, fs))
    disc = JeDiscovery((5, 3, 0), "5.3.0-test", layout, "libjemalloc.so.2", 0, arenas_at, 1, -0x1000,
                       opt={"tcache_max": 32768}, rtree=rtree)
    state = collect_jemalloc(mem, disc, threads)
    findings = check_jemalloc(state)
    kinds = {(f.kind, f.address) for f in findings}
    assert (Kind.DOUBLE_FREE, slab) in kinds and (Kind.DOUBLE_FREE, slab + 0x40) in kinds
    assert (Kind.TCACHE_SIZE, slab + 0x40) in kinds and (Kind.TCACHE_SIZE, slab) not in kinds
    assert (Kind.ARENA, arena_at) in kinds
    assert all(f.severity is Severity.ERROR for f in findings)


def test_an_arena_whose_containers_are_overwritten_is_named():
    """An arena whose extent containers do not say dirty, muzzy, retained (1, 2, 3): its structure is
    overwritten, and a finding at the dirty container's state says so."""
    layout = LAYOUTS[(5, 3, 0)]
    arenas_at, arena_at, base = 0x10000, 0x40000, 0x90000
    arena = _arena(layout, layout.arena_size + 36 * layout.bin_size)
    struct.pack_into("<I", arena, layout.muzzy_state, 7)
    struct.pack_into("<Q", arena, layout.base, base)
    mem = ImageMemory({arenas_at: struct.pack("<Q", arena_at), arena_at: arena, base: bytes(4096)})
    disc = JeDiscovery((5, 3, 0), "5.3.0-test", layout, "libjemalloc.so.2", 0, arenas_at, 1, None)
    (a,) = collect_jemalloc(mem, disc, []).arenas
    assert [(f.kind, f.address, f.found) for f in a.findings] == [(Kind.ARENA, arena_at + layout.dirty_state,
                                                                   "[1, 7, 3]")]


@pytest.mark.parametrize("suite", JEMALLOC_BUILDS[:2])
def test_bins_and_tcache_show_jemallocs_own(decoded, suite, tmp_path):
    """'heapwalk bins' lists each arena's bins by size class, 'heapwalk tcache' each thread's cache, the same
    figures as the arenas' document; glibc's arguments are refused in one line when glibc's malloc is unused."""
    cap = capture_jemalloc(suite, "je_dns")
    bins, caches = tmp_path / "bins.json", tmp_path / "tcache.json"
    result = run_gdb([str(cap.exe), str(cap.core)], [f"heapwalk bins --json {bins}", f"heapwalk tcache --json "
                                                     f"{caches}", "heapwalk bins --arena 1"], iex=[NO_SYMBOLS])
    text = " ".join(result.stdout.split())
    assert result.returncode == 0 and "Traceback" not in text + result.stderr, result.stderr
    doc, _, _ = decoded(suite)
    shown = {a["index"]: {b["size"]: b["curregs"] for b in a["bins"]} for a in json.loads(bins.read_text())["arenas"]}
    assert shown == {a["index"]: {b["size"]: b["curregs"] for b in a["bins"] if b["nmalloc"] or b["curslabs"]}
                     for a in doc["jemalloc"]["arenas"]}
    cached = {t["number"]: t["bytes"] for t in json.loads(caches.read_text())["threads"]}
    assert cached == {t["number"]: t["tcache"]["bytes"] for t in doc["jemalloc"]["threads"]
                      if t["tcache"]["arena"] is not None}
    assert "jemalloc arena 1 bins" in text and "jemalloc arena 0 bins" not in text.split("tcache of arena")[-1]


@pytest.mark.parametrize("suite", ["bullseye", "bookworm-linked"])
def test_the_decay_clock_says_which_arenas_are_overdue(suite, tmp_path):
    """je_dns stopped at its snapshot, read live (its clock is the machine's): each arena's decay epoch lies
    before the snapshot and its deadline one step (dirty_decay_ms / 200) plus jitter of less than a step after
    it; the arenas that decay but whose threads are idle are named overdue. Its core says the clock is not
    known."""
    jemalloc = harness.prepare_jemalloc(SYSROOTS, suite)
    exe = harness.build("je_dns", BINDIR, jemalloc=jemalloc)
    env = {**jemalloc.environment(), **harness._options_named(jemalloc, "je_dns")}
    proc = harness.run_to_snapshot(exe, tmp_path / "run", env=env)
    out = tmp_path / "report.json"
    try:
        result = run_gdb(["-p", str(proc.pid)], [f"heapwalk report --json {out}"], iex=[NO_SYMBOLS])
    finally:
        proc.kill()
        proc.wait()
    assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr, result.stderr
    doc = json.loads(out.read_text())
    clock = doc["jemalloc"]["clock_ns"]
    assert clock > 0
    stepped = [a for a in doc["jemalloc"]["arenas"] if a["decay_clock"]["dirty_epoch_ns"]]
    assert len(stepped) >= 7
    for a in stepped:
        epoch, deadline = a["decay_clock"]["dirty_epoch_ns"], a["decay_clock"]["dirty_deadline_ns"]
        step = a["dirty_decay_ms"] * 1_000_000 // 200
        assert epoch < clock and step <= deadline - epoch < 2 * step, a["index"]
    late = [s for s in doc["report"]["verdict"] if s.startswith("Overdue: the decay of arena")]
    assert len(late) == 1 and "and the next call purges them at once" in late[0]
    stuck = {f["address"] for f in doc["findings"] if f["kind"] == "no_decay"}
    decaying = [a for a in doc["jemalloc"]["arenas"] if a["pdirty"] and a["address"] not in stuck]
    assert f"{'arena' if len(decaying) == 1 else 'arenas'} {', '.join(str(a['index']) for a in decaying)} (" in late[0]
    _, core_doc = _gdb_json(tmp_path, suite, "report")
    assert core_doc["jemalloc"]["clock_ns"] is None
    assert any(s.startswith("Whether their decay is overdue is not known") for s in core_doc["report"]["verdict"])


@pytest.mark.parametrize("suite", ["bullseye", "bookworm-linked"])
def test_a_capture_shows_each_arenas_rss(suite, tmp_path):
    """'heapwalk capture PID' of je_dns at its snapshot: each jemalloc arena's RSS (its extents and its base's
    blocks, from the page map) and its free bytes in RAM, within its mapped bytes and its free bytes, adding up
    to no more than the anonymous memory the process has in RAM; the decay clock is the capture's."""
    jemalloc = harness.prepare_jemalloc(SYSROOTS, suite)
    exe = harness.build("je_dns", BINDIR, jemalloc=jemalloc)
    proc = harness.run_to_snapshot(exe, tmp_path / "run", env={**jemalloc.environment(),
                                                               **harness._options_named(jemalloc, "je_dns")})
    cli = Path(sys.executable).with_name("heapwalk")
    try:
        result = subprocess.run([str(cli), "capture", str(proc.pid), "--out", str(tmp_path / "out"), "--no-symbols"],
                                capture_output=True, text=True, timeout=600)
    finally:
        proc.kill()
        proc.wait()
    assert result.returncode == 0, result.stderr
    assert "RSS per arena: not shown" not in result.stdout + result.stderr
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    record = json.loads((tmp_path / "out" / "capture.json").read_text())
    rows = doc["report"]["arenas"]
    assert doc["report"]["residency"] and all(r["rss"] is not None for r in rows)
    for r in rows:
        assert 0 < r["rss"] <= r["system"] and r["free_resident"] <= sum(r["free"].values()), r
    dirty = sum(r["free"]["dirty"] for r in rows)
    assert sum(r["free_resident"] for r in rows) > dirty // 2          # the freed pages are still in RAM
    anonymous = sum(m["rss"] for m in record["smaps"] if "w" in m["perms"] and not m["name"].startswith("/"))
    assert sum(r["rss"] for r in rows) <= anonymous
    assert doc["jemalloc"]["clock_ns"]
    # each arena was made since the reproducer started, seconds before (its uptime on the capture's clock)
    assert all(0 < a["uptime_ns"] < 600 * 10**9 for a in doc["jemalloc"]["arenas"])
    assert " RSS " in result.stdout and "free in RAM" in result.stdout
    # the verdict's headline says how much of the free memory is in RAM, the figure of the arena table
    free_ram = sum(r["free_resident"] for r in rows)
    headline = doc["report"]["verdict"][0]
    assert headline.startswith("Held free by jemalloc") and "still resident" not in headline
    assert f"{human(free_ram)} of the free memory is in RAM" in headline, headline


@pytest.mark.parametrize("suite", JEMALLOCS)
def test_chunk_names_the_region_slab_extent_and_use(suite, tmp_path):
    """'heapwalk chunk ADDRESS' on the blocks je_dns's main thread allocated for its workers (64 + 16 i bytes,
    each freed by its worker): the region is the block itself, of the smallest class that holds it, in a slab
    of the arena it came from, and free (in the slab, or held by a thread's cache); an address inside a block
    names the same region; an address outside jemalloc is refused in one line."""
    cap = capture_jemalloc(suite, "je_dns")
    outs = [tmp_path / f"{i}.json" for i in range(6)]
    commands = [f"heapwalk chunk first_blocks[{i}] --json {out}" for i, out in enumerate(outs)]
    commands += [f"heapwalk chunk (char*)first_blocks[3]+21 --json {tmp_path / 'inside.json'}",
                 "heapwalk chunk &first_blocks"]
    result = run_gdb([str(cap.exe), str(cap.core)], commands, iex=[NO_SYMBOLS])
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    classes = (64, 80, 96, 112, 128, 160)
    for i, out in enumerate(outs):
        doc = json.loads(out.read_text())
        assert doc["kind"] == "slab" and doc["region"] == doc["address"] and doc["offset"] == 0, doc
        assert doc["size_class"] == classes[i] and doc["arena"] == 0 and doc["extent_state"] == "active"
        assert doc["use"] in ("free", "free: in a thread's cache"), doc
    inside = json.loads((tmp_path / "inside.json").read_text())
    assert inside["region"] == json.loads(outs[3].read_text())["region"] and inside["offset"] == 21
    assert "is in no extent of jemalloc's" in result.stderr or "no arena's heap" in result.stderr
