"""The leak scan on reach.c's cores against the ledger the reproducer wrote, and 'heapwalk chunk' saying how a chunk
is reached or why it is leaked."""

from __future__ import annotations

import json

import pytest

from conftest import GLIBCS, capture, glibc, run_gdb

#: every kind of block cores/glibc/reach.c writes to its ledger
LEDGER_KINDS = {"live_stack", "global", "static_array", "interior", "chain", "anonymous", "mmapped", "tls",
                "thread_stack", "single", "ring", "tree", "in_freed_chunk", "points_to_reached", "thread_single",
                "thread_chain"}


@pytest.mark.cores
@pytest.mark.parametrize("g", GLIBCS)
def test_the_leaked_and_unreferenced_chunks_equal_the_reach_ledger(g, tmp_path):
    c = capture(g, "reach")
    out = tmp_path / "leaks.json"
    result = run_gdb([str(c.exe), str(c.core)], [f"heapwalk leaks --json {out}"], iex=glibc(g).gdb_settings(False))
    assert out.exists(), result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    doc = json.loads(out.read_text())
    lines = [line.split() for line in (c.directory / "reach.txt").read_text().splitlines()]
    assert {w[1] for w in lines} == LEDGER_KINDS and all(len(w) in (3, 6) for w in lines)
    leaked = {int(w[2], 16) - 16: w for w in lines if w[0] == "leaked"}
    reached = {int(w[2], 16) - 16 for w in lines if w[0] == "reached"}
    found = {b["address"]: b for b in doc["leaked"]}
    assert set(found) == set(leaked)
    assert not reached & set(found)
    assert {a for a, b in found.items() if b["unreferenced"]} == {a for a, w in leaked.items() if w[3] == "1"}
    for address, w in leaked.items():
        if w[3] == "1":
            assert (found[address]["holds_count"], found[address]["holds_bytes"]) == (int(w[4]), int(w[5])), w
    summary = doc["summary"]
    assert summary["leaked_count"] == len(leaked)
    assert summary["leaked_bytes"] == sum(b["size"] for b in doc["leaked"])
    assert summary["unreferenced_count"] == sum(w[3] == "1" for w in leaked.values())
    assert summary["in_rings_count"] == sum(w[1] == "ring" for w in leaked.values())
    assert "leaked: 20 chunks" in result.stdout


@pytest.mark.cores
def test_chunk_says_how_a_chunk_is_reached_or_why_it_is_leaked():
    c = capture("system", "reach")
    lines = [line.split() for line in (c.directory / "reach.txt").read_text().splitlines()]
    first = {}
    for w in lines:
        first.setdefault(w[1], w[2])
    kinds = ("global", "chain", "tls", "thread_stack", "live_stack", "mmapped", "anonymous", "ring", "tree")
    result = run_gdb([str(c.exe), str(c.core)], [f"heapwalk chunk {first[k]}" for k in kinds],
                     iex=glibc("system").gdb_settings(False))
    said = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith(("reached", "leaked"))]
    assert len(said) == len(kinds), result.stdout + result.stderr
    expect = ("reached: data of reach (", "reached: data of reach (", "reached: TLS of thread ",
              "reached: stack of thread ", "reached: stack of thread 1, frame ", "reached: mmapped chunk ",
              "reached: anonymous mapping ", "leaked: only other leaked chunks", "leaked: nothing reachable")
    for text, start in zip(said, expect):
        assert text.startswith(start), (text, start)
    assert "g_single" in said[0] and "g_chain" in said[1] and said[1].endswith("-> this chunk")
