"""The benchmark's smoke test: it runs on its smallest core, in the shape of real heaps (freed in random
order), and its numbers hang together (not its speed)."""

from __future__ import annotations

import json

import pytest

import bench

pytestmark = pytest.mark.cores


def test_the_smoke_benchmark_runs_and_counts_what_the_reproducer_holds(tmp_path):
    out = tmp_path / "bench.json"
    assert bench.main(["--size", "smoke", "--shape", "random", "--runs", "1", "--json", str(out),
                       "--stress-rounds", "0"]) == 0
    document = json.loads(out.read_text())
    assert [r["shape"] for r in document["shapes"]] == ["random"]
    for result in document["shapes"]:
        _check(result)
    _check_jemalloc(document["jemalloc"])
    import bench_preload
    assert [r["allocator"] for r in document["preloaded"]] == list(bench_preload.ALLOCATORS)
    for result in document["preloaded"]:
        _check_preloaded(result)


def _check_preloaded(result: dict) -> None:
    """A tcmalloc or mimalloc run's numbers hang together (that heapwalk found in use every block bench_preload
    holds, and at most `bench_preload.SLACK` more, the bench checked before timing)."""
    import bench_preload
    assert result["blocks"] >= bench.SIZES["smoke"] // 2 and result["block_bytes"] > 0 and result["block_runs"] > 0
    assert [r["command"] for r in result["commands"]] == list(bench_preload.COMMANDS)
    assert result["floor_seconds"] > 0 and result["floor_4m_seconds"] > 0
    for r in result["commands"]:
        assert r["command_seconds"] > 0 and r["wall_seconds"] >= r["command_seconds"] and r["times_floor"] > 0


def _check_jemalloc(result: dict) -> None:
    """The jemalloc run's numbers hang together (that heapwalk found the blocks je_bench keeps in its workers'
    arenas, exactly, the bench checked before timing)."""
    import bench_jemalloc
    assert result["allocator"] == "jemalloc" and result["blocks"] >= bench.SIZES["smoke"] // 2
    assert [r["command"] for r in result["commands"]] == list(bench_jemalloc.COMMANDS)
    assert result["floor_seconds"] > 0 and result["floor_4m_seconds"] > 0 and result["extent_bytes"] > 0 \
        and 0 < result["extent_runs"]
    for r in result["commands"]:
        assert r["command_seconds"] > 0 and r["wall_seconds"] >= r["command_seconds"] and r["times_floor"] > 0
    assert json.loads((bench.BUILD / "bench" / "jemalloc-smoke" / "bench.json").read_text())["blocks"] == \
        result["blocks"]


def _check(result: dict) -> None:
    """One shape's numbers hang together, and each worker's arena holds what the worker kept."""
    assert result["chunks"] >= 0.45 * result["ledger"]["chunks_requested"] and result["arenas"] == 9
    assert [r["command"] for r in result["commands"]] == list(bench.COMMANDS)
    for r in result["commands"]:
        assert r["command_seconds"] > 0 and r["wall_seconds"] >= r["command_seconds"]
        assert r["peak_rss_bytes"] > 10 << 20 and r["chunks_per_second"] > 0
    assert result["floor_seconds"] > 0 and result["floor_4m_seconds"] > 0 and result["walk_seconds"] > 0
    # the live run is the same program with the same seeds: the same chunks, walked through the process
    live = result["live"]
    assert live["chunks"] == result["chunks"] and live["walk_seconds"] > 0
    assert live["report_wall_seconds"] >= live["report_command_seconds"] > 0
    # each worker's arena holds exactly the allocations the worker still has (the ledger's live_TID)
    doc = json.loads((bench.workdir_of("smoke", result["shape"]) / "arenas.json").read_text())
    lwp_of = {t["arena"]: t["lwp"] for t in doc["threads"]}
    live = {int(k[5:]): v for k, v in result["ledger"].items() if k.startswith("live_")}
    assert len(live) == result["ledger"]["workers"] == 8
    in_use = {lwp_of[a["address"]]: a["accounting"]["chunks"]["in_use"] for a in doc["arenas"] if not a["number"] == 0}
    assert in_use == live
    assert all(a["accounting"]["balanced"] for a in doc["arenas"])
    kinds = {k for a in doc["arenas"] for k, n in a["accounting"]["chunks"].items() if n}
    assert {"tcache", "unsorted", "small", "large", "top"} <= kinds
