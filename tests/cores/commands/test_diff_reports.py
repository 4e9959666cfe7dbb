"""The diff's reader on real reports: it takes back what the report's JSON writer wrote on reproducer cores, and
refuses what is not a report."""

from __future__ import annotations

import copy
import functools
import json

import pytest

from conftest import capture, glibc, run_gdb
from heapwalk.analysis.diff import diff
from heapwalk.output import jsondoc


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
