"""heapwalk on real reproducer cores of every glibc of the matrix, checked against malloc_info and the ledgers.

Each check runs on every reproducer under every glibc ("system" and the Debian
sysroots; the glibcs built by hand on a subset, conftest.HAND_REPRODUCERS) with
libc's debug symbols hidden, and with them under the system glibc and, for each
other glibc, on every third reproducer, in turn (every case with
HEAPWALK_FULL_MATRIX=1): the symbols only tell heapwalk where what it finds
without them is.
"""

from __future__ import annotations

import json

import pytest

from conftest import FULL_MATRIX, GLIBCS, HAND_REPRODUCERS, HAND_SUBSET, TUNED_CASES, capture, glibc, run_gdb
from harness import REPRODUCERS
from oracle import malloc_info_view, parse_malloc_info

pytestmark = pytest.mark.cores

CASES = [pytest.param(g, n, "", id=f"{g}-{n}") for g in GLIBCS for n in REPRODUCERS] + \
    [pytest.param(g, "tuned", v, id=f"{g}-tuned-{v}") for g, v in TUNED_CASES if v] + \
    [pytest.param(g, n, "", id=f"{g}-{n}") for g in HAND_SUBSET for n in HAND_REPRODUCERS]
SYMBOLS = [pytest.param(True, id="symbols"), pytest.param(False, id="nosymbols")]


def _with_symbols(cases: list) -> list:
    """CASES, each with symbols hidden, and with symbols where the subset (module docstring) says."""
    out = []
    for i, case in enumerate(cases):
        g = case.values[0]
        for symbols in (True, False):
            if symbols and not (FULL_MATRIX or g == "system" or i % 3 == 0):
                continue
            out.append(pytest.param(*case.values, symbols, id=f"{case.id}-{'symbols' if symbols else 'nosymbols'}"))
    return out


CASES_SYMBOLS = _with_symbols(CASES)


def _ledger(glibc_name, name, variant=""):
    return json.loads(capture(glibc_name, name, variant).ledger.read_text())


def _malloc_info(glibc_name, name, variant=""):
    return parse_malloc_info(capture(glibc_name, name, variant).malloc_info)


def _version(doc) -> tuple[int, int]:
    major, minor = doc["glibc"]["decoded_as"].split(".")
    return int(major), int(minor)


@pytest.mark.parametrize("g,name,variant,symbols", CASES_SYMBOLS)
def test_arenas_and_system_mem_match_malloc_info(json_of, g, name, variant, symbols):
    expected = _malloc_info(g, name, variant)
    doc = json_of(g, name, symbols, variant)
    assert doc["glibc"]["version"] == glibc(g).version
    assert [a["number"] for a in doc["arenas"]] == [h["nr"] for h in expected["heaps"]]
    assert [a["system_mem"] for a in doc["arenas"]] == [h["system"]["current"] for h in expected["heaps"]]
    assert [a["max_system_mem"] for a in doc["arenas"]] == [h["system"]["max"] for h in expected["heaps"]]


@pytest.mark.parametrize("g,name,variant,symbols", CASES_SYMBOLS)
def test_every_bin_of_every_arena_matches_malloc_info(json_of, g, name, variant, symbols):
    expected = _malloc_info(g, name, variant)
    got = malloc_info_view(json_of(g, name, symbols, variant))
    for want, have in zip(expected["heaps"], got["heaps"]):
        assert have["sizes"] == want["sizes"], f"heap {want['nr']}: bin lines differ"
        assert have["totals"] == want["totals"], f"heap {want['nr']}: fast/rest totals differ"
        assert have["aspace"] == want["aspace"], f"heap {want['nr']}: aspace differs"
    assert got == expected


@pytest.mark.parametrize("g,name,variant,symbols", CASES_SYMBOLS)
def test_walks_are_complete_and_clean(json_of, g, name, variant, symbols):
    doc = json_of(g, name, symbols, variant)
    assert doc["findings"] == []
    for arena in doc["arenas"]:
        assert arena["findings"] == [], arena["findings"]
    for thread in doc["threads"]:
        if thread["tcache"]:
            assert thread["tcache"]["findings"] == []


