"""Reproducers that keep running (cores/glibc/grow.c, cores/glibc/service.c) for the tests that capture a live process:
built when their source is newer, started, and waited for through the state file each writes."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BINDIR = (ROOT / "build").resolve() / "bin"     # as tests/conftest.py has it: run by make bench, which has no conftest

__all__ = ["running", "wait_for_step", "process_state", "gcore_report", "build_service"]


def build_service(name: str) -> Path:
    """cores/NAME.c built into build/bin when its source is newer: the path of the program."""
    exe = BINDIR / name
    source = ROOT / "cores" / "glibc" / f"{name}.c"
    if not exe.exists() or exe.stat().st_mtime < source.stat().st_mtime:
        BINDIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O1", "-g", "-pthread", str(source), "-o", str(exe)], check=True)
    return exe


@contextlib.contextmanager
def running(tmp_path: Path, name: str, *args: str, env: dict[str, str] | None = None):
    """cores/NAME.c, a service that writes its state into a folder, running with ARGS (and ENV, the whole
    environment, when given) once it has written its first state: (process, its state folder); killed at
    the end."""
    exe = build_service(name)
    state_dir = tmp_path / name
    state_dir.mkdir()
    proc = subprocess.Popen([str(exe), str(state_dir), *args], env=env)
    try:
        wait_for_step(state_dir, 0)
        yield proc, state_dir
    finally:
        proc.kill()
        proc.wait()


def wait_for_step(state_dir: Path, step: int) -> list[int]:
    """The numbers of STATE_DIR/state once its first is STEP."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            values = [int(x) for x in (state_dir / "state").read_text().split()]
            if values[0] == step:
                return values
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"{state_dir.name} did not reach step {step}")


def process_state(pid: int) -> str:
    """PID's state letter (/proc/PID/stat): R, S, T..."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def gcore_report(pid: int, folder: Path, resident_from: Path | None = None) -> dict:
    """gdb's gcore core of the running process PID in FOLDER, and heapwalk's report of it (its JSON document):
    the oracle a capture's core is held equal to.  gcore faults in every page it reads, so take it after
    whatever measures the process.  RESIDENT_FROM, a capture.json, tells the report which pages were in RAM
    (a gcore core cannot)."""
    folder.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["gcore", "-o", str(folder / "core"), str(pid)], capture_output=True, text=True,
                            timeout=600)
    core = folder / f"core.{pid}"
    assert result.returncode == 0 and core.exists(), result.stderr
    extra = ["--resident-from", str(resident_from)] if resident_from is not None else []
    report = subprocess.run([str(ROOT / ".venv" / "bin" / "heapwalk"), "report", str(core), "--json",
                             str(folder / "report.json"), *extra], capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr
    return json.loads((folder / "report.json").read_text())
