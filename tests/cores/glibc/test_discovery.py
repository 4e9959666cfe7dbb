"""Discovery without help: huge-page heaps, a core whose libc file is gone, a version that memory contradicts."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import capture, glibc, heapwalk_json, run_gdb
from oracle import malloc_info_view, parse_malloc_info

pytestmark = pytest.mark.cores

MiB = 1 << 20


def _decoded(doc: dict) -> dict:
    """What heapwalk decoded, without how it found it."""
    return {k: doc[k] for k in ("main_arena", "mp", "arenas", "threads")}


@pytest.mark.parametrize("symbols", [True, False], ids=["symbols", "nosymbols"])
@pytest.mark.parametrize("g", ["system", "trixie"])
def test_hugetlb_heaps_are_sized_from_mp(json_of, g, symbols):
    """glibc.malloc.hugetlb=2 (2.35-2.41) makes thread heaps 4 x hp_pagesize, aligned to that, huge pages or not."""
    doc = json_of(g, "second_heap", symbols, "hugetlb")
    expected = parse_malloc_info(capture(g, "second_heap", "hugetlb").malloc_info)
    assert malloc_info_view(doc) == expected
    hp = doc["mp"]["hp_pagesize"]
    assert hp == 2 * MiB
    fact = doc["discovery"]["heap_max_size"]
    assert fact == {"value": 4 * hp, "found_by": f"4 x mp_.hp_pagesize ({hp:#x})"}
    (arena,) = [a for a in doc["arenas"] if a["kind"] == "thread"]
    heaps = arena["heaps"]
    assert len(heaps) > 2, "the 8 MiB heaps fill up: the arena chains several"
    assert all(h["address"] % (8 * MiB) == 0 and h["size"] <= 8 * MiB for h in heaps)
    assert any(h["address"] % (64 * MiB) for h in heaps), "a 64 MiB assumption would miss these heaps"
    assert doc["findings"] == [] and all(a["findings"] == [] for a in doc["arenas"])


@pytest.mark.parametrize("g", ["bullseye", "trixie", "sid"])
def test_a_core_decodes_from_memory_alone_when_its_libc_file_is_gone(json_of, g, tmp_path):
    names = ("thread_arenas", "many_arenas")
    reference = {n: json_of(g, n, True) for n in names}
    caps = {n: capture(g, n) for n in names}
    sysroot = glibc(g).sysroot
    moved = sysroot.root.with_name(sysroot.root.name + ".moved")
    settings = glibc(g).gdb_settings(symbols=False)
    shutil.move(sysroot.root, moved)
    try:
        docs = {n: heapwalk_json([str(caps[n].exe), str(caps[n].core)], tmp_path, iex=settings) for n in names}
        result = run_gdb([str(caps["thread_arenas"].exe), str(caps["thread_arenas"].core)],
                         ["heapwalk arenas", "heapwalk check"], iex=settings)
        text = result.stdout
    finally:
        shutil.move(moved, sysroot.root)
    assert result.returncode == 0 and "heap consistent: no violations in 9 arenas" in text, text + result.stderr
    for n in names:
        assert _decoded(docs[n]) == _decoded(reference[n]), n
    doc = docs["thread_arenas"]
    version = doc["discovery"]["glibc_version"]
    if g == "bullseye":  # up to 2.33 the file name in the core says the version
        assert version == {"value": "2.31", "found_by": f"file name {doc['discovery']['libc']['value']['path']}"}
        assert doc["findings"] == []
    else:
        assert version["value"] is None and version["found_by"].startswith("not determined")
        assert [f["severity"] for f in doc["findings"]] == ["info"]
        assert "glibc version is unknown" in doc["findings"][0]["message"]
        assert doc["glibc"]["version"] == {"trixie": "2.35-2.41", "sid": "2.43+"}[g]
        assert "not determined" in text
    assert "build_id" in json.dumps(doc["discovery"])
    for key in ("main_arena", "mp_", "tcache_tls_offset", "thread_arena_tls_offset"):
        assert doc["discovery"][key]["value"] == reference["thread_arenas"]["discovery"][key]["value"], key


def test_memory_wins_over_a_wrong_version(json_of, tmp_path):
    """Told 2.29 about a 2.36 core: heap_info, tcache, safe-linking and mp_ are read from memory, and it says so."""
    c = capture("system", "thread_arenas")
    forced = heapwalk_json([str(c.exe), str(c.core)], tmp_path, before=["set heapwalk glibc-version 2.29"])
    assert _decoded(forced) == _decoded(json_of("system", "thread_arenas", True))
    (finding,) = forced["findings"]
    assert finding["severity"] == "warning"
    assert finding["message"].startswith("memory contradicts the glibc 2.29 layout")
    assert "(heap_info size, mp_ layout, safe-linking, tcache layout)" in finding["message"]
