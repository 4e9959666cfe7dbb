"""musl's malloc (mallocng) on Debian's musl of bullseye, bookworm and trixie (1.2.2, 1.2.3, 1.2.5):
cores/musl/musl_hold.c (threads holding requests of every size
class, some mapped on their own, some by aligned_alloc and realloc, two out of three freed in a scattered order)
linked statically with its symbol table, statically and stripped, and dynamically.  musl keeps no statistics: the
program's ledger of every live allocation (its address and the size asked for) is the oracle.  Each slot in use
must be one of the ledger's with its size, and every one of the ledger's in use; the report's totals the ledger's;
the groups' bytes balanced; the check sound; the context found by its symbol where the program has one, by its
shape where not; glibc's malloc not taken to be there."""

from __future__ import annotations

import json

import pytest

from conftest import capture_musl, heapwalk, run_gdb
from muslbuilds import MUSL_SUITES
from heapwalk.inferior.corefile import CoreFile
from heapwalk.inferior.memory import ReadError
from heapwalk.musl.decode import decode_musl
from heapwalk.musl.discovery import locate_context
from heapwalk.musl.find import find_musl

pytestmark = pytest.mark.cores

LINKAGES = ("static", "stripped", "dynamic")
#: every suite's musl in each linkage
BUILDS = [(suite, linkage) for suite in MUSL_SUITES for linkage in LINKAGES]


class _WithFiles:
    """A core's memory, and where the core lacks a file's pages (gcore leaves read-only ones out), the file's."""

    def __init__(self, core: CoreFile):
        self.core, self.files = core, core.file_mappings()

    def read(self, address: int, size: int) -> bytes:
        try:
            return self.core.read(address, size)
        except LookupError:
            pass
        for m in self.files:
            if m.start <= address and address + size <= m.end:
                with open(m.path, "rb") as f:
                    f.seek(m.offset + address - m.start)
                    data = f.read(size)
                if len(data) == size:
                    return data
        raise ReadError(address, size)


def _ledger(cap) -> dict[int, int]:
    return {a: s for a, s in json.loads(cap.ledger.read_text())["live"]}


@pytest.mark.parametrize("suite,linkage", BUILDS)
def test_every_slot_in_use_is_the_ledgers_allocation_with_its_size(suite, linkage):
    cap = capture_musl(suite, linkage)
    core = _WithFiles(CoreFile(cap.core))
    found = find_musl(core, core.files)
    assert found is not None and found.mallocng
    address, how = locate_context(core, found, lambda name: None)
    state = decode_musl(core, address, how, found.path, found.version, 4096)
    assert not state.findings
    assert dict(zip(state.used_addr.tolist(), state.used_size.tolist())) == _ledger(cap)


@pytest.mark.parametrize("suite,linkage", BUILDS)
def test_the_report_holds_the_ledgers_totals_and_balances(suite, linkage, tmp_path):
    cap = capture_musl(suite, linkage)
    out = tmp_path / "report.json"
    result = heapwalk("report", str(cap.core), str(cap.exe), "--check", "--json", str(out))
    said = result.stdout + result.stderr
    assert result.returncode == 0, said
    assert "glibc" not in said and "Traceback" not in said, said
    doc = json.loads(out.read_text())
    ledger = _ledger(cap)
    musl = doc["musl"]
    assert musl["in_use"] == {"allocations": len(ledger), "requested": sum(ledger.values())}
    rep = doc["report"]
    arena = rep["arenas"][0]
    assert arena["balanced"] and arena["system"] == arena["in_use"] + sum(arena["free"].values()) + arena["overhead"]
    assert musl["large"]["count"] == sum(1 for s in ledger.values() if s >= 131052)
    assert "musl's malloc consistent" in " ".join(said.split())
    assert ("symbol __malloc_context, its shape confirmed" if linkage == "static" else "its shape in") \
        in musl["found_by"]
    assert musl["version"] == (MUSL_SUITES[suite] if linkage == "dynamic" else "")
    if linkage == "dynamic":
        assert musl["groups"]["donated"] > 0      # the data ends the dynamic linker gave malloc at start


def test_gdb_finds_the_context_by_the_programs_symbol_and_scans_no_leak(tmp_path):
    cap = capture_musl("bookworm", "static")
    result = run_gdb([str(cap.exe), str(cap.core)], ["heapwalk report", "heapwalk check"])
    said = " ".join((result.stdout + result.stderr).split())
    assert "found by symbol __malloc_context, its shape confirmed" in said, said
    assert "nothing leaked" in said and "musl's malloc consistent" in said, said
    assert "Traceback" not in said and "glibc" not in said, said


def test_the_map_draws_every_group_slot_by_slot(tmp_path):
    """The heap map's strips cover the groups' memory and the requests mapped on their own, byte for byte, and
    hold in use exactly what the program asked for."""
    from heapwalk.musl.account import tally
    from heapwalk.musl.heapmap import group_strips
    from heapwalk.common.mapkinds import MAP_KINDS
    cap = capture_musl("bookworm", "dynamic")
    core = _WithFiles(CoreFile(cap.core))
    found = find_musl(core, core.files)
    address, how = locate_context(core, found, lambda name: None)
    state = decode_musl(core, address, how, found.path, found.version, 4096)
    strips = group_strips(state)
    t = tally(state)
    drawn = sum(int((s.run_ends - s.run_starts).sum()) for s in strips)
    assert drawn == t.system - t.meta + t.large_bytes
    in_use = MAP_KINDS.index("in_use")
    assert sum(int((s.run_ends - s.run_starts)[s.kinds == in_use].sum()) for s in strips) == sum(_ledger(cap).values())
