"""`heapwalk capture` in the benchmark (tests/tools/bench.py): on the live bench process at its snapshot, the pause
and the core's size on disk of heapwalk's capture and of gdb's gcore, beside the floor: the time to
read the process's resident memory once through /proc/PID/mem (every resident or swapped-out page of its
private anonymous mappings, which hold the heaps, read 8 MiB at a time as the capture reads)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from heapwalk.inferior.pages import read_maps

ROOT = Path(__file__).resolve().parents[2]
_PAGE = 4096


def resident_anonymous(pid: int) -> list[tuple[int, int]]:
    """[start, end) runs of the resident or swapped-out pages of PID's private anonymous mappings."""
    runs: list[tuple[int, int]] = []
    with open(f"/proc/{pid}/pagemap", "rb", buffering=0) as pagemap:
        for m in read_maps(pid):
            if m.perms[0] != "r" or m.perms[3] != "p" or m.file_backed or m.name.startswith("[v"):
                continue
            entries = memoryview(os.pread(pagemap.fileno(), (m.end - m.start) // _PAGE * 8,
                                          m.start // _PAGE * 8)).cast("Q")
            for i, entry in enumerate(entries):
                if entry >> 62:
                    page = m.start + i * _PAGE
                    if runs and runs[-1][1] == page:
                        runs[-1] = (runs[-1][0], page + _PAGE)
                    else:
                        runs.append((page, page + _PAGE))
    return runs


def read_floor(pid: int, runs: list[tuple[int, int]]) -> float:
    """Seconds to read RUNS of PID's memory once, 8 MiB at a time."""
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        started = time.perf_counter()
        for lo, hi in runs:
            for at in range(lo, hi, 8 << 20):
                os.pread(fd, min(8 << 20, hi - at), at)
        return time.perf_counter() - started
    finally:
        os.close(fd)


def _capture(pid: int, out: Path, *extra: str) -> dict:
    result = subprocess.run([str(ROOT / ".venv" / "bin" / "heapwalk"), "capture", str(pid), "--out", str(out),
                             *extra], capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    record = json.loads((out / "capture.json").read_text())
    stat = (out / "core").stat()
    return {"pause_seconds": record["stopped_seconds"], "core_disk_bytes": stat.st_blocks * 512,
            "core_size_bytes": stat.st_size}


def _gcore(pid: int, out: Path) -> dict:
    """gdb's gcore of PID into OUT: the process is stopped for the whole of it."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result = subprocess.run(["gcore", "-o", str(out / "core"), str(pid)], capture_output=True, text=True,
                            timeout=3600)
    pause = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    stat = (out / f"core.{pid}").stat()
    return {"pause_seconds": pause, "core_disk_bytes": stat.st_blocks * 512, "core_size_bytes": stat.st_size}


def measure_capture(pid: int, workdir: Path) -> dict:
    """heapwalk's capture and gcore's of the live process PID, and the floor (see the module)."""
    runs = resident_anonymous(pid)
    resident = sum(hi - lo for lo, hi in runs)
    floor = min(read_floor(pid, runs) for _ in range(3))
    out = workdir / "capture-bench"
    try:
        shutil.rmtree(out, ignore_errors=True)
        ours = _capture(pid, out / "heapwalk")
        shutil.rmtree(out / "heapwalk", ignore_errors=True)
        gcore = _gcore(pid, out / "gcore")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {"resident_bytes": resident, "read_floor_seconds": floor, "heapwalk": ours, "gcore": gcore,
            "pause_times_floor": ours["pause_seconds"] / floor if floor else None,
            "disk_times_resident": ours["core_disk_bytes"] / resident if resident else None}


def measure_service(bindir: Path, workdir: Path, workers: int = 16) -> dict:
    """`measure_capture` on cores/glibc/service.c with WORKERS threads, each in an arena of its own (16 arenas on 2
    CPUs: glibc's limit), idle once it has filled its arena with free memory."""
    exe, source = bindir / "service", ROOT / "cores" / "glibc" / "service.c"
    if not exe.exists() or exe.stat().st_mtime < source.stat().st_mtime:
        subprocess.run(["gcc", "-O1", "-g", "-pthread", str(source), "-o", str(exe)], check=True)
    state = workdir / "service"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    proc = subprocess.Popen([str(exe), str(state), str(workers)])
    try:
        deadline = time.monotonic() + 60
        while not (state / "state").exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the service did not start")
            time.sleep(0.05)
        return {"workers": workers, **measure_capture(proc.pid, workdir)}
    finally:
        proc.kill()
        proc.wait()


def capture_line(c: dict) -> str:
    """The capture's numbers as one line of the bench's table."""
    mib = 1 << 20
    ours, gcore = c["heapwalk"], c["gcore"]
    return (f"capture (live, {c['resident_bytes'] / mib:,.0f} MiB of anonymous memory resident, read once in "
            f"{c['read_floor_seconds']:.3f} s): heapwalk paused it {ours['pause_seconds']:.2f} s "
            f"({c['pause_times_floor']:.1f} x that), core {ours['core_disk_bytes'] / mib:,.0f} MiB on disk "
            f"({c['disk_times_resident']:.2f} x resident); gcore paused it {gcore['pause_seconds']:.2f} s, "
            f"core {gcore['core_disk_bytes'] / mib:,.0f} MiB on disk, {gcore['core_size_bytes'] / mib:,.0f} MiB "
            "in size")
