"""Reproducers that keep running (cores/grow.c, cores/service.c) for the tests that capture a live process:
built when their source is newer, started, and waited for through the state file each writes."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

from conftest import BINDIR, ROOT

__all__ = ["running", "wait_for_step", "process_state"]


@contextlib.contextmanager
def running(tmp_path: Path, name: str, *args: str):
    """cores/NAME.c, a service that writes its state into a folder, running with ARGS once it has written its
    first state: (process, its state folder); killed at the end."""
    exe = BINDIR / name
    source = ROOT / "cores" / f"{name}.c"
    if not exe.exists() or exe.stat().st_mtime < source.stat().st_mtime:
        BINDIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O1", "-g", "-pthread", str(source), "-o", str(exe)], check=True)
    state_dir = tmp_path / name
    state_dir.mkdir()
    proc = subprocess.Popen([str(exe), str(state_dir), *args])
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