@pytest.mark.parametrize("g,name,variant,symbols", CASES_SYMBOLS)
def test_tcache_of_every_thread_matches_the_ledger(json_of, g, name, variant, symbols):
    ledger = _ledger(g, name, variant)
    threads = {t["lwp"]: t for t in json_of(g, name, symbols, variant)["threads"]}
    assert len(threads) == len(ledger["threads"]), "every live thread is in the ledger and in the core"
    for lt in ledger["threads"]:
        t = threads[lt["tid"]]
        want = {b["chunk_size"]: b["entries"] for b in lt["tcache"]}
        have = {b["chunk_size"]: b["entries"] for b in t["tcache"]["bins"] if b["index"] < 64} if t["tcache"] else {}
        assert have == want, f"thread {lt['tid']} ({lt['label']})"
        for b in (t["tcache"]["bins"] if t["tcache"] else []):
            assert b["count"] == len(b["entries"])


@pytest.mark.parametrize("g,name,variant,symbols", CASES_SYMBOLS)
def test_each_thread_uses_the_arena_its_chunks_came_from(json_of, g, name, variant, symbols):
    ledger = _ledger(g, name, variant)
    doc = json_of(g, name, symbols, variant)
    arenas = {a["address"]: a for a in doc["arenas"]}
    threads = {t["lwp"]: t for t in doc["threads"]}
    for lt in ledger["threads"]:
        if not lt["held"]:  # a bystander: never called malloc
            assert threads[lt["tid"]]["arena"] is None
            continue
        arena = arenas[threads[lt["tid"]]["arena"]]
        assert (arena["kind"] == "thread") == lt["non_main_arena"]
        if lt["non_main_arena"]:
            assert any(h["address"] <= lt["held"] < h["address"] + h["size"] for h in arena["heaps"])


@pytest.mark.parametrize("g,name,variant,symbols", CASES_SYMBOLS)
def test_every_arena_accounts_for_its_system_mem_to_the_byte(json_of, g, name, variant, symbols):
    for arena in json_of(g, name, symbols, variant)["arenas"]:
        acc = arena["accounting"]
        assert acc["balanced"] and acc["unwalked"] == 0 and acc["findings"] == [], arena["number"]
        assert sum(acc["bytes"].values()) + acc["overhead"] == arena["system_mem"]
        assert acc["bytes"]["top"] == arena["top"]["size"] and acc["chunks"]["top"] == 1
        assert acc["chunks"]["free_unlisted"] == 0
        for h in arena["heaps"] if arena["kind"] == "thread" else ():
            assert h["size"] + h["mapped_unused"] + h["reserved_unmapped"] == h["reservation"]
            assert h["address"] % h["reservation"] == 0


@pytest.mark.parametrize("g,name,variant", CASES)
def test_the_chunk_walk_meets_every_listed_chunk(json_of, g, name, variant):
    """Every bin, fastbin and tcache entry sits on a chunk boundary of the physical walk, and the chunks the walk
    sees as free (next chunk's PREV_INUSE clear) are exactly those of the regular bins."""
    doc = json_of(g, name, False, variant)
    for arena in doc["arenas"]:
        acc, bins = arena["accounting"], arena["bins"]
        regular = [bins["unsorted"], *bins["small"], *bins["large"]]
        for kind, lists in (("unsorted", [bins["unsorted"]]), ("small", bins["small"]), ("large", bins["large"]),
                            ("fast", bins["fast"])):
            assert acc["chunks"][kind] == sum(b["count"] for b in lists), (arena["number"], kind)
            assert acc["bytes"][kind] == sum(b["bytes"] for b in lists), (arena["number"], kind)
        assert sum(b["count"] for b in regular) == acc["chunks"]["unsorted"] + acc["chunks"]["small"] + \
            acc["chunks"]["large"]
    tcache_entries = sum(t["tcache"]["count"] for t in doc["threads"] if t["tcache"])
    walked_entries = sum(a["accounting"]["chunks"]["tcache"] for a in doc["arenas"])
    heaps = [(h["address"], h["address"] + h["size"]) for a in doc["arenas"] for h in a["heaps"]]
    in_mmapped = sum(1 for t in doc["threads"] if t["tcache"] for b in t["tcache"]["bins"] for e in b["entries"]
                     if not any(lo <= e < hi for lo, hi in heaps))  # 2.43 caches mmapped chunks too
    assert in_mmapped == (1 if name == "large_tcache" and _version(doc) >= (2, 43) else 0)
    assert walked_entries + in_mmapped == tcache_entries
    assert sum(a["accounting"]["chunks"]["tcache_struct"] for a in doc["arenas"]) == \
        sum(1 for t in doc["threads"] if t["tcache"])


