"""Mutation fuzzing in `make test`, a short share of `make fuzz`: some 200 mutants of reproducer cores' malloc
metadata, the damage the forensics name aimed at the places that matter, and damaged core files in a real gdb;
none may raise, print a traceback, or run past the bound.  Each kind of run is on a fixed subset of the glibcs
and jemallocs (`make fuzz` runs every reproducer of every one).

Each local run draws new mutants (the seed is printed on failure; HEAPWALK_FUZZ_SEED fixes it; CI uses a fixed
seed); every mutant that ever failed is kept in tests/fuzz_regressions.json and replayed first.
"""

from __future__ import annotations

import json
import os
import random

import pytest

import fuzz
from conftest import (FULL_MATRIX, JEMALLOCS, NO_SYMBOLS, capture, capture_gtcmalloc, capture_jemalloc,
                      capture_mimalloc, capture_musl, capture_tcmalloc, corruption, glibc)

pytestmark = pytest.mark.cores

#: fresh mutants on every local run; CI (CI=true) uses a fixed seed so that its verdict is reproducible
SEED = int(os.environ.get("HEAPWALK_FUZZ_SEED") or (20261121 if os.environ.get("CI") else random.randrange(1 << 30)))

#: (glibc, capture, debug symbols, mutants): 100 engine mutants per run (the seed changes from run to run
#: outside CI, so the runs together cover more)
ENGINE = (("system", "bins", True, 25), ("system", "thread_arenas", True, 15), ("bullseye", "second_heap", False, 20),
          ("sid", "mmapped", False, 15), ("trixie", "many_arenas", False, 15), ("system", "corrupt-chunk_size", False, 10))


def _capture(glibc_name: str, name: str):
    if name.startswith("corrupt-"):
        return corruption(glibc_name, name.removeprefix("corrupt-"))
    return capture(glibc_name, name)


@pytest.mark.parametrize("glibc_name,name,symbols,count", ENGINE, ids=[f"{g}-{n}" for g, n, _, _ in ENGINE])
def test_engine_survives_mutated_metadata(glibc_name, name, symbols, count, tmp_path):
    cap = _capture(glibc_name, name)
    key = f"{glibc_name}/{name}"
    document = fuzz.engine_fuzz(cap.exe, cap.core, glibc(glibc_name).gdb_settings(symbols), count, SEED, tmp_path,
                                fuzz.regressions(key))
    assert_survived(document, count, key, fields=10)


def assert_survived(document: dict, count: int, key: str, fields: int) -> None:
    """COUNT mutants of core KEY over more than FIELDS places, most decoded rather than refused, none failed
    (the failed ones are kept for replay), every aimed damage named exactly."""
    results = document["results"]
    assert len(results) >= count and len(document["fields"]) > fields
    applied = [r for r in results if r["outcome"] != "not applicable"]     # (a core with no tcache entry to aim at)
    assert len(applied) >= count // 2
    assert sum(r["outcome"].startswith("ok") for r in applied) > len(applied) // 2   # most decoded, not refused
    bad = fuzz.failures(document)
    if bad:
        fuzz.remember(key, [r["mutant"] for r in bad])
    assert not bad, f"seed {SEED}: {len(bad)} mutants failed, first:\n{json.dumps(bad[0]['mutant'])}\n" \
                    f"{bad[0]['outcome']}"
    assert_named_exactly(document)


def assert_named_exactly(document: dict) -> None:
    """Every aimed damage that heapwalk decoded (not refused for a lost libc) is named at its exact address."""
    for kind, (n, detected, refused, exact) in fuzz.tally([document]).items():
        assert detected == n and exact == detected - refused, \
            f"seed {SEED}: {kind}\n" + "\n".join(fuzz.tally_lines(fuzz.tally([document]))) + "\n" + \
            "\n".join(json.dumps(r) for r in document["results"]
                      if r["mutant"]["op"] == kind and not r.get("exact") and not r.get("refused"))[:3000]


#: each aimed damage kind, in places that matter: the first chunks, the middle, the last before top, every
#: arena's next link with each kind of bad value, a core cut inside a heap and above it
AIMED = ([{"op": op, "heap": h, "pick": p, "into": 0.5} for op in ("size_zero", "size_into_next", "zero_page")
          for h in (0, 1, 2) for p in (0.0, 0.5, 0.999)]
         + [{"op": "ring", "arena": a, "link": link} for a in (0, 1, 3) for link in fuzz.RING_LINKS]
         + [{"op": "truncate", "heap": h, "fraction": f, "hole": hole} for h in (0, 2) for f in (0.1, 0.6)
            for hole in (True, False)]
         + [{"op": op, "pick": p} for op in ("tcache_next", "top_shrunk") for p in (0.0, 0.5, 0.999)]
         + [{"op": "mp_bins", "pick": 0.0}]
         + [{"op": "tcache_inside", "pick": p, "inside": q} for p in (0.0, 0.999) for q in (0.0, 0.5, 0.999)])


