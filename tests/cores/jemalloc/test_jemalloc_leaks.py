"""The leak scan over jemalloc's allocations, on cores of je_leak (cores/jemalloc/je_leak.c) with no debug symbols: three
workers, each in an arena of its own, keep blocks reached from a static array, a chain, an interior pointer and
their TLS, and leak blocks in each way (dropped singles, a chain, a ring, large ones, one whose only pointer lies
in a freed block, one that points to a reached block).  On every build, with statistics or without, the
allocations heapwalk calls leaked are exactly the ledger's (and the statistics buffer the snapshot takes back and
drops, cores/jemalloc/je_common.h), the unreferenced ones hold what the ledger says, none of the reached ones is leaked,
and the report, the verdict and the map say so."""

from __future__ import annotations

import functools
import json

import pytest

from conftest import JEMALLOC_BUILDS, JEMALLOC_COUNTED, NO_SYMBOLS, capture_jemalloc, run_gdb

pytestmark = pytest.mark.cores


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    """scanned(build) -> ('heapwalk leaks --json', the ledger of leaks, je_common's ledger, the gdb output of
    'heapwalk report' and 'heapwalk map --leaks')."""
    tmp = tmp_path_factory.mktemp("jeleaks")

    @functools.cache
    def compute(build: str):
        cap = capture_jemalloc(build, "je_leak")
        out = tmp / f"{build}.json"
        result = run_gdb([str(cap.exe), str(cap.core)], [f"heapwalk leaks --json {out}", "heapwalk report",
                                                         "heapwalk map --leaks"], iex=[NO_SYMBOLS])
        assert out.exists() and "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
        return (json.loads(out.read_text()), json.loads((cap.directory / "leaks.json").read_text()),
                json.loads((cap.directory / "ledger.json").read_text()), " ".join(result.stdout.split()))
    return compute


@pytest.mark.parametrize("build", (*JEMALLOC_BUILDS, *JEMALLOC_COUNTED))
def test_the_leaked_allocations_are_the_ledgers(scanned, build):
    doc, ledger, snapshot, _text = scanned(build)
    found = {entry["address"]: entry for entry in doc["leaked"]}
    want = {address: (bool(unreferenced), count, size) for address, unreferenced, count, size in ledger["leaked"]}
    extra = {address: entry for address, entry in found.items() if address not in want}
    buffer = snapshot["stats_buffer"]
    if buffer is not None and buffer["retaken"]:       # taken back from arena 0 and dropped: a leak, by design
        assert [(e["arena"], e["size"]) for e in extra.values()] == [(buffer["arena"], buffer["size"])]
    else:
        assert not extra
    assert set(want) <= set(found)
    for address, (unreferenced, count, size) in want.items():
        assert found[address]["unreferenced"] is unreferenced, hex(address)
        if unreferenced:
            assert (found[address]["holds_count"], found[address]["holds_bytes"]) == (count, size), hex(address)
    assert not set(ledger["reached"]) & set(found)
    rings = [a for a, (unreferenced, count, _size) in want.items() if not unreferenced and count == 0]
    assert doc["summary"]["in_rings_count"] >= 3 * 3 and len(rings) == 3 * 5     # each worker's ring and chain
    assert len(want) == 3 * 310


@pytest.mark.parametrize("build", ("bookworm", "bullseye", "5.3.0-nostats"))
def test_the_report_and_the_map_name_the_leak(scanned, build):
    doc, ledger, _snapshot, text = scanned(build)
    leaked = doc["summary"]["leaked_count"]
    assert "The leak scan found" in text and f"in {leaked} allocations nothing reachable points to" in text
    verdict = text.split("verdict:", 1)[1]
    assert verdict.lstrip(" -").startswith("A leak, not memory held free")
    assert "in-use blocks by size" in text and "x leaked (in use, nothing reaches it)" in text


def test_chunk_says_what_reaches_an_allocation_or_that_it_is_leaked():
    """'heapwalk chunk' on a kept block: the path from the static array; on a dropped one and on a leaked large
    block: leaked, unreferenced."""
    cap = capture_jemalloc("bookworm", "je_leak")
    ledger = json.loads((cap.directory / "leaks.json").read_text())
    kept, dropped = ledger["reached"][0], ledger["leaked"][0][0]
    large = max(ledger["leaked"], key=lambda entry: entry[3])[0]       # the 700 KiB block (768 KiB usable)
    result = run_gdb([str(cap.exe), str(cap.core)], [f"heapwalk chunk {kept:#x}", f"heapwalk chunk {dropped:#x}",
                                                     f"heapwalk chunk {large:#x}"], iex=[NO_SYMBOLS])
    text = " ".join(result.stdout.split())
    assert "Traceback" not in text + result.stderr and "chunk" not in text
    assert f"region 0 at {kept:#x}, 0 bytes into it: in use reached: data of je_leak" in text
    assert text.count("leaked: nothing reachable points to it, and no other leaked allocation either "
                      "(unreferenced)") == 2
    assert f"a large allocation of 768 KiB at {large:#x}" in text