@pytest.mark.parametrize("g,name,variant", CASES)
def test_the_trim_estimate_is_the_rss_malloc_trim_gave_back(json_of, g, name, variant):
    """After its core, each reproducer ran malloc_trim(0) and measured its anonymous RSS before and after."""
    doc = json_of(g, name, False, variant)
    measured = json.loads(capture(g, name, variant).trim.read_text())
    drop = measured["rss_anon_before"] - measured["rss_anon_after"]
    estimate = sum(a["trim"]["resident"] for a in doc["arenas"])
    if doc["mp"] and doc["mp"].get("thp_pagesize"):
        # glibc.malloc.hugetlb=1 madvises the heap for transparent huge pages: whether the kernel backed the
        # trimmed range with a huge page (all of it resident) or with the pages the core shows is not in the
        # core, so the drop lies between what the core shows resident and all that trim releases
        released = sum(a["trim"]["total"] for a in doc["arenas"])
        assert estimate - 8192 <= drop <= released + 8192, (estimate, released, drop)
    else:
        assert abs(estimate - drop) <= max(0.01 * drop, 8192), (estimate, drop)
    for a in doc["arenas"]:
        trim, acc = a["trim"], a["accounting"]
        assert trim["resident"] <= trim["total"]
        # what trim releases plus what it keeps is every free byte of the arena, top included
        assert trim["total"] + trim["kept_free"] == acc["free"] + acc["bytes"]["top"] - acc["bytes"]["free_unlisted"]
        assert trim["kept"]["tcache"] == acc["bytes"]["tcache"]


@pytest.mark.parametrize("g", GLIBCS)
def test_trim_frees_the_thread_arenas_but_not_the_small_fragments(json_of, g):
    much = json_of(g, "thread_arenas", False)
    assert sum(a["trim"]["resident"] for a in much["arenas"]) > 4 << 20
    little = json_of(g, "small_vectors", False)
    (arena,) = little["arenas"]
    assert arena["accounting"]["free"] > 1 << 20, "much free memory ..."
    assert arena["trim"]["resident"] < 16 << 10, "... in pieces no trim can return"
    assert arena["trim"]["kept_free"] >= arena["accounting"]["free"] - arena["accounting"]["bytes"]["tcache"]


@pytest.mark.parametrize("g,name,variant", CASES)
def test_mmapped_chunks_found_in_memory_are_those_mp_counts(json_of, g, name, variant):
    doc = json_of(g, name, False, variant)
    found = doc["mmapped"]
    # glibc 2.43 counts 16 bytes too many in mmapped_mem for each mremap of a mmapped chunk
    drift = 16 * _ledger(g, name, variant)["facts"].get("mremaps", 0) if _version(doc) >= (2, 43) else 0
    assert (found["count"], found["bytes"] + drift) == (doc["mp"]["n_mmaps"], doc["mp"]["mmapped_mem"])
    mems = {c["address"] + 16 for c in found["chunks"]}
    assert {m["mem"] for m in _ledger(g, name, variant)["mmapped"]} <= mems
    assert all(c["span"] % 4096 == 0 for c in found["chunks"])


def _without_found_by(doc: dict) -> dict:
    doc = json.loads(json.dumps(doc))
    doc["discovery"] = {k: v["value"] for k, v in doc["discovery"].items()}
    return doc


@pytest.mark.parametrize("g,name,variant", CASES)
def test_json_is_the_same_with_and_without_debug_symbols(json_of, g, name, variant):
    assert _without_found_by(json_of(g, name, False, variant)) == _without_found_by(json_of(g, name, True, variant))


@pytest.mark.parametrize("g", GLIBCS)
def test_heuristics_find_what_the_symbols_find(json_of, g):
    with_symbols, without = json_of(g, "thread_arenas", True), json_of(g, "thread_arenas", False)
    sym, heur = with_symbols["discovery"], without["discovery"]
    assert sym["main_arena"]["found_by"] == "symbol main_arena"
    assert heur["main_arena"]["found_by"].startswith("bin-127 self-link scan")
    assert sym["mp_"]["found_by"] == "symbol mp_"
    assert heur["mp_"]["found_by"].startswith("malloc_par near main_arena: ")
    assert heur["glibc_version"]["found_by"].startswith("banner in libc's read-only data")
    assert "symbol" not in json.dumps(heur)
    for key in ("main_arena", "mp_", "tcache_tls_offset", "thread_arena_tls_offset", "glibc_version"):
        assert heur[key]["value"] == sym[key]["value"], key
    assert [t["tcache_pointer"] for t in without["threads"]] == [t["tcache_pointer"] for t in with_symbols["threads"]]
    assert all(t["tcache_pointer"] for t in without["threads"][1:]), "every worker has a tcache"