@pytest.mark.parametrize("glibc_name,symbols", [("sid", False)])
def test_aimed_damage_is_detected_at_its_exact_address(glibc_name, symbols, tmp_path):
    """The damage the issues name (a size of 0, a size into the next chunk, a zeroed heap page, a broken
    arena ring, a core cut short, a poisoned tcache link, a shrunk top, mp_'s tcache limit overwritten, a chunk
    freed into a tcache inside a free chunk) on a core with thread arenas: never called clean, no arena lost, no
    impossible figure, and named at the exact address of the bad field."""
    cap = capture(glibc_name, "thread_arenas")
    document = fuzz.engine_fuzz(cap.exe, cap.core, glibc(glibc_name).gdb_settings(symbols), 0, SEED, tmp_path,
                                AIMED)
    decoded = [r for r in document["results"] if r["outcome"] != "not applicable"]
    assert len(decoded) >= len(AIMED) * 3 // 4
    bad = fuzz.failures(document)
    assert not bad, "\n".join(f"{json.dumps(r['mutant'])}: {r['outcome'][:500]}" for r in bad)
    assert_named_exactly(document)


#: the same kinds over one big main heap, at many places
AIMED_MAIN = ([{"op": op, "heap": 0, "pick": p / 11, "into": (p % 5) / 5}
               for op in ("size_zero", "size_into_next", "zero_page") for p in range(11)]
              + [{"op": "truncate", "heap": 0, "fraction": f, "hole": hole} for f in (0.05, 0.5, 0.95)
                 for hole in (True, False)])


@pytest.mark.parametrize("glibc_name,symbols", [("trixie", False)])
def test_aimed_damage_among_data_that_looks_like_sizes(glibc_name, symbols, tmp_path):
    """The leak core's 30,000 buffers end in partial words of fill (0xa5a5) that read as chunk sizes with
    PREV_INUSE set: damage among them is still named at the chunk whose size is bad, not at a buffer whose
    data happens to chain over the break; a cut anywhere in its heap (which also takes libc) is decoded from
    the heap alone."""
    cap = capture(glibc_name, "leak")
    document = fuzz.engine_fuzz(cap.exe, cap.core, glibc(glibc_name).gdb_settings(symbols), 0, SEED, tmp_path,
                                AIMED_MAIN)
    decoded = [r for r in document["results"] if r["outcome"] != "not applicable"]
    assert len(decoded) >= len(AIMED_MAIN) - 3 and not any(r.get("refused") for r in decoded)
    bad = fuzz.failures(document)
    assert not bad, "\n".join(f"{json.dumps(r['mutant'])}: {r['outcome'][:500]}" for r in bad)
    assert_named_exactly(document)


@pytest.mark.parametrize("glibc_name,name,symbols", [("system", "bins", True), ("sid", "thread_arenas", False)])
def test_every_command_survives_damaged_core_files(glibc_name, name, symbols, tmp_path):
    cap = capture(glibc_name, name)
    iex = glibc(glibc_name).gdb_settings(symbols)
    fields = fuzz.engine_fuzz(cap.exe, cap.core, iex, 0, SEED, tmp_path / "fields")["fields"]
    for description, path in fuzz.file_mutants(cap.core, [tuple(f) for f in fields], 6, SEED, tmp_path):
        ok, output = fuzz.run_commands(cap.exe, path, iex)
        assert ok, f"seed {SEED}: {description}\n{output[-3000:]}"
        assert "heapwalk check" in output or "heap" in output
        path.unlink()


#: (jemalloc suite, reproducer, mutants): jemalloc's metadata (arenas, bins, bases, thread caches, the radix tree,
#: the options) in cores of processes on Debian's jemallocs, glibc's heap beside it in je_both
JEMALLOC_ENGINE = [(suite, name, 60) for suite, name in zip(JEMALLOCS, ("je_dns", "je_both"))]


@pytest.mark.parametrize("suite,name,count", JEMALLOC_ENGINE, ids=[f"{s}-{n}" for s, n, _ in JEMALLOC_ENGINE])
def test_jemalloc_decoder_survives_mutated_metadata(suite, name, count, tmp_path):
    """Every word jemalloc's decoder reads in writable memory, patched; an arena's pages missing, a thread cache
    holding a region twice or a wild pointer, a core cut inside what it reads: never a traceback, a hang or an
    impossible figure, and the aimed damage named at its address (or the core refused in one line)."""
    cap = capture_jemalloc(suite, name)
    key = f"jemalloc-{suite}/{name}"
    document = fuzz.engine_fuzz(cap.exe, cap.core, [NO_SYMBOLS], count, SEED, tmp_path, fuzz.regressions(key),
                                driver=fuzz.JE_DRIVER)
    assert_survived(document, count, key, fields=50)
    assert {"arena_hidden", "cache_twice", "cache_wild"} <= set(fuzz.tally([document]))


