"""heapwalk's benchmark: times the commands on a large core of cores/glibc/bench.c (``make bench``).

For each command (report, bins, chunks --free, check) it runs ``gdb -batch`` on the core RUNS times, each a
whole process, and reports the median wall time, the median time of the command itself inside gdb (without
gdb's start and the loading of the core), gdb's peak RSS, and chunks walked per second.  The floor to
compare with is the time to read the same heap bytes once, one bulk read per heap, in the same gdb.  Then the
same program is run again and left at its snapshot, and the walk and ``heapwalk report`` are timed on it live
(``gdb -p``), where reads go to the process instead of a file, and ``heapwalk capture`` is timed on it beside
gcore's whole core (tests/tools/bench_capture.py).  Last, the capture's pause with and without its pre-copy, in
Debian's kernel under qemu (tests/tools/bench_precopy.py).

Sizes: smoke (60 thousand chunks, for the test that it runs), small (300 thousand, for quick runs), medium (1.5 million),
large (6 million chunks, over 1 GiB in nine arenas) and huge (66 million chunks, over 12 GiB: it needs about 24 GiB
of memory and 30 GiB of disk).  Two shapes of each: ordered (every third chunk freed in
address order, so the free lists run through memory in order) and random (half of the chunks freed in
random order after realloc churn, so the lists hop across the heaps, as in real programs).  Prints a table
per shape and writes build/bench/bench-SIZE.json (and each shape's numbers beside its core).
Nothing here fails on a slow machine: the numbers are reported, not judged.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "cores" / "scripts"))

import fresh  # noqa: E402
import harness  # noqa: E402
from bench_capture import capture_line, measure_capture, measure_service  # noqa: E402
from bench_precopy import measure_precopy, precopy_lines  # noqa: E402
import bench_docs  # noqa: E402
import bench_jemalloc  # noqa: E402
import bench_preload  # noqa: E402
from bench_gdb import TIMED, command_lines, floors, load_line, gdb_run, time_commands, value  # noqa: E402
from busy import stress, stress_line  # noqa: E402
from services import build_service  # noqa: E402

SIZES = {"smoke": 60_000, "small": 300_000, "medium": 1_500_000, "large": 6_000_000, "huge": 66_000_000}
#: the process the capture's pre-copy is timed on, in MiB, for each size (tests/tools/bench_precopy.py)
PRECOPY_MIB = {"smoke": 0, "small": 256, "medium": 1024, "large": 2048, "huge": 8192}
COMMANDS = ("heapwalk report", "heapwalk bins", "heapwalk chunks --free", "heapwalk check", "heapwalk leaks",
            "heapwalk map --svg /dev/null --png /dev/null")
BUILD = ROOT / "build"

@fresh.exclusive
def capture(size: str, bindir: Path, shape: str = "ordered") -> harness.Capture:
    """The bench core of SIZE and SHAPE, taken now unless one made from what it would be made from now is there
    (checked and taken under the lock the shards of make test share: a shard never reads a core another writes)."""
    outdir = workdir_of(size, shape)
    if not harness.is_fresh("bench", outdir, env=environment(size, shape)):
        harness.capture("bench", outdir, bindir, env=environment(size, shape))
    meta = json.loads((outdir / "bench" / "meta.json").read_text())
    return harness.Capture(name="bench", directory=outdir / "bench", exe=Path(meta["exe"]), pid=meta["pid"])


def workdir_of(size: str, shape: str) -> Path:
    """Where the bench core of SIZE and SHAPE and its numbers live: build/bench/SIZE for the ordered shape
    (as before there were two), build/bench/SHAPE-SIZE for the others."""
    return BUILD / "bench" / (size if shape == "ordered" else f"{shape}-{size}")


def environment(size: str, shape: str) -> dict[str, str]:
    """cores/glibc/bench.c's environment for SIZE and SHAPE."""
    return {"HW_BENCH_CHUNKS": str(SIZES[size]), "HW_BENCH_SHAPE": shape}


def heaps_and_chunks(cap: harness.Capture, workdir: Path) -> tuple[list[tuple[int, int]], int, dict]:
    """Every heap (address, bytes) of every arena, the chunks a walk meets, and the JSON document."""
    doc_path = workdir / "arenas.json"
    gdb_run(cap.exe, cap.core, [f"heapwalk arenas --json {doc_path}"])
    doc = json.loads(doc_path.read_text())
    heaps = [(h["address"], h["size"]) for a in doc["arenas"] for h in a["heaps"]]
    chunks = sum(sum(a["accounting"]["chunks"].values()) for a in doc["arenas"])
    return heaps, chunks, doc


