"""What the program holds in jemalloc, and a build without statistics (``--disable-stats``, tikv-jemallocator's
default), decoded from cores of je_hold (cores/jemalloc/je_hold.c) with no debug symbols.  je_hold's threads keep about
40% of what they allocate, of mixed sizes, and write a ledger of what they hold by arena and by the usable size
jemalloc gave (nallocx): heapwalk's count of what the program holds (the regions in use less what the thread
caches hold and jemalloc's own allocations) must equal it on every build, with statistics or without; and on
every build with statistics, what heapwalk counts from the extents alone must equal the statistics."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (JEMALLOC_BUILDS, JEMALLOC_COUNTED, NO_SYMBOLS, capture_dlopen, capture_jemalloc, capture_rust,
                      run_gdb)

pytestmark = pytest.mark.cores

PROBE = Path(__file__).parents[2] / "tools" / "je_counted_probe.py"


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """probed(build) -> (the probe's document, the ledger of what je_hold holds, je_common's ledger)."""
    tmp = tmp_path_factory.mktemp("held")

    @functools.cache
    def compute(build: str):
        cap = capture_rust() if build == RUST else capture_dlopen() if build == DLOPEN else \
            capture_jemalloc("bookworm", "je_hold", "binshards") if build == SHARDED else \
            capture_jemalloc(build, "je_hold")
        out = tmp / f"{build}.json"
        result = run_gdb([str(cap.exe), str(cap.core)], [f"source {PROBE}"], iex=[NO_SYMBOLS],
                         env={"HEAPWALK_PROBE_OUT": str(out)})
        assert out.exists(), result.stdout + result.stderr
        ledger = cap.directory / "ledger.json"
        return (json.loads(out.read_text()), json.loads((cap.directory / "held.json").read_text())["held"],
                json.loads(ledger.read_text()) if ledger.exists() else {})
    return compute


#: the Rust reproducer (cores/jemalloc/rust_hold: tikv-jemallocator), and je_hold with jemalloc loaded by dlopen
#: (cores/jemalloc/je_dlopen.c), among the builds
RUST, DLOPEN = "rust-tikv", "dlopen"
#: je_hold on Debian's 5.3.0 with four bins to each small class up to 160 bytes (MALLOC_CONF=bin_shards)
SHARDED = "bookworm-binshards"


def _ledger(held: list[list[int]]) -> dict[str, dict[str, int]]:
    """What je_hold holds: arena -> {size: blocks}."""
    out: dict[str, dict[str, int]] = {}
    for arena, size, count in held:
        out.setdefault(str(arena), {})[str(size)] = count
    return out


@pytest.mark.parametrize("build", (*JEMALLOC_BUILDS, *JEMALLOC_COUNTED, RUST, DLOPEN, SHARDED))
def test_what_the_program_holds_is_its_ledger_by_arena_and_size_class(probed, build):
    """Every arena's regions and large allocations the program holds, by size class, exactly; jemalloc's own
    allocations (the thread caches' stacks, 5.2.1's arrays of decay tickers) are told apart from the program's
    blocks.  Arena 0 holds none of the reproducer's blocks: it is where the C library's own allocations go (and
    the Rust runtime's), and the statistics buffer je_hold's snapshot takes back (cores/jemalloc/je_common.h) is among
    them."""
    doc, held, ledger = probed(build)
    want = _ledger(held)
    assert "0" not in want and len(want) == 5
    assert {arena: sizes for arena, sizes in doc["held"].items() if arena != "0"} == want
    assert doc["statistics"] is (build not in (*JEMALLOC_COUNTED, RUST))
    buffer = ledger.get("stats_buffer")
    if buffer is not None and buffer["retaken"]:
        assert doc["held"]["0"].get(str(buffer["size"]), 0) >= 1
    assert sum(n for sizes in want.values() for n in sizes.values()) > 10000


@pytest.mark.parametrize("build", JEMALLOC_BUILDS)
def test_what_a_build_without_statistics_counts_equals_the_statistics(probed, build):
    """The same core decoded as built and as if it kept no statistics: each bin's regions in use, slabs and
    slabs not full, each large class's allocations, the free extents by page size class (binned as jemalloc
    bins them), mapped bytes and internal allocations are the same in every arena."""
    doc, _held, _ledger_doc = probed(build)
    assert doc["statistics"] is True
    assert len(doc["counted"]) == len(doc["as_built"]) >= 5
    for built, counted in zip(doc["as_built"], doc["counted"]):
        for field in ("bins", "large", "extents", "mapped", "internal"):
            assert counted[field] == built[field], (built["index"], field)
    assert any(a["internal"] for a in doc["as_built"])      # the thread caches' stacks, in arena 0


@pytest.mark.parametrize("build", JEMALLOC_COUNTED)
def test_a_build_without_statistics_is_reported_from_its_extents(build, tmp_path):
    """The command line's report of a build without statistics: a first line that says so and what is not
    kept, figures where a build with statistics has them, never "None"; the JSON's counts of operations are
    null; check finds it consistent; the page says "not kept" where purges would be."""
    cap = capture_jemalloc(build, "je_hold")
    cli = Path(sys.executable).with_name("heapwalk")
    out, page = tmp_path / "report.json", tmp_path / "report.html"
    result = subprocess.run([str(cli), "report", str(cap.core), str(cap.exe), "--no-symbols", "--json", str(out),
                             "--html", str(page), "--check"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "Traceback" not in text + result.stderr and "None" not in text
    assert "statistics: none (built with --disable-stats): in use, slabs, large allocations and free extents " \
           "are counted from its" in text
    assert "internal allocations 140 KiB (the thread caches' stacks, counted in use)" in text
    assert "jemalloc consistent: no violations in" in text
    doc = json.loads(out.read_text())
    je = doc["jemalloc"]
    assert je["statistics"] is False
    arena = je["arenas"][1]
    assert arena["dirty_npurge"] is None and arena["base"] is None and arena["small"]["nmalloc"] is None
    assert arena["small"]["allocated"] > 0 and any(b["curregs"] for b in arena["bins"])
    assert doc["report"]["verdict"][0].startswith("Held free by jemalloc")
    assert "not kept" in page.read_text()


def test_a_rust_service_on_tikv_jemallocator_is_reported_with_its_own_words(tmp_path):
    """A stripped Rust program on tikv-jemallocator 0.6 (jemalloc 5.3.0 inside it, nothing exported, no
    statistics): the report names its jemalloc, counts from the extents, gives remedies under the variable the
    build reads (_RJEM_MALLOC_CONF), and check finds it consistent."""
    cap = capture_rust()
    cli = Path(sys.executable).with_name("heapwalk")
    out = tmp_path / "report.json"
    result = subprocess.run([str(cli), "report", str(cap.core), str(cap.exe), "--no-symbols", "--json", str(out),
                             "--check"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "Traceback" not in text + result.stderr and "None" not in text
    assert "jemalloc 5.3.0-1-ge13ca993e8ccb9ba9847cc330696e02839f328f7" in text
    assert "statistics: none (built with --disable-stats)" in text and "jemalloc consistent" in text
    doc = json.loads(out.read_text())
    assert doc["discovery"]["jemalloc"]["value"]["prefix"] is None        # nothing exported
    assert doc["discovery"]["conf_variable"]["value"] == "_RJEM_MALLOC_CONF"
    assert any("_RJEM_MALLOC_CONF=dirty_decay_ms:0" in line for line in doc["report"]["verdict"])
    manual = [a for a in doc["jemalloc"]["arenas"] if a["index"] > 8]
    assert len(manual) == 5 and sum(r["regions"] for a in manual for r in a["held"]) > 10000


def test_a_jemalloc_loaded_with_dlopen_has_each_threads_tsd_from_its_thread_vector(probed, tmp_path):
    """jemalloc built with --disable-initial-exec-tls and loaded with dlopen (RTLD_LOCAL), as a plugin's: no
    constant offset reaches the tsds, so each thread's is its block of the library's TLS module (the module id
    from the GOT slot ld.so filled); the threads that called jemalloc have their arena and thread cache (what
    the program holds is exact above), and the one that never did has no tsd."""
    cap = capture_dlopen()
    out = tmp_path / "arenas.json"
    result = run_gdb([str(cap.exe), str(cap.core)], [f"heapwalk threads --json {out}"], iex=[NO_SYMBOLS])
    assert out.exists() and "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    found = doc["discovery"]["tsd_tls_module"]
    assert found["value"] >= 1 and "DTPMOD64" in found["found_by"]
    assert doc["discovery"]["tsd_tls_offset"]["value"] is None
    assert not [f for f in doc["findings"] if "tsds are not known" in f["message"]]
    ledger = json.loads((cap.directory / "ledger.json").read_text())
    threads = {t["lwp"]: t for t in doc["jemalloc"]["threads"]}
    for entry in ledger["threads"]:
        t = threads[entry["lwp"]]
        if entry["role"] == "idle":
            assert t["tsd"] is None and t["state"] == 6
        elif entry["role"] == "worker":
            assert t["arena"] == entry["arena"] and t["tcache"]["bytes"] > 0


def test_sharded_bins_are_named_and_the_arenas_counted_from_their_slabs(probed, tmp_path):
    """With MALLOC_CONF=bin_shards (several bins to a size class, which heapwalk does not read yet) each arena
    whose bins do not count what its slabs hold is named in a warning, and its small classes are counted from
    its slabs: check finds no error, and what the program holds is its ledger (above)."""
    doc, _held, _ledger_doc = probed(SHARDED)
    cap = capture_jemalloc("bookworm", "je_hold", "binshards")
    result = run_gdb([str(cap.exe), str(cap.core)], ["heapwalk check"], iex=[NO_SYMBOLS])
    text = " ".join(result.stdout.split())
    assert "Traceback" not in text + result.stderr
    assert "jemalloc consistent, with warnings: 0 error(s)" in text
    assert "its bins are sharded (opt.bin_shards, which heapwalk does not read yet) or damaged" in text
    for built, counted in zip(doc["as_built"], doc["counted"]):
        assert built["bins"] == counted["bins"], built["index"]