@pytest.mark.parametrize("suite", JEMALLOCS)
def test_every_command_survives_damaged_jemalloc_core_files(suite, tmp_path):
    """Core files of the process with both allocators, a word of jemalloc's or glibc's metadata overwritten
    in the file, or cut short: every command in a real gdb, no traceback, no internal error."""
    cap = capture_jemalloc(suite, "je_both")
    fields = fuzz.engine_fuzz(cap.exe, cap.core, [NO_SYMBOLS], 0, SEED, tmp_path / "fields",
                              driver=fuzz.JE_DRIVER)["fields"]
    for description, path in fuzz.file_mutants(cap.core, [tuple(f) for f in fields], 6, SEED, tmp_path):
        ok, output = fuzz.run_commands(cap.exe, path, [NO_SYMBOLS])
        assert ok, f"seed {SEED}: {description}\n{output[-3000:]}"
        path.unlink()


def test_tcmalloc_decoder_survives_mutated_metadata(tmp_path):
    """Every word tcmalloc's decoder reads in writable memory (the caches' free lists too), patched; the thread
    caches' list looping, a thread cache's pages missing, a cache's free list looping (inside its count, and just
    past it), a core cut inside what it reads: never a traceback, a hang or an impossible figure, and the aimed
    damage named at its address (or the core refused in one line)."""
    cap = capture_tcmalloc("bookworm")
    count, key = 40, "tcmalloc-bookworm/tc_hold"
    document = fuzz.engine_fuzz(cap.exe, cap.core, [NO_SYMBOLS], count, SEED, tmp_path, fuzz.regressions(key),
                                driver=fuzz.TC_DRIVER)
    assert_survived(document, count, key, fields=20)
    assert {"cache_loop", "cache_hidden", "object_loop", "tail_loop"} <= set(fuzz.tally([document]))


#: mimalloc builds of the decoder's fuzzing: one of each family (2.0, 2.x, 3.0, 3.x) in make test, more with
#: HEAPWALK_FULL_MATRIX=1
MIMALLOC_FUZZED = ["bookworm", "trixie", "2.3.2", "sid"] + (["3.3.2"] if FULL_MATRIX else [])


@pytest.mark.parametrize("suite", MIMALLOC_FUZZED)
def test_mimalloc_decoder_survives_mutated_metadata(tmp_path, suite):
    """Every word mimalloc's decoder reads in writable memory (segment headers, slices, heaps, free lists; on
    mimalloc 3 pages, arenas and their bitmaps, the page map) patched; a page's free list looping, a segment's (a
    page's) header missing, a core cut inside what it reads: never a traceback, a hang or an impossible figure,
    and the aimed damage named at its address (or the core refused in one line)."""
    cap = capture_mimalloc(suite)
    count, key = 40, f"mimalloc-{suite}/mi_hold"
    document = fuzz.engine_fuzz(cap.exe, cap.core, [NO_SYMBOLS], count, SEED, tmp_path, fuzz.regressions(key),
                                driver=fuzz.MI_DRIVER)
    assert_survived(document, count, key, fields=20)
    assert {"list_loop", "segment_hidden"} <= set(fuzz.tally([document]))


def test_musl_decoder_survives_mutated_metadata(tmp_path):
    """Every word musl's decoder reads in writable memory (the context, meta areas, groups' and slots' headers)
    patched; a meta area's check word changed, a group's header pointing elsewhere, an allocation's index
    changed, a meta area missing, a core cut inside what it reads: never a traceback, a hang or an impossible
    figure, and the aimed damage named at its address (or the core refused in one line)."""
    cap = capture_musl("trixie", "dynamic")
    count, key = 40, "musl-trixie-dynamic/musl_hold"
    document = fuzz.engine_fuzz(cap.exe, cap.core, [NO_SYMBOLS], count, SEED, tmp_path, fuzz.regressions(key),
                                driver=fuzz.MUSL_DRIVER)
    assert_survived(document, count, key, fields=20)
    assert {"area_check", "group_back", "slot_index"} <= set(fuzz.tally([document]))


@pytest.mark.parametrize("mode", ["per-cpu", "thread-caches"])
def test_google_tcmalloc_decoder_survives_mutated_metadata(tmp_path, mode):
    """Every word the decoder of Google's tcmalloc reads in writable memory (its transfer caches and central
    lists, the spans on them, the slabs, the thread caches, the page map's leaves) patched; a transfer cache's count
    past its capacity, a central list's counter off by one, a full span on a list, a page map leaf missing, a core
    cut inside what it reads: never a traceback, a hang or an impossible figure, and the aimed damage named at its
    address (or the core refused in one line)."""
    cap = capture_gtcmalloc(mode)
    count, key = 40, f"gtcmalloc-{mode}/rust_gtc"
    document = fuzz.engine_fuzz(cap.exe, cap.core, [NO_SYMBOLS], count, SEED, tmp_path, fuzz.regressions(key),
                                driver=fuzz.GTC_DRIVER)
    assert_survived(document, count, key, fields=20)
    assert {"transfer_used", "central_counter"} <= set(fuzz.tally([document]))
