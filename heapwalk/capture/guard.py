"""A watcher that outlives `heapwalk capture --live`, so that a capture killed at any moment leaves the process
running.

`--live` lets gdb attach, and gdb's attach (PTRACE_ATTACH) queues a SIGSTOP on each thread, which gdb takes
back as it sees each one stop.  Killed in that moment (with its gdb, as a kill of its process group does), the
capture leaves a SIGSTOP queued, and the process stops for good once the kernel lets it go: measured, 7 kills
in 10 at the moment the process got its tracer.  The watcher runs in a session of its own, which such a kill
does not reach, and waits for the capture to say it let the process go.  When the capture ends without saying
so, the watcher waits until no thread has a tracer; then, if the process is stopped or has a SIGSTOP queued
(it was not when the capture began, or no watcher would have been started), it sends SIGCONT, which takes a
queued stop back and lets a stopped process go on.

    python -m heapwalk.capture.guard PID       (its standard input: the capture's word, "released")
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["Guard", "stop_held", "traced", "watch"]

#: the word the capture writes when it has let the process go
RELEASED = b"released\n"
#: how long the watcher waits for the process's tracer (the capture's gdb) to be gone
TRACER_GONE_WITHIN = 30.0
#: how long after the tracer is gone the watcher looks for a stop held
SETTLE = 0.5
_STOP_BIT = 1 << (signal.SIGSTOP - 1)


def _tasks(pid: int) -> list[dict[str, str]]:
    """Each thread's /proc status as a dict (none when the process is gone)."""
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        out.append(dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line))
    return out


def stop_held(pid: int) -> bool:
    """Whether process PID is stopped (a group stop, "T") or has a SIGSTOP queued on a thread or on itself."""
    for status in _tasks(pid):
        if status.get("State", "").startswith("T"):
            return True
        for queue in ("SigPnd", "ShdPnd"):
            if int(status.get(queue, "0"), 16) & _STOP_BIT:
                return True
    return False


def traced(pid: int) -> bool:
    """Whether a thread of process PID has a tracer (a debugger attached, or attaching)."""
    return any(status.get("TracerPid", "0").strip() != "0" for status in _tasks(pid))


def watch(pid: int, word: bytes) -> bool:
    """What the watcher does once the capture's standard input closed with WORD: nothing when the capture said
    it let PID go; else, once PID has no tracer, SIGCONT when a stop is held then or within SETTLE seconds.
    Whether it sent SIGCONT."""
    if word.endswith(RELEASED):
        return False
    deadline = time.monotonic() + TRACER_GONE_WITHIN
    while traced(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if traced(pid):
        return False
    settled = time.monotonic() + SETTLE         # a SIGSTOP being taken is neither queued nor a stop for a moment
    while not stop_held(pid):
        if time.monotonic() > settled:
            return False
        time.sleep(0.01)
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        return False
    return True


class Guard:
    """The watcher for PID while the capture's gdb holds it, as a context manager: `released()` once gdb let
    the process go; leaving the context without that leaves the watcher to act (see the module)."""

    def __init__(self, pid: int):
        self.pid = pid
        self._watcher: subprocess.Popen | None = None

    def __enter__(self) -> "Guard":
        if not stop_held(self.pid):          # a process stopped before the capture is left as it was found
            self._watcher = subprocess.Popen([sys.executable, "-m", "heapwalk.capture.guard", str(self.pid)],
                                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL, start_new_session=True, env=_importing())
        return self

    def released(self) -> None:
        """Says that gdb let the process go: the watcher ends without acting."""
        if self._watcher is not None and self._watcher.stdin is not None:
            try:
                self._watcher.stdin.write(RELEASED)
                self._watcher.stdin.flush()
            except OSError:
                pass

    def __exit__(self, *exc) -> None:
        if self._watcher is None:
            return
        try:
            self._watcher.stdin.close()
        except OSError:
            pass
        try:
            self._watcher.wait(TRACER_GONE_WITHIN + 5)
        except subprocess.TimeoutExpired:
            pass


def _importing() -> dict[str, str]:
    """This environment, with the folder this heapwalk is imported from first on the watcher's Python path
    (a clone run without installing it is found too)."""
    here = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": here + (os.pathsep + path if path else "")}


def _main(argv: list[str]) -> int:
    pid = int(argv[0])
    word = sys.stdin.buffer.read()           # until the capture closes it, or dies
    watch(pid, word)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
