"""heapwalk on real reproducer cores, checked against glibc's malloc_info and the ledgers."""

from __future__ import annotations

import json

import pytest

from conftest import run_gdb
from harness import REPRODUCERS
from oracle import malloc_info_view, parse_malloc_info

pytestmark = pytest.mark.cores


def _ledger(cores, name):
    return json.loads(cores[name].ledger.read_text())


@pytest.mark.parametrize("name", REPRODUCERS)
def test_arenas_and_system_mem_match_malloc_info(cores, core_json, name):
    expected = parse_malloc_info(cores[name].malloc_info)
    doc = core_json[name]
    assert [a["number"] for a in doc["arenas"]] == [h["nr"] for h in expected["heaps"]]
    assert [a["system_mem"] for a in doc["arenas"]] == [h["system"]["current"] for h in expected["heaps"]]
    assert [a["max_system_mem"] for a in doc["arenas"]] == [h["system"]["max"] for h in expected["heaps"]]


@pytest.mark.parametrize("name", REPRODUCERS)
def test_every_bin_of_every_arena_matches_malloc_info(cores, core_json, name):
    expected = parse_malloc_info(cores[name].malloc_info)
    got = malloc_info_view(core_json[name])
    for want, have in zip(expected["heaps"], got["heaps"]):
        assert have["sizes"] == want["sizes"], f"heap {want['nr']}: bin lines differ"
        assert have["totals"] == want["totals"], f"heap {want['nr']}: fast/rest totals differ"
        assert have["aspace"] == want["aspace"], f"heap {want['nr']}: aspace differs"
    assert got == expected


@pytest.mark.parametrize("name", REPRODUCERS)
def test_walks_are_complete_and_clean(core_json, name):
    doc = core_json[name]
    assert doc["findings"] == []
    for arena in doc["arenas"]:
        assert arena["findings"] == [], arena["findings"]
    for thread in doc["threads"]:
        if thread["tcache"]:
            assert thread["tcache"]["findings"] == []


@pytest.mark.parametrize("name", REPRODUCERS)
def test_tcache_of_every_thread_matches_the_ledger(cores, core_json, name):
    ledger = _ledger(cores, name)
    threads = {t["lwp"]: t for t in core_json[name]["threads"]}
    assert len(threads) == len(ledger["threads"]), "every live thread is in the ledger and in the core"
    for lt in ledger["threads"]:
        t = threads[lt["tid"]]
        want = {b["chunk_size"]: b["entries"] for b in lt["tcache"]}
        have = {b["chunk_size"]: b["entries"] for b in t["tcache"]["bins"]} if t["tcache"] else {}
        assert have == want, f"thread {lt['tid']} ({lt['label']})"
        for b in (t["tcache"]["bins"] if t["tcache"] else []):
            assert b["count"] == len(b["entries"])


@pytest.mark.parametrize("name", REPRODUCERS)
def test_each_thread_uses_the_arena_its_chunks_came_from(cores, core_json, name):
    ledger = _ledger(cores, name)
    doc = core_json[name]
    arenas = {a["address"]: a for a in doc["arenas"]}
    threads = {t["lwp"]: t for t in doc["threads"]}
    for lt in ledger["threads"]:
        arena = arenas[threads[lt["tid"]]["arena"]]
        assert (arena["kind"] == "thread") == lt["non_main_arena"]
        if lt["non_main_arena"]:
            assert any(h["address"] <= lt["held"] < h["address"] + h["size"] for h in arena["heaps"])


def test_bins_core_has_every_kind_of_free_list(core_json):
    (arena,) = core_json["bins"]["arenas"]
    bins = arena["bins"]
    assert [fb["count"] for fb in bins["fast"] if fb["count"]] == [5, 3]
    assert bins["unsorted"]["count"] == 3
    assert len(bins["small"]) >= 2
    large65 = next(b for b in bins["large"] if b["index"] == 65)
    assert large65["count"] == 4 and large65["min_size"] == 0x440 and large65["max_size"] == 0x470
    assert arena["last_remainder"] in bins["unsorted"]["chunks"]
    (main,) = core_json["bins"]["threads"]
    counts = {b["chunk_size"]: b["count"] for b in main["tcache"]["bins"]}
    assert counts[0x20] == 7 and 0 < counts[0x30] < 7


def test_thread_arenas_core_has_eight_thread_arenas_with_free_chunks(core_json):
    thread_arenas = [a for a in core_json["thread_arenas"]["arenas"] if a["kind"] == "thread"]
    assert len(thread_arenas) == 8
    with_free = [a for a in thread_arenas if a["bins"]["unsorted"]["count"] + len(a["bins"]["small"])
                 + len(a["bins"]["large"]) > 0]
    assert len(with_free) >= 4


def test_second_heap_arena_has_two_heaps_chained_by_prev(core_json):
    (arena,) = [a for a in core_json["second_heap"]["arenas"] if a["kind"] == "thread"]
    newest, oldest = arena["heaps"]
    assert newest["prev"] == oldest["address"] and oldest["prev"] == 0
    assert oldest["address"] + 0x30 == arena["address"]
    assert arena["system_mem"] == newest["size"] + oldest["size"]


def test_many_arenas_core_reaches_the_limit_and_shares_arenas(cores, core_json):
    ledger = _ledger(cores, "many_arenas")
    doc = core_json["many_arenas"]
    assert len(doc["arenas"]) == ledger["facts"]["arena_limit"]
    attached = [a["attached_threads"] for a in doc["arenas"] if a["kind"] == "thread"]
    assert max(attached) > 1, "some arenas are shared by several threads"
    users = {}
    for t in doc["threads"]:
        users[t["arena"]] = users.get(t["arena"], 0) + 1
    for a in doc["arenas"]:
        if a["kind"] == "thread":
            assert a["attached_threads"] == users.get(a["address"], 0), "attached_threads counts live users"
            assert a["on_free_list"] == (a["attached_threads"] == 0)


def test_mmapped_core_moved_the_dynamic_threshold(cores, core_json):
    mp = core_json["mmapped"]["mp"]
    ledger = _ledger(cores, "mmapped")
    assert mp["n_mmaps"] == len(ledger["mmapped"])
    assert mp["mmap_threshold"] > 512 * 1024 > ledger["facts"]["heap_allocated_request"] - 1
    assert mp["trim_threshold"] == 2 * mp["mmap_threshold"]
    assert mp["no_dyn_threshold"] == 0


def test_small_vectors_core_has_full_fastbins_and_tcache(core_json):
    (arena,) = core_json["small_vectors"]["arenas"]
    assert sum(fb["count"] for fb in arena["bins"]["fast"]) > 1000
    (main,) = core_json["small_vectors"]["threads"]
    assert any(b["count"] == 7 for b in main["tcache"]["bins"])


def test_tables_read_well_in_a_batch_log(cores):
    c = cores["thread_arenas"]
    result = run_gdb([str(c.exe), str(c.core)], ["heapwalk arenas", "heapwalk bins --arena 1", "heapwalk tcache"])
    out = result.stdout
    assert result.returncode == 0, result.stderr
    assert "\x1b[" not in out, "no terminal escapes in logs"
    assert "glibc 2.36" in out and "9 arenas" in out
    assert "arena 1 (thread)" in out
    assert "tcache per thread" in out