@pytest.mark.parametrize("g", GLIBCS)
def test_bins_core_has_every_kind_of_free_list(json_of, g):
    doc = json_of(g, "bins")
    fill = _ledger(g, "bins")["tcache_fill"]
    (arena,) = doc["arenas"]
    bins = arena["bins"]
    if _version(doc) < (2, 43):
        assert [fb["count"] for fb in bins["fast"] if fb["count"]] == [5, 3]
    else:
        assert bins["fast"] == [], "glibc 2.43 has no fastbins"
    assert bins["unsorted"]["count"] == 3
    assert len(bins["small"]) >= 2
    large65 = next(b for b in bins["large"] if b["index"] == 65)
    assert large65["count"] == 4 and large65["min_size"] == 0x440 and large65["max_size"] == 0x470
    assert arena["last_remainder"] in bins["unsorted"]["chunks"]
    (main,) = doc["threads"]
    counts = {b["chunk_size"]: b["count"] for b in main["tcache"]["bins"]}
    assert counts[0x20] == fill and 0 < counts[0x30] < fill


@pytest.mark.parametrize("g", GLIBCS)
def test_thread_arenas_core_has_eight_thread_arenas_with_free_chunks(json_of, g):
    thread_arenas = [a for a in json_of(g, "thread_arenas")["arenas"] if a["kind"] == "thread"]
    assert len(thread_arenas) == 8
    with_free = [a for a in thread_arenas if a["bins"]["unsorted"]["count"] + len(a["bins"]["small"])
                 + len(a["bins"]["large"]) > 0]
    assert len(with_free) >= 4


@pytest.mark.parametrize("g", GLIBCS)
def test_second_heap_arena_has_two_heaps_chained_by_prev(json_of, g):
    doc = json_of(g, "second_heap")
    (arena,) = [a for a in doc["arenas"] if a["kind"] == "thread"]
    newest, oldest = arena["heaps"]
    assert newest["prev"] == oldest["address"] and oldest["prev"] == 0
    heap_info_size = 0x30 if _version(doc) >= (2, 35) else 0x20
    assert oldest["address"] + heap_info_size == arena["address"]
    assert arena["system_mem"] == newest["size"] + oldest["size"]


@pytest.mark.parametrize("g", GLIBCS)
def test_many_arenas_core_reaches_the_limit_and_shares_arenas(json_of, g):
    ledger = _ledger(g, "many_arenas")
    doc = json_of(g, "many_arenas")
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


@pytest.mark.parametrize("g", GLIBCS)
def test_mmapped_core_moved_the_dynamic_threshold(json_of, g):
    mp = json_of(g, "mmapped")["mp"]
    ledger = _ledger(g, "mmapped")
    assert mp["n_mmaps"] == len(ledger["mmapped"])
    assert mp["mmap_threshold"] > 512 * 1024 > ledger["facts"]["heap_allocated_request"] - 1
    assert mp["trim_threshold"] == 2 * mp["mmap_threshold"]
    assert mp["no_dyn_threshold"] == 0


@pytest.mark.parametrize("symbols", SYMBOLS)
@pytest.mark.parametrize("g", GLIBCS)
def test_a_thread_that_never_called_malloc_has_no_tcache(json_of, g, symbols):
    doc = json_of(g, "mmapped", symbols)
    (bystander,) = [t for t in _ledger(g, "mmapped")["threads"] if t["label"] == "bystander"]
    (thread,) = [t for t in doc["threads"] if t["lwp"] == bystander["tid"]]
    assert thread["tcache"] is None and thread["arena"] is None
    libc = doc["discovery"]["libc"]["value"]["base"]
    if _version(doc) >= (2, 43):  # tcache points at libc's read-only dummy, never NULL
        assert libc < thread["tcache_pointer"] < libc + (4 << 20)
    else:
        assert thread["tcache_pointer"] is None


@pytest.mark.parametrize("g", GLIBCS)
def test_2_43_creates_tcache_lazily_not_at_the_heap_start(json_of, g):
    doc = json_of(g, "thread_arenas")
    main = doc["threads"][0]
    at_heap_start = main["tcache_pointer"] == doc["mp"]["sbrk_base"] + 0x10
    assert at_heap_start == (_version(doc) < (2, 43))


