"""Run in the qemu machine by tests/vm/test_precopy.py, whose kernel tracks soft-dirty pages, so that `heapwalk
capture` pre-copies: starts cores/glibc/untouched.c (its program EXE, its folder STATE, a data file DATA mapped),
measures what a read that faults pages in would change (`untouched_figures.measure`), captures the process
with HEAPWALK (up to its record: `_captured`), measures again, and writes both, whether the capture wrote its
record, what it printed, its pre-copy record and whether the process runs on, to OUT (JSON).

Usage: untouched_driver.py EXE STATE DATA HEAPWALK CAPTURE_DIR OUT
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from untouched_figures import LIVE_COMMANDS, measure  # noqa: E402


def _started(exe: str, state: Path, data: Path) -> subprocess.Popen:
    """EXE running once it has written its ledger and first state."""
    state.mkdir(parents=True, exist_ok=True)
    data.write_bytes(bytes(range(251)) * 800 + b"end")
    proc = subprocess.Popen([exe, str(state), str(data)], env={**os.environ, "MALLOC_ARENA_MAX": "2"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if (state / "state").read_text().split()[0] == "0":
                return proc
        except (OSError, IndexError):
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("untouched did not reach its first state")


def main(argv: list[str]) -> int:
    exe, state, data, heapwalk, capture_dir, out = argv[1:7]
    gdbinit = argv[7] if len(argv) > 7 else None
    proc = _started(exe, Path(state), Path(data))
    live = {}
    try:
        ledger = json.loads((Path(state) / "ledger.json").read_text())
        before = measure(proc.pid, ledger)
        record, output = _captured(heapwalk, proc.pid, Path(capture_dir))
        after = measure(proc.pid, ledger)
        running = proc.poll() is None and _state(proc.pid) in "SR"
        if gdbinit:
            live["live_output"] = _attached(gdbinit, proc.pid)
            live["live"] = measure(proc.pid, ledger)
    finally:
        proc.kill()
        proc.wait()
    Path(out).write_text(json.dumps({"before": before, "after": after, "record": record is not None,
                                     "output": output, "precopy": (record or {}).get("precopy"),
                                     "running": running, **live}, indent=1))
    return 0


def _attached(gdbinit: str, pid: int) -> str:
    """What heapwalk's commands printed, run in gdb attached to PID."""
    args = ["gdb", "-nx", "-batch", "-q", "-x", gdbinit]
    for command in LIVE_COMMANDS:
        args += ["-ex", f"heapwalk {command}"]
    done = subprocess.run(args + ["-p", str(pid)], capture_output=True, text=True, timeout=1200)
    return done.stdout + done.stderr


def _captured(heapwalk: str, pid: int, folder: Path) -> tuple[dict | None, str]:
    """`heapwalk capture PID` until it has written capture.json (the process read, its core written, the process
    running again), then stopped: the report it would print next reads the core, not the process, and takes
    minutes in an emulated machine.  The record (None if it never came) and what the capture printed."""
    record_path = folder / "capture.json"
    with open(folder.parent / (folder.name + ".out"), "w+") as log:
        capture = subprocess.Popen([heapwalk, "capture", str(pid), "--out", str(folder), "--no-leaks"], stdout=log,
                                   stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 900
        record = None
        while record is None and capture.poll() is None and time.monotonic() < deadline:
            try:
                record = json.loads(record_path.read_text())
            except (OSError, ValueError):
                time.sleep(0.2)
        if record is None and record_path.exists():
            record = json.loads(record_path.read_text())
        capture.kill()
        capture.wait()
        log.seek(0)
        return record, log.read()[-4000:]


def _state(pid: int) -> str:
    """PID's state letter in /proc (R, S, T...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


if __name__ == "__main__":
    sys.exit(main(sys.argv))
