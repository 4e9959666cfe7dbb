"""jemalloc on arm64: cores/jemalloc's reproducers built with Debian's aarch64 cross compiler and run under qemu-user
on Debian bookworm's arm64 libjemalloc2 (5.3.0, built for 64 KiB pages: 52 small classes, 8192-region slabs, a
radix tree of two 16-bit levels, every global reached through the GOT), their cores completed as an arm64 kernel
writes them (cores/scripts/foreign.py), read here by gdb-multiarch with symbols hidden: every arena, bin, option
and thread cache what malloc_stats_print printed, each thread's arena and decay ticker the ledger's, the report's
rows balanced, the check sound and the leaks the ledger's."""

from __future__ import annotations

import functools
import json

import pytest

from conftest import capture_foreign, foreign_root, foreign_settings, heapwalk, run_gdb
from oracle import jemalloc_arena_view, jemalloc_printed_view

pytestmark = pytest.mark.cores

PAGE = 65536


@functools.cache
def _dns() -> tuple[dict, dict, dict, str]:
    """(report --json, the printed statistics, the ledger, the text) of je_dns's core through gdb-multiarch."""
    cap = capture_foreign("je_dns")
    out = cap.directory / "heapwalk-report.json"
    result = run_gdb([str(cap.exe), str(cap.core)], [f"heapwalk report --json {out}", "heapwalk report"],
                     iex=foreign_settings(False), gdb="gdb-multiarch", timeout=600)
    assert out.exists() and "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return (json.loads(out.read_text()), json.loads((cap.directory / "stats.json").read_text())["jemalloc"],
            json.loads((cap.directory / "ledger.json").read_text()), " ".join(result.stdout.split()))


def test_the_64k_page_build_is_found_without_symbols():
    doc, stats, _ledger, _text = _dns()
    je = doc["jemalloc"]
    assert je["version"] == stats["version"] and je["layout"] == "jemalloc 5.3.0 for 64 KiB pages"
    assert je["page"] == stats["arenas"]["page"] == PAGE
    assert doc["discovery"]["build"]["value"]["nbins"] == stats["arenas"]["nbins"] == 52
    assert doc["discovery"]["rtree"]["value"] is not None
    assert "two levels (48-bit addresses)" in doc["discovery"]["rtree"]["found_by"]
    assert doc["discovery"]["tsd_tls_offset"]["value"] is not None
    assert doc["findings"] == []


def test_every_arena_bin_and_option_is_what_malloc_stats_print_printed():
    """Per arena and per bin, to the page and the region (the arena the reproducer printed from left out:
    printing changed it); the printer's 64 KiB buffer, a small class here, taken back from arena 0."""
    doc, stats, ledger, _text = _dns()
    sizes = [b["size"] for b in stats["arenas"]["bin"]]
    compared = 0
    for arena in doc["jemalloc"]["arenas"]:
        if arena["index"] == ledger["stats_arena"]:
            continue
        printed = stats["stats.arenas"][str(arena["index"])]
        assert jemalloc_arena_view(arena, printed) == jemalloc_printed_view(printed, arena["index"], ledger, sizes)
        compared += 1
    assert compared == 7
    assert [(b["size"], b["nregs"]) for b in doc["jemalloc"]["arenas"][0]["bins"]] == \
        [(b["size"], b["nregs"]) for b in stats["arenas"]["bin"]]
    opt = doc["jemalloc"]["opt"]
    assert {k: opt.get(k, "missing") for k in stats["opt"]} == stats["opt"]
    assert opt["max_background_threads"] == ledger["opt.max_background_threads"]


