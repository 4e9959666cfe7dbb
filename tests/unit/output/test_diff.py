"""The diff of two snapshots on values: the diff's JSON and text, each allocator diffed with its own, in its own
words (the reader on real reports: test_diff_reports.py)."""

from __future__ import annotations

import copy
import json

from heapwalk.analysis.diff import ArenaTotals, diff
from heapwalk.analysis.report import Bucket
from heapwalk.output import jsondoc
from heapwalk.output.difftext import diff_text
from heapwalk.cpython.shown import WORDS as CPYTHON
from heapwalk.glibc.show.reportlines import WORDS as GLIBC_WORDS
from heapwalk.jemalloc.reportlines import WORDS as JEMALLOC
from heapwalk.mimalloc.families import WORDS as MIMALLOC
from heapwalk.tcmalloc.allocator import WORDS as TCMALLOC


def _words(name: str, words) -> dict:
    return jsondoc.words_json(name, words)


GLIBC = _words("glibc", GLIBC_WORDS)


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
    text = diff_text(d, GLIBC)
    assert "arena 0: free chunks grew in 32-64 B (2 -> 5 chunks, +144 B)" in text
    assert text.startswith("arenas: 2 -> 2\n") and not d.restarted and doc["arena_counts"] == [2, 2]
    assert text.endswith("grew: arena 0 (system +200 B), 2 (system +20 B, in use +20 B)\n")
    mine = diff_text(d, _words("mimalloc", MIMALLOC))   # mimalloc's rows are owners (threads' heaps), its blocks
    assert mine.startswith("owners: 2 -> 2\n") and "arena" not in mine and "chunk" not in mine
    assert "owner 0: free blocks grew in 32-64 B (2 -> 5 blocks, +144 B)" in mine
    for name, words, counted in (("jemalloc", JEMALLOC, "regions"), ("tcmalloc", TCMALLOC, "objects"),
                                 ("cpython", CPYTHON, "blocks")):   # each in its own words, read from its JSON
        theirs = diff_text(d, jsondoc.read_words({"report": {"words": _words(name, words)}}, name))
        assert f"arena 0: free {counted} grew in 32-64 B (2 -> 5 {counted}, +144 B)" in theirs, theirs


def _named(address: int, number: int, system: int, in_use: int, kind: str, *users: str) -> ArenaTotals:
    return ArenaTotals(address, number, system, in_use, system - in_use, 0, (), kind=kind, users=users)


def test_across_a_restart_arenas_are_matched_by_their_threads_names_not_their_numbers():
    """No arena at the same address: two processes (ASLR moves every arena). A thread that took another arena
    number after the restart is followed by its name; the main arena is matched to the main arena."""
    a = [_named(0x7F0000001000, 0, 100, 60, "main", "server"), _named(0x7E0000000030, 1, 64, 10, "thread", "io"),
         _named(0x7D0000000030, 2, 64 << 20, 12, "thread", "cache")]
    b = [_named(0x7F5500001000, 0, 90, 60, "main", "server"), _named(0x7E5500000030, 1, 96 << 20, 30, "thread",
                                                                      "cache"),
         _named(0x7D5500000030, 2, 64, 10, "thread", "io")]
    d = diff(a, b)
    assert d.restarted and d.arena_counts == (3, 3) and d.unmatched == (0, 0)
    pairs = {e.number: e.figures["system"] for e in d.arenas}
    assert pairs == {0: (100, 90), 1: (64 << 20, 96 << 20), 2: (64, 64)}      # B's numbers, A's figures by name
    assert d.grew == [1]
    text = diff_text(d, GLIBC)
    assert text.startswith("two processes (no arena at the same address: a restart between the snapshots): arenas "
                           "are matched by the names of the threads that use them")
    assert text.endswith("grew: arena 1 (system +32.0 MiB, in use +18 B)\n")
    assert jsondoc.diff_json(d)["restarted"] is True


def test_across_a_restart_arenas_nothing_ties_are_compared_together():
    """Threads unnamed, or all of one name (a pool): nothing but the main arena is matched; the others are
    listed on their side and compared together, and none is said to have grown."""
    a = [_named(0x7F0000001000, 0, 100, 60, "main", ""), _named(0x7E0000000030, 1, 64, 10, "thread", "worker"),
         _named(0x7D0000000030, 2, 64, 12, "thread", "worker"), _named(0x7C0000000030, 3, 64, 8, "thread", "")]
    b = [_named(0x7F5500001000, 0, 90, 60, "main", ""), _named(0x7E5500000030, 1, 640, 30, "thread", "worker")]
    d = diff(a, b)
    assert d.unmatched == (3, 1) and d.grew == []
    assert {(e.number, e.status) for e in d.arenas} == {(0, "both"), (1, "unmatched"), (2, "unmatched"),
                                                        (3, "unmatched")}
    assert d.unmatched_growth["system"] == 640 - 192
    lines = diff_text(d, GLIBC).splitlines()
    assert "3 of the first's and 1 of the second's are not matched" in lines[0]
    assert any(line.startswith("not matched, together: 3 arenas of the first -> 1 of the second: system +0.0 MiB")
               for line in lines)
    assert lines[-1] == "no matched arena grew"


