"""`make bench` on tcmalloc and mimalloc: cores/common/bench_preload.c (bench.c's random shape, eight workers) run
on Debian's gperftools tcmalloc and mimalloc 2 and 3 (LD_PRELOAD), and heapwalk's commands timed on each core
against the floor: the memory the allocator's blocks lie in, read as the glibc and jemalloc benches read theirs,
in the same gdb.  Before timing, heapwalk must find in use every block the program says it holds (its live.bin);
a bench of a wrong answer is no bench."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "cores" / "scripts"))

import fresh  # noqa: E402
import harness  # noqa: E402
import mibuilds  # noqa: E402
import tcbuilds  # noqa: E402
from bench_gdb import command_lines, gdb_run, load_line, timed_core  # noqa: E402

COMMANDS = ("heapwalk report", "heapwalk check", "heapwalk leaks", "heapwalk map --svg /dev/null --png /dev/null")
SOURCE = ROOT / "cores" / "common" / "bench_preload.c"
_DUMP = ROOT / "tests" / "tools" / "bench_dump.py"
#: blocks heapwalk may find in use beyond the program's: what the C library and the allocator allocate for
#: themselves with it (each thread's TLS vector, stdio's nothing: the program writes with write(2))
SLACK = 64


@dataclass(frozen=True)
class Preloaded:
    """An allocator the bench runs bench_preload on: its NAME in the tables, the word `heapwalk` calls it by
    (TITLE's first), and how it is fetched (PREPARE(dest) gives an object with environment() and version)."""

    name: str
    title: str
    prepare: object


ALLOCATORS = {
    "tcmalloc": Preloaded("tcmalloc (bookworm)", "tcmalloc",
                          lambda dest: tcbuilds.prepare_tcmalloc(dest, "bookworm")),
    "mimalloc": Preloaded("mimalloc 2 (bookworm)", "mimalloc", lambda dest: mibuilds.prepare_mimalloc(dest, "bookworm")),
    "mimalloc3": Preloaded("mimalloc 3 (trixie)", "mimalloc", lambda dest: mibuilds.prepare_mimalloc(dest, "trixie")),
}


def program(bindir: Path) -> Path:
    """cores/common/bench_preload.c built into BINDIR (again only when its sources changed)."""
    exe = bindir / "bench_preload"
    stamp = bindir / "bench_preload.sha"
    digest = fresh.digest([SOURCE, ROOT / "cores" / "common" / "bench_shape.h"])
    if not exe.exists() or not stamp.exists() or stamp.read_text() != digest:
        bindir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O1", "-Wall", "-pthread", "-o", str(exe), str(SOURCE)], check=True)
        stamp.write_text(digest)
    return exe


@fresh.exclusive
def capture(key: str, size: str, chunks: int, build: Path) -> harness.Capture:
    """bench_preload's core of SIZE (CHUNKS allocations) on allocator KEY, taken now unless one of the same
    program, allocator and size is there."""
    lib = ALLOCATORS[key].prepare(build / "sysroots")
    exe = program(build / "bin")
    outdir = build / "bench" / f"{key}-{size}"
    env = {**lib.environment(), "HW_BENCH_CHUNKS": str(chunks)}
    launcher = lib.launcher() if hasattr(lib, "launcher") else []
    inputs = json.dumps({"exe": (build / "bin" / "bench_preload.sha").read_text(), "env": env, "launcher": launcher,
                         "version": lib.version}, sort_keys=True)
    stamp = outdir / "inputs.json"
    if not (outdir / "core").exists() or not stamp.exists() or stamp.read_text() != inputs:
        proc = harness.run_to_snapshot(exe, outdir, env=env, timeout=600, launcher=launcher)
        try:
            harness.take_core(proc.pid, outdir / "core")
        finally:
            proc.kill()
            proc.wait()
        stamp.write_text(inputs)
    return harness.Capture(name="bench_preload", directory=outdir, exe=exe, pid=0)


def heaps_and_blocks(key: str, cap: harness.Capture) -> tuple[list[list[int]], int]:
    """The memory the blocks lie in and the blocks in use, checked against what the program holds."""
    out = cap.directory / "heap.json"
    os.environ.update(HW_BENCH_OUT=str(out), HW_BENCH_ALLOCATOR=ALLOCATORS[key].title,
                      HW_BENCH_LIVE=str(cap.directory / "live.bin"))
    try:
        gdb_run(cap.exe, cap.core, [f"source {_DUMP}"])
    finally:
        for name in ("HW_BENCH_OUT", "HW_BENCH_ALLOCATOR", "HW_BENCH_LIVE"):
            del os.environ[name]
    dump = json.loads(out.read_text())
    if dump["missing"] or not 0 <= dump["blocks"] - dump["live"] <= SLACK:
        raise RuntimeError(f"on {key}, heapwalk misses {dump['missing']} of the {dump['live']} blocks bench_preload "
                           f"holds and finds {dump['blocks']} in use in all")
    return dump["heaps"], dump["blocks"]


def measure(key: str, size: str, chunks: int, runs: int, build: Path) -> dict:
    """The numbers of the bench of SIZE on allocator KEY (see the module)."""
    cap = capture(key, size, chunks, build)
    heaps, blocks = heaps_and_blocks(key, cap)
    heap_file = cap.directory / "heaps.json"
    heap_file.write_text(json.dumps(heaps))
    result = {"size": size, "allocator": key, "name": ALLOCATORS[key].name, "blocks": blocks,
              "block_bytes": sum(n for _, n in heaps), "block_runs": len(heaps),
              **timed_core(cap, heap_file, runs, COMMANDS, blocks, "blocks")}
    (cap.directory / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def table(result: dict) -> str:
    """The numbers as a plain-text table."""
    memory = f"{result['block_bytes'] / (1 << 20):,.0f} MiB of its heap in {result['block_runs']:,} runs"
    heading = (f"bench {result['size']} on {result['name']}, random shape: {result['blocks']:,} blocks in use, "
               f"{memory}; median of {result['runs']} runs")
    return "\n".join([heading, load_line(result, "one bulk read per run of its heap"),
                      *command_lines(result["commands"], "blocks", 44)])
