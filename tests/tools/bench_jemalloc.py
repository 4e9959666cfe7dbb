"""`make bench` on jemalloc: cores/jemalloc/je_bench.c (bench.c's random shape, eight workers each in an arena of its
own) run on Debian's libjemalloc2, and heapwalk's jemalloc commands timed on its core against the floor: one
read_memory of each run of adjacent active extents (the memory the program's allocations are in), in the same
gdb.  Before timing, the regions heapwalk finds the program holding in the workers' arenas must be exactly the
blocks the program says it keeps (its facts.json); a bench of a wrong answer is no bench."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "cores" / "scripts"))

import fresh  # noqa: E402
import harness  # noqa: E402
from bench_gdb import command_lines, gdb_run, load_line, timed_core  # noqa: E402

#: the Debian suite whose libjemalloc2 the bench runs on (this machine's own release)
SUITE = "bookworm"
COMMANDS = ("heapwalk report", "heapwalk bins", "heapwalk check", "heapwalk leaks",
            "heapwalk map --svg /dev/null --png /dev/null")
_DUMP = ROOT / "tests" / "tools" / "bench_je_extents.py"


@fresh.exclusive
def capture(size: str, chunks: int, build: Path) -> harness.Capture:
    """je_bench's core of SIZE (CHUNKS allocations), taken now unless a fresh one is there."""
    jemalloc = harness.prepare_jemalloc(build / "sysroots", SUITE)
    outdir = build / "bench" / f"jemalloc-{size}"
    env = {"HW_BENCH_CHUNKS": str(chunks)}
    if not harness.is_fresh_jemalloc("je_bench", outdir, jemalloc, env):
        harness.capture_jemalloc("je_bench", outdir, build / "bin", jemalloc, env)
    meta = json.loads((outdir / "je_bench" / "meta.json").read_text())
    return harness.Capture(name="je_bench", directory=outdir / "je_bench", exe=Path(meta["exe"]), pid=meta["pid"])


def heaps_and_blocks(cap: harness.Capture) -> tuple[list[list[int]], int]:
    """The runs of active extents and the blocks in use, checked against the program's own count."""
    out = cap.directory.parent / "extents.json"
    os.environ["HW_BENCH_OUT"] = str(out)
    try:
        gdb_run(cap.exe, cap.core, [f"source {_DUMP}"])
    finally:
        del os.environ["HW_BENCH_OUT"]
    dump = json.loads(out.read_text())
    ledger = json.loads(cap.ledger.read_text())
    workers = {str(t["arena"]) for t in ledger["threads"] if t["role"] == "worker"}
    held = sum(n for arena, n in dump["blocks_by_arena"].items() if arena in workers)
    live = json.loads((cap.directory / "facts.json").read_text())["live"]
    if held != live:
        raise RuntimeError(f"heapwalk finds {held} blocks in the workers' arenas, je_bench keeps {live}")
    return dump["heaps"], dump["blocks"]


def measure(size: str, chunks: int, runs: int, build: Path) -> dict:
    """The numbers of the jemalloc bench of SIZE (see the module)."""
    cap = capture(size, chunks, build)
    heaps, blocks = heaps_and_blocks(cap)
    heap_file = cap.directory.parent / "heaps.json"
    heap_file.write_text(json.dumps(heaps))
    result = {"size": size, "allocator": "jemalloc", "jemalloc": SUITE, "blocks": blocks,
              "extent_bytes": sum(n for _, n in heaps), "extent_runs": len(heaps),
              **timed_core(cap, heap_file, runs, COMMANDS, blocks, "blocks")}
    (cap.directory.parent / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def table(result: dict) -> str:
    """The numbers as a plain-text table."""
    extents = f"{result['extent_bytes'] / (1 << 20):,.0f} MiB of active extents in {result['extent_runs']:,} runs"
    heading = (f"bench {result['size']} on jemalloc ({result['jemalloc']}'s libjemalloc2), random shape: "
               f"{result['blocks']:,} blocks in use, {extents}; median of {result['runs']} runs")
    return "\n".join([heading, load_line(result, "one bulk read per run of adjacent extents"),
                      *command_lines(result["commands"], "blocks", 44)])
