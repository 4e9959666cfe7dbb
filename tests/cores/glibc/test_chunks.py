"""'heapwalk chunks' and 'heapwalk chunk ADDR' on real cores."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from heapwalk.output import jsondoc

from conftest import capture, glibc, run_gdb

pytestmark = pytest.mark.cores


def _chunks(g, name, args, tmp_path):
    c = capture(g, name)
    out = tmp_path / "chunks.json"
    result = run_gdb([str(c.exe), str(c.core)], [f"heapwalk chunks {args} --json {out}"],
                     iex=glibc(g).gdb_settings(False))
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())["chunks"], result.stdout


@pytest.mark.parametrize("g", ["system", "sid"])
def test_chunks_lists_every_chunk_the_accounting_counts(json_of, g, tmp_path):
    rows, text = _chunks(g, "thread_arenas", "--limit 5", tmp_path)
    doc = json_of(g, "thread_arenas", False)
    by_arena = {a["address"]: a["accounting"]["chunks"] for a in doc["arenas"]}
    for arena, counts in by_arena.items():
        have = Counter(r["state"] for r in rows if r["arena"] == arena)
        assert have == Counter({k: v for k, v in counts.items() if v}), hex(arena)
    assert f"{len(rows)} chunks" in text and "(first 5 shown; --limit 0 shows all)" in text
    for a, b in zip(rows, rows[1:]):  # address order within a heap, each chunk ending where the next begins
        if a["heap"] == b["heap"]:
            assert b["address"] == a["address"] + a["size"], (a, b)


def test_chunks_filters_by_state_size_and_arena(tmp_path):
    free, _ = _chunks("system", "bins", "--free --min 0x100 --max 1k", tmp_path)
    assert free and all(r["state"] in ("tcache", "fast", "unsorted", "small", "large") for r in free)
    assert all(0x100 <= r["size"] <= 1024 for r in free)
    used, _ = _chunks("system", "thread_arenas", "--used --arena 1", tmp_path)
    assert used and {r["state"] for r in used} <= {"in_use", "tcache_struct"} and len({r["arena"] for r in used}) == 1


def test_chunk_describes_a_tcache_entry_and_its_neighbours(cores, tmp_path):
    ledger = json.loads(cores["bins"].ledger.read_text())
    entry = ledger["threads"][0]["tcache"][0]["entries"][0]
    out_json = tmp_path / "chunk.json"
    result = run_gdb([str(cores["bins"].exe), str(cores["bins"].core)],
                     [f"heapwalk chunk {entry + 3:#x} --json {out_json}", "heapwalk chunk 0x10"])
    out = result.stdout
    assert f"{entry + 3:#x} is 19 bytes into the chunk at {entry - 16:#x}" in out
    assert "state tcache" in out and "listed in tcache bin 0 of thread 1, position 1 of" in out
    assert "previous: " in out and "next: " in out
    assert "0x10 is in no arena's heap and in no mmapped chunk" in result.stderr
    doc = json.loads(out_json.read_text())
    assert doc["schema_version"] == jsondoc.SCHEMA_VERSION and doc["address"] == entry + 3 and doc["offset"] == 19
    chunk = doc["chunk"]
    assert (chunk["address"], chunk["state"], chunk["mmapped"]) == (entry - 16, "tcache", False)
    assert chunk["listed"].startswith("tcache bin 0 of thread 1, position 1 of")
    assert doc["previous"]["address"] + doc["previous"]["size"] == chunk["address"]
    assert doc["next"]["address"] == chunk["address"] + chunk["size"]


def test_chunk_finds_an_mmapped_chunk(cores, tmp_path):
    ledger = json.loads(cores["mmapped"].ledger.read_text())
    mem = ledger["mmapped"][0]["mem"]
    out_json = tmp_path / "chunk.json"
    out = run_gdb([str(cores["mmapped"].exe), str(cores["mmapped"].core)],
                  [f"heapwalk chunk {mem + 100:#x} --json {out_json}"]).stdout
    assert f"{mem + 100:#x} is 116 bytes into the mmapped chunk at {mem - 16:#x}" in out
    assert "state: in use" in out
    doc = json.loads(out_json.read_text())
    assert (doc["chunk"]["address"], doc["chunk"]["mmapped"], doc["chunk"]["state"]) == (mem - 16, True, "in_use")
    assert doc["chunk"]["span"] % 4096 == 0 and doc["previous"] is None and doc["offset"] == 116


def test_threads_shows_each_thread_its_arena_and_each_arena_its_users(cores, core_json):
    c = cores["many_arenas"]
    out = run_gdb([str(c.exe), str(c.core)], ["heapwalk threads"]).stdout
    doc = core_json["many_arenas"]
    numbers = {a["address"]: a["number"] for a in doc["arenas"]}
    rows = {int(line.split("|")[2]): line for line in out.splitlines()
            if line.startswith("|") and line.split("|")[2].strip().isdigit() and "0x" in line}
    for t in doc["threads"]:
        assert f"#{numbers[t['arena']]} {t['arena']:#x}" in rows[t["lwp"]]
    assert f"{len(doc['threads'])} threads, {len(doc['arenas'])} arenas; arena limit" in out
    assert "arenas and their threads" in out