def measure(cap: harness.Capture, runs: int, workdir: Path) -> dict:
    """The benchmark's numbers for CAP (see the module's docstring)."""
    heaps, chunks, doc = heaps_and_chunks(cap, workdir)
    heap_file = workdir / "heaps.json"
    heap_file.write_text(json.dumps(heaps))
    floor, floor_4m = floors(cap, heap_file, runs)
    loads = [gdb_run(cap.exe, cap.core, []) for _ in range(runs)]
    load_runs, load_peak = [wall for _, wall, _ in loads], max(peak for _, _, peak in loads)
    outs = [gdb_run(cap.exe, cap.core, [f"source {ROOT / 'tests' / 'tools' / 'bench_walk.py'}"])[0] for _ in range(runs)]
    walks = [value(out, "heapwalk-bench-walk") for out in outs]
    walk_seconds = statistics.median(float(w[0]) for w in walks)
    careful_seconds = statistics.median(float(value(out, "heapwalk-bench-careful")[0]) for out in outs)
    scan_seconds = statistics.median(float(value(out, "heapwalk-bench-leakscan")[0]) for out in outs)
    if int(walks[0][1]) != chunks:
        raise RuntimeError(f"the walk met {walks[0][1]} chunks, 'heapwalk arenas' {chunks}")
    results = time_commands(cap, COMMANDS, runs, load_peak, chunks, "chunks", (floor, floor_4m))
    return {
        "chunks": chunks,
        "heap_bytes": sum(n for _, n in heaps), "heaps": len(heaps), "arenas": len(doc["arenas"]),
        "largest_heap_bytes": max(n for _, n in heaps),
        "core_bytes": cap.core.stat().st_size, "runs": runs,
        "gdb_load_seconds": statistics.median(load_runs), "gdb_load_peak_rss_bytes": load_peak,
        "floor_seconds": floor, "floor_4m_seconds": floor_4m,
        "walk_seconds": walk_seconds, "walk_chunks_per_second": chunks / walk_seconds,
        "walk_times_floor": walk_seconds / floor,
        "careful_seconds": careful_seconds, "careful_times_floor": careful_seconds / floor,
        "leak_scan_seconds": scan_seconds, "leak_scan_times_floor": scan_seconds / floor,
        "commands": results,
    }


def measure_live(size: str, shape: str, bindir: Path, runs: int, workdir: Path) -> dict:
    """The walk and `heapwalk report` timed on a live bench process of SIZE and SHAPE (gdb -p; reads go
    through ptrace and /proc/PID/mem instead of the core file), which is killed afterwards."""
    exe = harness.build("bench", bindir)
    proc = harness.run_to_snapshot(exe, workdir / "live", env=environment(size, shape))
    try:
        walks = [value(gdb_run(exe, None, [f"source {ROOT / 'tests' / 'tools' / 'bench_walk.py'}"], proc.pid)[0],
                       "heapwalk-bench-walk") for _ in range(runs)]  # the one pass, live
        reports = [gdb_run(exe, None, [TIMED.format(command="heapwalk report")], proc.pid) for _ in range(runs)]
        captured = measure_capture(proc.pid, workdir)
    finally:
        proc.kill()
        proc.wait()
    walk_seconds = statistics.median(float(w[0]) for w in walks)
    seconds = statistics.median(float(value(out, "heapwalk-bench-seconds")[0]) for out, _, _ in reports)
    chunks = int(walks[0][1])
    return {"chunks": chunks, "walk_seconds": walk_seconds, "walk_chunks_per_second": chunks / walk_seconds,
            "report_wall_seconds": statistics.median(wall for _, wall, _ in reports),
            "report_command_seconds": seconds, "report_peak_rss_bytes": max(peak for _, _, peak in reports),
            "capture": captured}


def table(result: dict) -> str:
    """The numbers as a plain-text table."""
    mib = 1 << 20
    lines = [f"bench {result['size']}, {result['shape']} shape: {result['chunks']:,} chunks, {result['heap_bytes'] / mib:,.0f} MiB in "
             f"{result['heaps']} heaps of {result['arenas']} arenas (largest heap "
             f"{result['largest_heap_bytes'] / mib:,.0f} MiB); median of {result['runs']} runs",
             load_line(result, "one bulk read per heap"),
             f"the one pass alone (every heap swept, lists, accounting and trim): {result['walk_seconds']:.2f} s, "
             f"{result['walk_chunks_per_second']:,.0f} chunks/s, {result['walk_times_floor']:.1f} x the floor; "
             f"the careful walkers alone: {result['careful_seconds']:.2f} s, "
             f"{result['careful_times_floor']:.1f} x the floor",
             f"the leak scan alone (blocks, roots, scan, search): {result['leak_scan_seconds']:.2f} s, "
             f"{result['leak_scan_times_floor']:.1f} x the floor",
             *command_lines(result["commands"], "chunks", 26)]
    if result.get("live"):
        lines += live_lines(result)
    return "\n".join(lines)