def test_arenas_that_did_not_change_are_named_not_listed():
    a = [_arena(0x10, 0, 100, 60, 40), _arena(0x20, 1, 50, 50, 0)]
    b = [_arena(0x10, 0, 100, 60, 40), _arena(0x20, 1, 80, 70, 10)]
    lines = diff_text(diff(a, b), GLIBC).splitlines()
    assert [line.split()[0] for line in lines[2:4]] == ["1", "total"]
    assert lines[4] == "unchanged, not listed: arena 0"


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


def test_snapshots_of_two_allocators_are_compared_as_totals_each_in_its_words(tmp_path, capsys):
    """The same service restarted on jemalloc (LD_PRELOAD): glibc's arenas are not matched to jemalloc's; each
    side's totals are shown in its own figures (glibc's top and bins, jemalloc's dirty pages), and the JSON
    says which allocator each side is."""
    from heapwalk.cli.main import main
    a = {"allocator": "glibc", "report": {
        "words": {"title": "glibc's malloc", "arenas": "arenas", "system": "system", "pieces": "chunks",
                  "gives_back": "trim gives back", "top": True},
        "arenas": [{"address": 0x1000, "number": 0, "kind": "main", "system": 8 << 20, "in_use": 5 << 20,
                    "free": {"tcache": 1 << 10, "fast": 0, "small": 1 << 20}, "top": 1 << 20, "trim": 2 << 20}]}}
    b = {"allocator": "jemalloc", "report": {
        "words": {"title": "jemalloc", "arenas": "arenas", "system": "mapped", "pieces": "pieces",
                  "gives_back": "decay gives back", "top": False},
        "arenas": [{"address": 0x7000, "number": n, "kind": "auto", "system": 6 << 20, "in_use": 2 << 20,
                    "free": {"tcache": 2 << 10, "dirty": 3 << 20}, "top": 0, "trim": 3 << 20} for n in (0, 1)]}}
    for name, doc in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps(doc))
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json", str(tmp_path / "d.json")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("two allocators: the first snapshot's is glibc's malloc, the second's jemalloc: "
                               "each is shown in its own figures; no arena is matched")
    rows = {line[:34].strip(): line[34:].split() for line in lines[2:]}
    assert rows["arenas"] == ["1", "2", "+1"]
    assert rows["system / mapped"] == ["8", "MiB", "12", "MiB", "+4", "MiB"]
    assert rows["free: dirty"] == ["-", "6", "MiB"] and rows["free: fast"][-1] == "-"
    assert rows["top"] == ["1", "MiB", "-"]
    assert rows["trim gives back / decay gives back"] == ["2", "MiB", "6", "MiB", "+4", "MiB"]
    assert "grew: arena" not in out and "matched by" not in out
    doc = json.loads((tmp_path / "d.json").read_text())
    assert doc["arenas"] == [] and doc["across"]["titles"] == ["glibc's malloc", "jemalloc"]
    assert doc["growth"]["system"] == 4 << 20 and doc["arena_counts"] == [1, 2]


def test_the_diff_page_says_what_the_diff_says_and_the_check_sees_a_page_that_does_not():
    from figures import diff_page_disagreements
    from heapwalk.output.htmldiff import diff_html
    a = [_named(0x10, 0, 4 << 20, 1 << 20, "main", "server"), _named(0x20, 1, 2 << 20, 1 << 20, "thread", "io")]
    b = [_named(0x10, 0, 6 << 20, 3 << 20, "main", "server"), _named(0x20, 1, 2 << 20, 1 << 20, "thread", "io")]
    doc = {**jsondoc.diff_json(diff(a, b)), "words": {"arenas": "arenas", "pieces": "chunks", "top": True}}
    html = diff_html(doc, "a", "b")
    assert diff_page_disagreements(html, doc) == []
    assert "<p>Grew: arena 0 (system +2 MiB, in use +2 MiB).</p>" in html
    told = copy.deepcopy(doc)
    told["arenas"][1]["in_use_growth"] = 5
    told["growth"]["system"] += 1 << 20
    said = diff_page_disagreements(html, told)
    assert any(s.startswith("card system memory") for s in said) and any("says arenas [0] grew" in s for s in said)
