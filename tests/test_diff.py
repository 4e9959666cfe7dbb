"""The diff of two snapshots, on values and on real reports: the typed reader takes back what the report's
JSON writer wrote, and the diff's JSON and text follow from it."""

from __future__ import annotations

import copy
import functools
import json

import pytest

from conftest import capture, glibc, run_gdb
from heapwalk.analysis.diff import ArenaTotals, diff
from heapwalk.analysis.report import Bucket
from heapwalk.output import jsondoc
from heapwalk.output.difftext import diff_text


def _arena(address: int, number: int, system: int, in_use: int, free: int, buckets=()) -> ArenaTotals:
    return ArenaTotals(address, number, system, in_use, free, 0, tuple(Bucket(*b) for b in buckets))


def test_arenas_are_matched_by_address_and_sorted_by_growth():
    a = [_arena(0x10, 0, 100, 60, 40, [(32, 64, 2, 96)]), _arena(0x20, 1, 50, 50, 0)]
    b = [_arena(0x10, 0, 300, 60, 240, [(32, 64, 5, 240), (64, 128, 1, 80)]), _arena(0x30, 2, 20, 20, 0)]
    d = diff(a, b)
    assert [(e.number, e.status) for e in d.arenas] == [(0, "both"), (2, "new"), (1, "gone")]
    assert d.arenas[0].growth("system") == 200 and d.arenas[2].figures["system"] == (50, 0)
    assert d.growth == {"system": 170, "in_use": -30, "free": 200, "top": 0}
    assert d.grew == [0, 2]
    classes = d.arenas[0].free_classes
    assert [(c.low, c.count, c.bytes_growth) for c in classes] == [(32, (2, 5), 144), (64, (0, 1), 80)]
    doc = jsondoc.diff_json(d)
    assert doc["arenas"][0]["system"] == [100, 300] and doc["arenas"][0]["system_growth"] == 200
    assert doc["arenas"][0]["free_classes"][0] == {"low": 32, "high": 64, "count": [2, 5], "bytes": [96, 240],
                                                   "bytes_growth": 144}
    text = diff_text(d)
    assert "arena 0: free chunks grew in 32-64 B (2 -> 5 chunks, +144 B)" in text
    assert text.startswith("arenas: 2 -> 2\n") and not d.restarted and doc["arena_counts"] == [2, 2]
    assert text.endswith("grew: arena 0, 2 (system memory or in-use bytes)\n")
    mine = diff_text(d, "mimalloc")        # mimalloc's rows are owners (threads' heaps), its pieces blocks
    assert mine.startswith("owners: 2 -> 2\n") and "arena" not in mine and "chunk" not in mine
    assert "owner 0: free blocks grew in 32-64 B (2 -> 5 blocks, +144 B)" in mine


def test_across_a_restart_arenas_are_matched_by_number_and_their_count_compared():
    """No arena at the same address: two processes (ASLR moves every arena). The main arena is matched to the
    main arena and thread arenas by number, so a remedy that capped the arenas shows as arenas gone, not as
    every arena new."""
    a = [_arena(0x7F0000001000, 0, 100, 60, 40), _arena(0x7E0000000030, 1, 64, 10, 54),
         _arena(0x7D0000000030, 2, 64, 12, 52), _arena(0x7C0000000030, 3, 64, 8, 56)]
    b = [_arena(0x7F5500001000, 0, 90, 60, 30), _arena(0x7E5500000030, 1, 64, 30, 34)]
    d = diff(a, b)
    assert d.restarted and d.arena_counts == (4, 2)
    assert {(e.number, e.status, e.address) for e in d.arenas} == {
        (0, "both", 0x7F5500001000), (1, "both", 0x7E5500000030), (2, "gone", 0x7D0000000030),
        (3, "gone", 0x7C0000000030)}
    assert d.growth["system"] == 154 - 292
    text = diff_text(d)
    assert text.splitlines()[:2] == [
        "two processes (no arena at the same address: a restart between the snapshots): arenas are matched by "
        "their number, the main arena to the main arena; an address is the second's, the first's for an arena gone",
        "arenas: 4 -> 2"]
    assert jsondoc.diff_json(d)["restarted"] is True


