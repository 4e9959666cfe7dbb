"""Run in the qemu machine by tests/test_precopy.py, whose kernel tracks soft-dirty pages, so that `heapwalk
capture` pre-copies: starts cores/untouched.c (its program EXE, its folder STATE, a data file DATA mapped),
measures what a read that faults pages in would change (`untouched_figures.measure`), captures the process
with HEAPWALK, measures again, and writes both, the capture's status and output, and its pre-copy record to
OUT (JSON).

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
from untouched_figures import measure  # noqa: E402


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
    proc = _started(exe, Path(state), Path(data))
    try:
        ledger = json.loads((Path(state) / "ledger.json").read_text())
        before = measure(proc.pid, ledger)
        result = subprocess.run([heapwalk, "capture", str(proc.pid), "--out", capture_dir, "--no-leaks"],
                                capture_output=True, text=True, timeout=1200)
        after = measure(proc.pid, ledger)
        record_path = Path(capture_dir) / "capture.json"
        record = json.loads(record_path.read_text()) if record_path.exists() else {}
        running = proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    Path(out).write_text(json.dumps({"before": before, "after": after, "status": result.returncode,
                                     "output": result.stdout[-4000:] + result.stderr[-4000:],
                                     "precopy": record.get("precopy"), "running": running}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