def test_each_thread_has_its_arena_ticker_and_cache():
    doc, stats, ledger, _text = _dns()
    threads = {t["lwp"]: t for t in doc["jemalloc"]["threads"]}
    for entry in ledger["threads"]:
        t = threads[entry["lwp"]]
        if entry["role"] == "idle":
            assert t["state"] == 6 and t["arena"] is None and not t["decay_ticker"]
        elif entry["role"] == "main":
            assert t["arena"] == ledger["stats_arena"]
        else:
            assert (t["state"], t["arena"], t["decay_ticker"]) == (0, entry["arena"], True)
            arena = next(a for a in doc["jemalloc"]["arenas"] if a["index"] == entry["arena"])
            assert arena["dirty_decay_ms"] == 100 and arena["dirty_npurge"] > 0     # 5.3.0: every ticker purges
    for arena in doc["jemalloc"]["arenas"]:
        printed = stats["stats.arenas"][str(arena["index"])]["tcache_bytes"]
        assert arena["tcache_bytes"] == printed
        assert sum(t["tcache"]["bytes"] for t in threads.values() if t["tcache"]["arena"] == arena["index"]) == printed


def test_the_report_counts_pages_of_64k_and_balances_every_arena():
    doc, stats, ledger, text = _dns()
    rows = {a["number"]: a for a in doc["report"]["arenas"]}
    for index, row in rows.items():
        printed = stats["stats.arenas"][str(index)]
        assert row["balanced"] and row["in_use"] + sum(row["free"].values()) + row["overhead"] == row["system"]
        assert row["free"]["dirty"] == printed["pdirty"] * PAGE
        assert row["system"] == printed["mapped"] or index in (0, ledger["stats_arena"])
    assert sum(r["free"]["dirty"] for r in rows.values()) >= 16 * PAGE      # the workers' freed zones, in part
    buffer = ledger["stats_buffer"]
    assert doc["report"]["metadata"]["metadata"] == stats["stats"]["metadata"] - buffer["size"] * buffer["internal"]
    assert "will be returned gradually over dirty_decay_ms (100 ms)" in text


def test_check_finds_the_core_consistent():
    cap = capture_foreign("je_dns")
    out = cap.directory / "heapwalk-check.json"
    result = run_gdb([str(cap.exe), str(cap.core)], [f"heapwalk check --json {out}", "p $heapwalk_errors"],
                     iex=foreign_settings(False), gdb="gdb-multiarch", timeout=600)
    doc = json.loads(out.read_text())
    assert doc["clean"] and doc["errors"] == doc["warnings"] == 0, doc
    assert doc["checked"]["arenas"] == 8 and doc["checked"]["cached_regions"] > 5000
    assert "$1 = 0" in result.stdout


def test_the_leaked_allocations_are_the_ledgers():
    """je_leak: every leaked allocation of the ledger found with what it holds, none reached leaked, and the
    printer's buffer the snapshot takes back and drops the one other."""
    cap = capture_foreign("je_leak")
    out = cap.directory / "heapwalk-leaks.json"
    result = run_gdb([str(cap.exe), str(cap.core)], [f"heapwalk leaks --json {out}"], iex=foreign_settings(False),
                     gdb="gdb-multiarch", timeout=600)
    assert "Traceback" not in result.stdout + result.stderr
    doc = json.loads(out.read_text())
    ledger = json.loads((cap.directory / "leaks.json").read_text())
    buffer = json.loads((cap.directory / "ledger.json").read_text())["stats_buffer"]
    found = {entry["address"]: entry for entry in doc["leaked"]}
    want = {address: (bool(unreferenced), count, size) for address, unreferenced, count, size in ledger["leaked"]}
    assert [(e["arena"], e["size"]) for a, e in found.items() if a not in want] == [(buffer["arena"], buffer["size"])]
    assert len(want) == 3 * 310 and set(want) <= set(found) and not set(ledger["reached"]) & set(found)
    for address, (unreferenced, count, size) in want.items():
        assert found[address]["unreferenced"] is unreferenced, hex(address)
        if unreferenced:
            assert (found[address]["holds_count"], found[address]["holds_bytes"]) == (count, size), hex(address)


def test_the_command_line_reports_it_with_the_sysroot():
    cap = capture_foreign("je_hold")
    result = heapwalk("report", str(cap.core), str(cap.exe), "--sysroot", str(foreign_root()), "--no-symbols")
    assert result.returncode == 0, result.stdout + result.stderr
    said = " ".join(result.stdout.split())
    assert "jemalloc 5.3.0" in said and "verdict:" in said and "could not" not in said