def test_arenas_that_did_not_change_are_named_not_listed():
    a = [_arena(0x10, 0, 100, 60, 40), _arena(0x20, 1, 50, 50, 0)]
    b = [_arena(0x10, 0, 100, 60, 40), _arena(0x20, 1, 80, 70, 10)]
    lines = diff_text(diff(a, b)).splitlines()
    assert [line.split()[0] for line in lines[2:4]] == ["1", "total"]
    assert lines[4] == "unchanged, not listed: arena 0"


@pytest.fixture(scope="module")
def report_json(tmp_path_factory):
    """report_json(name) -> 'heapwalk report --json' of the system glibc's core NAME."""
    tmp = tmp_path_factory.mktemp("diff")

    @functools.cache
    def compute(name: str) -> dict:
        c = capture("system", name)
        out = tmp / f"{name}.json"
        result = run_gdb([str(c.exe), str(c.core)], [f"heapwalk report --json {out}"],
                         iex=glibc("system").gdb_settings(True))
        assert result.returncode == 0, result.stderr
        return json.loads(out.read_text())
    return compute


@pytest.mark.cores
def test_the_reader_takes_back_what_the_report_wrote(report_json):
    """A real report's JSON, read back: each arena's figures are the report's, and a diff with itself is
    zero everywhere."""
    doc = report_json("thread_arenas")
    arenas = jsondoc.read_snapshot(doc)
    rows = doc["report"]["arenas"]
    assert [a.address for a in arenas] == [r["address"] for r in rows]
    for a, r, s in zip(arenas, rows, doc["arenas"]):
        assert (a.system, a.in_use, a.free, a.top, a.reclaim) == (r["system"], r["in_use"], sum(r["free"].values()),
                                                                   r["top"], r["trim"])
        assert a.heaps == tuple((h["address"], h["size"]) for h in s["heaps"])
        assert sum(b.count for b in a.histogram) == sum(h["count"] for h in
                                                        doc["report"]["histogram_by_arena"][str(r["number"])])
    same = diff(arenas, arenas)
    assert not same.grew and all(v == 0 for v in same.growth.values())
    assert all(not e.free_classes for e in same.arenas)


@pytest.mark.parametrize("broken", [{}, {"report": None}, {"report": {"arenas": [{"number": 0}]}}])
@pytest.mark.cores
def test_the_reader_refuses_what_is_not_a_report(report_json, broken):
    doc = {**copy.deepcopy(report_json("bins")), **broken} if broken else {"arenas": []}
    with pytest.raises(jsondoc.DocumentError):
        jsondoc.read_snapshot(doc)


def _document(name: str, system: int, beside: dict | None = None) -> dict:
    """A report document of allocator NAME with one arena holding SYSTEM bytes, and BESIDE's parts."""
    doc = {"allocator": name, "report": {"arenas": [{"address": 0x1000, "number": 0, "system": system,
                                                     "in_use": system // 2, "free": {}, "top": 0, "trim": 0}]}}
    return {**doc, **(beside or {})}


def test_each_allocator_of_a_process_is_diffed_with_its_own(tmp_path, capsys):
    """A process with two allocators: each is compared with the same allocator of the other snapshot, under
    its name; one only the second snapshot has is said."""
    from heapwalk.cli.main import main
    a = _document("jemalloc", 4 << 20, {"glibc_malloc": _document("glibc", 1 << 20)})
    b = _document("jemalloc", 6 << 20, {"glibc_malloc": _document("glibc", 3 << 20), "x": _document("toy", 1)})
    for name, doc in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps(doc))
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json", str(tmp_path / "d.json")]) == 0
    out = capsys.readouterr().out
    jemalloc, glibc = out.split("\nglibc:\n")
    assert jemalloc.startswith("jemalloc:\n") and "+2.0" in jemalloc and "+2.0" in glibc
    assert "toy: in the second snapshot only" in glibc
    assert set(json.loads((tmp_path / "d.json").read_text())["allocators"]) == {"jemalloc", "glibc"}