@pytest.mark.parametrize("symbols", SYMBOLS)
@pytest.mark.parametrize("g", GLIBCS)
def test_large_tcache_bins_hold_what_the_ledger_says(json_of, g, symbols):
    """2.42+: chunks above 1032 bytes in 12 size-class bins, sorted by size; 2.43 caches mmapped chunks too."""
    doc = json_of(g, "large_tcache", symbols)
    ledger = _ledger(g, "large_tcache")
    (main,) = doc["threads"]
    large = [b for b in main["tcache"]["bins"] if b["index"] >= 64]
    entries = {e: size for b in large for e, size in zip(b["entries"], b["sizes"])}
    assert entries == {c["mem"]: c["chunk_size"] for c in ledger["large_tcache"]}
    for b in large:
        assert b["sizes"] == sorted(b["sizes"]) and b["chunk_size"] == b["sizes"][0]
        assert all(64 + (s.bit_length() - 11) == b["index"] for s in b["sizes"]), "power-of-two size classes"
    if _version(doc) >= (2, 43):
        (mmapped,) = [c for c in ledger["large_tcache"] if c["mmapped"]]
        (holder,) = [b for b in large if mmapped["mem"] in b["entries"]]
        # the only mmapped chunk of the process: glibc's own count of mmapped bytes is its mapping
        assert holder["bytes"] == doc["mp"]["mmapped_mem"] == mmapped["chunk_size"] + 16
        assert len(ledger["large_tcache"]) == 6
    else:
        assert large == [] and ledger["large_tcache"] == []


@pytest.mark.parametrize("g", GLIBCS)
def test_a_main_arena_in_mmapped_pieces_is_walked_piece_by_piece(json_of, g):
    """hugetlb=2 (2.35+) makes sbrk fail: the main arena grows by mmap'd pieces closed by fenceposts."""
    doc = json_of(g, "main_regions", False)
    (main,) = doc["arenas"]
    if _version(doc) < (2, 35):  # no such tunable: the usual sbrk heap
        assert main["flags"] & 2 == 0 and len(main["heaps"]) == 1
        return
    assert main["flags"] & 2, "NONCONTIGUOUS"
    assert len(main["heaps"]) > 2
    assert sum(h["size"] for h in main["heaps"]) == main["system_mem"]
    assert main["accounting"]["chunks"]["fencepost"] == 2 * (len(main["heaps"]) - 1)
    assert main["accounting"]["balanced"] and main["trim"]["systrim"] == 0, "no break to lower"


@pytest.mark.parametrize("g", [g for g in GLIBCS if g in ("trixie", "sid")])
def test_every_command_sees_the_pieces_of_a_main_arena(json_of, g, tmp_path):
    """The commands that do not walk the chunks (bins, threads) list the same pieces as the report, and
    `chunks` walks them all, fenceposts between them included."""
    doc = json_of(g, "main_regions", False)
    (main,) = doc["arenas"]
    c = capture(g, "main_regions")
    run_gdb([str(c.exe), str(c.core)], [f"heapwalk bins --json {tmp_path}/bins.json",
                                        f"heapwalk chunks --limit 0 --json {tmp_path}/chunks.json"],
            iex=glibc(g).gdb_settings(False))
    (listed,) = json.loads((tmp_path / "bins.json").read_text())["arenas"]
    assert listed["heaps"] == main["heaps"]
    chunks = json.loads((tmp_path / "chunks.json").read_text())["chunks"]
    assert len(chunks) == sum(main["accounting"]["chunks"].values())
    assert sum(ch["size"] for ch in chunks) == main["system_mem"]


@pytest.mark.parametrize("g", GLIBCS)
def test_small_vectors_core_has_full_free_lists(json_of, g):
    doc = json_of(g, "small_vectors")
    fill = _ledger(g, "small_vectors")["tcache_fill"]
    (arena,) = doc["arenas"]
    if _version(doc) < (2, 43):
        assert sum(fb["count"] for fb in arena["bins"]["fast"]) > 1000
    else:
        assert sum(b["count"] for b in arena["bins"]["small"]) > 1000, "2.43 frees small chunks to the bins"
    (main,) = doc["threads"]
    assert any(b["count"] == fill for b in main["tcache"]["bins"])


def test_tables_read_well_in_a_batch_log(cores):
    c = cores["thread_arenas"]
    result = run_gdb([str(c.exe), str(c.core)], ["heapwalk arenas", "heapwalk bins --arena 1", "heapwalk tcache"])
    out = result.stdout
    assert result.returncode == 0, result.stderr
    assert "\x1b[" not in out, "no terminal escapes in logs"
    assert "glibc 2.36" in out and "9 arenas" in out
    assert "arena 1 (thread)" in out
    assert "tcache per thread" in out
