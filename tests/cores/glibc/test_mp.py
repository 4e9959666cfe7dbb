"""mp_ (malloc_par) found without symbols whatever it holds, and the heap decoded when it is not found.

tuned.c runs once per variant under every glibc of the matrix: its own run moves the dynamic mmap threshold
(a freed mmapped chunk) and, under glibc 2.43, makes mmapped_mem drift (mremap); each variant sets one
parameter by GLIBC_TUNABLES or mallopt().  The general checks of test_cores.py (malloc_info, ledgers,
accounting, symbols against none) run on every variant; these check that mp_ itself was read as the
program set it, and that it was pinned down by memory, not picked by its defaults.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import GLIBCS, TUNED_CASES, capture, glibc, heapwalk_json, run_gdb, version_tuple
from harness import overwrite
from heapwalk.glibc.locate.layout import layout_for
from oracle import malloc_info_view, parse_malloc_info

pytestmark = pytest.mark.cores

MiB = 1 << 20
#: what each variant sets in mp_; variants not listed (and the plain run) leave the threshold dynamic
SETTINGS = {
    "tunable-mmap_threshold": {"mmap_threshold": MiB, "no_dyn_threshold": 1},
    "tunable-trim_threshold": {"trim_threshold": 4 * MiB, "no_dyn_threshold": 1},
    "tunable-top_pad": {"top_pad": MiB, "no_dyn_threshold": 1},
    "tunable-mmap_max": {"n_mmaps_max": 0, "n_mmaps": 0, "no_dyn_threshold": 1},
    "tunable-arena_max": {"arena_max": 2},
    "tunable-arena_test": {"arena_test": 1},
    "tunable-tcache_count": {"tcache_count": 3},
    "tunable-tcache_max": {"tcache_bins": 37},
    "tunable-hugetlb": {"hp_pagesize": 0},
    "mallopt-mmap_threshold": {"mmap_threshold": 256 << 10, "no_dyn_threshold": 1},
    "mallopt-trim_threshold": {"trim_threshold": 2**64 - 1, "no_dyn_threshold": 1},
    "mallopt-top_pad": {"top_pad": 2 * MiB, "no_dyn_threshold": 1},
    "mallopt-mmap_max": {"n_mmaps_max": 1, "n_mmaps": 1, "no_dyn_threshold": 1},
    "mallopt-arena_max": {"arena_max": 3},
    "mallopt-arena_test": {"arena_test": 2},
}
SYMBOLS = [pytest.param(True, id="symbols"), pytest.param(False, id="nosymbols")]


def _ledger(g: str, variant: str) -> dict:
    return json.loads(capture(g, "tuned", variant).ledger.read_text())


def _thp_size() -> int:
    """The kernel's transparent huge page size when THP may be used by madvise, else 0."""
    enabled = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not enabled.exists() or "[never]" in enabled.read_text():
        return 0
    return int(Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").read_text())


@pytest.mark.parametrize("symbols", SYMBOLS)
@pytest.mark.parametrize("g,variant", TUNED_CASES, ids=[f"{g}-{v or 'dynamic'}" for g, v in TUNED_CASES])
def test_mp_holds_what_the_program_set(json_of, g, variant, symbols):
    doc = json_of(g, "tuned", symbols, variant)
    mp, version = doc["mp"], version_tuple(doc["glibc"]["version"])
    want = dict(SETTINGS.get(variant, {}))
    if "no_dyn_threshold" not in want:  # the freed mmapped chunks moved the threshold, and trim's with it
        moved = _ledger(g, variant)["facts"]["freed_mmapped_max"]
        want.update(mmap_threshold=moved, trim_threshold=2 * moved, no_dyn_threshold=0)
    if variant == "tunable-tcache_max":  # 2.43 keeps 9 bytes more, as its default of 1041 for 1032 shows
        want["tcache_max_bytes"] = 600 + (9 if version >= (2, 43) else 0)
    if variant == "tunable-hugetlb" and version >= (2, 35):
        want["thp_pagesize"] = _thp_size()
    want = {k: v for k, v in want.items() if k in layout_for(version).mp}
    assert {k: mp[k] for k in want} == want


@pytest.mark.parametrize("g,variant", TUNED_CASES, ids=[f"{g}-{v or 'dynamic'}" for g, v in TUNED_CASES])
def test_without_symbols_memory_pins_mp_down(json_of, g, variant):
    how = json_of(g, "tuned", False, variant)["discovery"]["mp_"]["found_by"]
    assert how.startswith("malloc_par near main_arena: ")
    assert "its sbrk_base is where the main arena's memory starts" in how or \
        "malloc_stats reads its mmapped_mem" in how


@pytest.mark.parametrize("g,variant", TUNED_CASES, ids=[f"{g}-{v or 'dynamic'}" for g, v in TUNED_CASES])
def test_the_fields_memory_confirms_are_named(json_of, g, variant):
    """The discovery says which of mp_'s fields the rest of memory confirmed and which are read as they are."""
    doc = json_of(g, "tuned", False, variant)
    fields = doc["discovery"]["mp_fields"]["value"]
    want = {"sbrk_base", "n_mmaps", "mmapped_mem"}
    if version_tuple(doc["glibc"]["version"]) >= (2, 42):
        want.add("tcache_count")
    assert set(fields["confirmed"]) == want
    assert set(fields["confirmed"]) | set(fields["unconfirmed"]) == set(doc["mp"]) - {"address"}
    assert "mmap_threshold" in fields["unconfirmed"]


@pytest.mark.parametrize("g", GLIBCS)
def test_a_core_whose_mp_is_gone_is_still_decoded(json_of, g, tmp_path):
    """mp_ cleared in the core (a stray memset, a page the core lacks): without symbols heapwalk finds no
    malloc_par, says what it derived instead, and still walks the main arena exactly."""
    cap = capture(g, "tuned")
    intact = json_of(g, "tuned", True)
    version = version_tuple(intact["glibc"]["version"])
    core = tmp_path / "core"
    subprocess.run(["cp", "--sparse=always", str(cap.core), str(core)], check=True)
    overwrite(core, intact["mp"]["address"], bytes(layout_for(version).mp_size))
    doc = heapwalk_json([str(cap.exe), str(core)], tmp_path, iex=glibc(g).gdb_settings(False))
    assert doc["mp"] is None and doc["discovery"]["mp_"]["value"] is None
    notes = [f for f in doc["findings"] if f["structure"] == "mp_"]
    assert [n["severity"] for n in notes] == ["info"]
    assert "top's end minus its system_mem" in notes[0]["message"]

    expected = parse_malloc_info(cap.malloc_info)
    got = malloc_info_view(doc)
    assert got["heaps"] == expected["heaps"]
    main = doc["arenas"][0]
    assert main["kind"] == "main" and main["accounting"]["balanced"] and main["accounting"]["unwalked"] == 0
    assert [(h["address"], h["size"]) for h in main["heaps"]] == \
        [(h["address"], h["size"]) for h in intact["arenas"][0]["heaps"]]
    # the mmapped chunks come from memory: all of them, but without glibc 2.43's mremap drift
    drift = 16 * _ledger(g, "")["facts"]["mremaps"] if version >= (2, 43) else 0
    count, size = expected["totals"]["mmap"]
    assert got["totals"]["mmap"] == (count, size - drift)
    assert doc["threads"] == intact["threads"]

    report = run_gdb([str(cap.exe), str(core)], ["heapwalk report"], iex=glibc(g).gdb_settings(False))
    assert "mp_ (malloc_par) was not found" in report.stdout and "Traceback" not in report.stdout + report.stderr