def live_lines(result: dict) -> list[str]:
    """What the live process of RESULT's shape measured: the walk and report attached, and the capture."""
    live = result["live"]
    return [f"live attach ({result['shape']} shape, gdb -p, {live['chunks']:,} chunks): the walk "
            f"{live['walk_seconds']:.2f} s, {live['walk_chunks_per_second']:,.0f} chunks/s; heapwalk report "
            f"{live['report_wall_seconds']:.2f} s wall, {live['report_command_seconds']:.2f} s command, peak RSS "
            f"{live['report_peak_rss_bytes'] / (1 << 20):,.0f} MiB",
            f"{result['shape']} shape, live: " + capture_line(live["capture"])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="large")
    parser.add_argument("--shape", choices=("ordered", "random", "both"), default="both",
                        help="every third chunk freed in address order, half of them in random order with "
                        "realloc churn, or both (default)")
    parser.add_argument("--allocator", choices=("glibc", "jemalloc", *bench_preload.ALLOCATORS, "both", "all"),
                        default="all",
                        help="glibc's malloc (cores/glibc/bench.c, the shapes above), jemalloc (cores/jemalloc/je_bench.c, the "
                        "random shape), tcmalloc, mimalloc or mimalloc3 (cores/common/bench_preload.c, the random shape), "
                        "both (glibc and jemalloc) or all (default)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-live", action="store_true", help="skip the live-attach measurement")
    parser.add_argument("--json", type=Path, help="where to write the numbers (default build/bench/SIZE/bench.json)")
    parser.add_argument("--docs", type=Path, metavar="PAGE",
                        help="also write them, with the machine, the date and the method, into PAGE's part for "
                        "SIZE (make bench: docs/performance.md)")
    parser.add_argument("--stress-rounds", type=int, default=200,
                        help="captures of the busy service (cores/glibc/busy.c) in the stress run (0: none)")
    parser.add_argument("--precopy-mib", type=int, metavar="MIB",
                        help="the process the capture's pre-copy is timed on, in Debian's kernel under qemu "
                        "(default by size: " + ", ".join(f"{k} {v}" for k, v in PRECOPY_MIB.items()) + "; 0: none)")
    args = parser.parse_args(argv)
    shapes = ("ordered", "random") if args.shape == "both" else (args.shape,)
    glibc = args.allocator in ("glibc", "both", "all")
    results = [measure_shape(args.size, shape, args.runs, not args.no_live) for shape in shapes] if glibc else []
    jemalloc = bench_jemalloc.measure(args.size, SIZES[args.size], args.runs, BUILD) \
        if args.allocator in ("jemalloc", "both", "all") else None
    preloaded = [bench_preload.measure(key, args.size, SIZES[args.size], args.runs, BUILD)
                 for key in bench_preload.ALLOCATORS if args.allocator in (key, "all")]
    service = None if args.no_live else measure_service(BUILD / "bin", BUILD / "bench")
    busy = None if args.no_live or not args.stress_rounds else \
        stress(build_service("busy"), BUILD / "bench" / "stress", args.stress_rounds, 1200, args.stress_rounds // 7)
    precopy_mib = PRECOPY_MIB[args.size] if args.precopy_mib is None else args.precopy_mib
    precopied = measure_precopy(precopy_mib, BUILD / "bench" / "precopy") if precopy_mib else None
    more = []        # what follows the tables (the live lines are in them)
    if service is not None:
        more.append(f"16-arena service (cores/glibc/service.c, {service['workers']} workers): " + capture_line(service))
    if busy is not None:
        more.append(stress_line(busy))
    if precopied is not None:
        more += precopy_lines(precopied).splitlines()
    out = args.json or BUILD / "bench" / f"bench-{args.size}.json"
    data = {"size": args.size, "shapes": results, "jemalloc": jemalloc, "preloaded": preloaded,
            "service_capture": service, "stress": busy,
            "precopy": precopied, "machine": bench_docs.machine(), "argv": sys.argv[1:] if argv is None else argv,
            "lines": [line for r in results if r.get("live") for line in live_lines(r)] + more}
    out.write_text(json.dumps(data, indent=2) + "\n")
    print("\n\n".join([table(r) for r in results] + ([bench_jemalloc.table(jemalloc)] if jemalloc else [])
                      + [bench_preload.table(r) for r in preloaded]))
    for line in more:
        print("\n" + line)
    print(f"numbers written to {out}")
    if args.docs is not None:
        bench_docs.write(args.docs, data, other_runs(args.size))
        print(f"and to {args.docs}")
    return 0


def other_runs(size: str) -> dict[str, dict]:
    """The last run of each size but SIZE (and the smoke test's) that build/bench holds, by size."""
    out = {}
    for other in SIZES:
        path = BUILD / "bench" / f"bench-{other}.json"
        if other not in (size, "smoke") and path.exists():
            out[other] = json.loads(path.read_text())
    return out


def measure_shape(size: str, shape: str, runs: int, live: bool) -> dict:
    """The numbers of the bench core of SIZE and SHAPE (and of its live process when LIVE)."""
    cap = capture(size, BUILD / "bin", shape)
    workdir = cap.directory.parent
    result = {"size": size, "shape": shape, **measure(cap, runs, workdir)}
    if live:
        result["live"] = measure_live(size, shape, BUILD / "bin", runs, workdir)
    result["ledger"] = json.loads(cap.ledger.read_text())["facts"]
    (workdir / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    sys.exit(main())
