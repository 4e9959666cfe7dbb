"""How `make bench` runs gdb: one `gdb -batch` per measurement, with heapwalk loaded, its output and gdb's own
peak RSS read back; the floor (one read_memory per heap, then the same bytes in reads of 4 MiB) and the timing of a
command, each run inside gdb."""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GDBINIT = ROOT / "gdbinit"

#: runs inside gdb: times one command (its output discarded) and prints the seconds
TIMED = ("python import time as _t; _s = _t.perf_counter(); gdb.execute({command!r}, to_string=True); "
          "print('heapwalk-bench-seconds %.6f' % (_t.perf_counter() - _s))")
#: runs inside gdb: reads each heap [address, size) with one read_memory call, then again in reads of 4 MiB
#: (heapwalk's window: the same bytes without a fresh buffer of a heap's size each time), prints both
FLOOR = ("python import time as _t, json as _j; _h = _j.load(open({heaps!r})); _i = gdb.selected_inferior(); "
         "_s = _t.perf_counter(); _n = sum(len(_i.read_memory(a, n)) for a, n in _h); "
         "print('heapwalk-bench-floor %.6f %d' % (_t.perf_counter() - _s, _n)); _s = _t.perf_counter(); "
         "_n = sum(len(_i.read_memory(a + o, min(4 << 20, n - o))) for a, n in _h for o in range(0, n, 4 << 20)); "
         "print('heapwalk-bench-floor4m %.6f %d' % (_t.perf_counter() - _s, _n))")


#: gdb's last command in a bench run: its own peak RSS (VmHWM, of its memory since it started: wait4's ru_maxrss
#: would also count the memory of this Python process that gdb was started from, before its exec)
_HWM = ("python print('heapwalk-bench-hwm ' + next(line.split()[1] for line in open('/proc/self/status') "
        "if line.startswith('VmHWM:')))")


def gdb_run(exe: Path, core: Path | None, commands: list[str], pid: int | None = None) -> tuple[str, float, int]:
    """Runs gdb -batch with heapwalk and COMMANDS on the core (or attached to the live process PID):
    (stdout, wall seconds, gdb's peak RSS in bytes)."""
    cmd = ["gdb", "-nx", "-batch", "-q", "-x", str(GDBINIT)]
    for c in [*commands, _HWM]:
        cmd += ["-ex", c]
    cmd += [str(exe), str(core)] if pid is None else ["-p", str(pid)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        proc.wait()
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        text, errors = out.read(), err.read()
    if "Traceback" in text + errors or "internal error" in text + errors:
        raise RuntimeError(f"{' '.join(commands)} failed:\n{text}\n{errors}")
    return text, wall, int(value(text, "heapwalk-bench-hwm")[0]) * 1024


def value(out: str, tag: str) -> list[str]:
    """The words after TAG on the line of OUT that starts with it."""
    line = next(line for line in out.splitlines() if line.startswith(tag))
    return line.split()[1:]


def floors(cap, heap_file: Path, runs: int) -> tuple[float, float]:
    """The floor of CAP's heaps (listed in HEAP_FILE), median of RUNS: read once whole, and in 4 MiB reads.  One
    untimed run first: a core just written (and made sparse, a copy) is read from the disk the first time, and
    the commands timed after it find it in the page cache."""
    gdb_run(cap.exe, cap.core, [FLOOR.format(heaps=str(heap_file))])
    outs = [gdb_run(cap.exe, cap.core, [FLOOR.format(heaps=str(heap_file))])[0] for _ in range(runs)]
    return (statistics.median(float(value(out, "heapwalk-bench-floor ")[0]) for out in outs),
            statistics.median(float(value(out, "heapwalk-bench-floor4m")[0]) for out in outs))


def time_commands(cap, commands, runs: int, load_peak: int, count: int, unit: str, floor: tuple[float, float]
                  ) -> list[dict]:
    """Each of COMMANDS timed RUNS times on CAP's core: median seconds inside gdb and wall seconds, the peak
    RSS and that peak above gdb's own with the core loaded (LOAD_PEAK) per million of the COUNT UNITs walked,
    UNITs a second, and the seconds against the FLOOR's two reads (`floors`)."""
    results = []
    for command in commands:
        walls, inside, rss = [], [], []
        for _ in range(runs):
            out, wall, peak = gdb_run(cap.exe, cap.core, [TIMED.format(command=command)])
            walls.append(wall)
            inside.append(float(value(out, "heapwalk-bench-seconds")[0]))
            rss.append(peak)
        seconds = statistics.median(inside)
        results.append({"command": command, "wall_seconds": statistics.median(walls), "command_seconds": seconds,
                        "peak_rss_bytes": max(rss), f"rss_per_million_{unit}": (max(rss) - load_peak) / count * 1e6,
                        f"{unit}_per_second": count / seconds if seconds else None, "times_floor": seconds / floor[0],
                        "times_floor_4m": seconds / floor[1]})
    return results


def timed_core(cap, heap_file: Path, runs: int, commands, count: int, unit: str) -> dict:
    """What every core of the bench gets, CAP's with its heaps listed in HEAP_FILE and COUNT UNITs (chunks or
    blocks): its size, gdb's start and load (median seconds, peak RSS), the floors (`floors`) and COMMANDS timed
    RUNS times each (`time_commands`)."""
    floor = floors(cap, heap_file, runs)
    loads = [gdb_run(cap.exe, cap.core, []) for _ in range(runs)]
    load_peak = max(peak for _, _, peak in loads)
    return {"core_bytes": cap.core.stat().st_size, "runs": runs,
            "gdb_load_seconds": statistics.median(wall for _, wall, _ in loads), "gdb_load_peak_rss_bytes": load_peak,
            "floor_seconds": floor[0], "floor_4m_seconds": floor[1],
            "commands": time_commands(cap, commands, runs, load_peak, count, unit, floor)}


def command_lines(results: list[dict], unit: str, width: int) -> list[str]:
    """The rows of `time_commands`' RESULTS as a plain-text table (its heading first), commands WIDTH wide."""
    mib = 1 << 20
    lines = [f"{'command':{width}} {'wall s':>8} {'command s':>10} {'peak RSS MiB':>13} {f'MiB/M {unit}':>13} "
             f"{f'{unit}/s':>12} {'x floor':>8} {'x 4 MiB':>8}"]
    for r in results:
        rate = f"{r[f'{unit}_per_second']:,.0f}" if r[f"{unit}_per_second"] else "-"
        lines.append(f"{r['command']:{width}} {r['wall_seconds']:8.2f} {r['command_seconds']:10.2f} "
                     f"{r['peak_rss_bytes'] / mib:13,.0f} {r[f'rss_per_million_{unit}'] / mib:13.1f} {rate:>12} "
                     f"{r['times_floor']:8.1f} {r['times_floor_4m']:8.1f}")
    return lines


def load_line(result: dict, floor: str) -> str:
    """What gdb alone costs (start and core load) and the FLOOR (what it reads) took, for the table."""
    return (f"gdb start and core load alone: {result['gdb_load_seconds']:.2f} s, "
            f"{result['gdb_load_peak_rss_bytes'] / (1 << 20):,.0f} MiB (the peaks below: above it); "
            f"floor ({floor}): {result['floor_seconds']:.3f} s, in reads of 4 MiB {result['floor_4m_seconds']:.3f} s")
