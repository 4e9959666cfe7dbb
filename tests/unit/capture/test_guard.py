"""The watcher beside `heapwalk capture --live` (heapwalk.capture.guard): a capture killed while its gdb's
attach holds a stop leaves the process running; one that let the process go, or found it stopped, leaves it as
it is.  The capture is a Python process holding a `Guard` on a sleeping program, the stop gdb's attach queues
is a SIGSTOP it sends, and the kill is SIGKILL to its process group (as a user's kill of the command line)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from heapwalk.capture import guard

ROOT = Path(__file__).resolve().parents[3]
#: the capture: a Guard on the pid given, the stop gdb's attach would queue, then (with "release") gdb's detach
OWNER = """
import os, signal, sys, time
from heapwalk.capture.guard import Guard
pid, release = int(sys.argv[1]), sys.argv[2] == "release"
with Guard(pid) as g:
    os.kill(pid, signal.SIGSTOP)
    if release:
        g.released()
    print("held", flush=True)
    if not release:
        time.sleep(60)
"""


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _settles(pid: int, states: str, seconds: float = 5.0) -> str:
    """PID's state once it is one of STATES, or the one it is in after SECONDS."""
    deadline = time.monotonic() + seconds
    while _state(pid) not in states and time.monotonic() < deadline:
        time.sleep(0.02)
    return _state(pid)


def _owner(pid: int, mode: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(pid), mode], stdout=subprocess.PIPE, env=env,
                             start_new_session=True, text=True)
    assert owner.stdout.readline() == "held\n"
    return owner


@pytest.fixture
def target():
    """A sleeping program, the process the captures hold; killed at the end."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_capture_killed_while_a_stop_is_held_leaves_the_process_running(target):
    owner = _owner(target.pid, "hold")
    assert guard.stop_held(target.pid) and not guard.traced(target.pid)
    os.killpg(owner.pid, signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 5            # the SIGSTOP may still be queued, or just taking effect
    while (guard.stop_held(target.pid) or _state(target.pid) not in "SR") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _state(target.pid) in "SR" and not guard.stop_held(target.pid)


def test_a_capture_that_let_the_process_go_leaves_it_as_it_is(target):
    owner = _owner(target.pid, "release")
    assert owner.wait(10) == 0
    time.sleep(0.3)
    assert _settles(target.pid, "T") == "T"         # stopped by someone else meanwhile: not the watcher's to undo


def test_a_process_found_stopped_is_left_stopped(target):
    os.kill(target.pid, signal.SIGSTOP)
    assert _settles(target.pid, "T") == "T"
    owner = _owner(target.pid, "hold")
    os.killpg(owner.pid, signal.SIGKILL)
    owner.wait()
    time.sleep(0.5)
    assert _state(target.pid) == "T"


def test_the_watcher_acts_only_once_no_tracer_holds_the_process_and_a_stop_is_held(target):
    assert not guard.watch(target.pid, b"")                  # running, nothing held: nothing sent
    os.kill(target.pid, signal.SIGSTOP)
    assert _settles(target.pid, "T") == "T"
    assert not guard.watch(target.pid, guard.RELEASED)       # the capture let it go: its word is kept
    assert guard.watch(target.pid, b"") and _settles(target.pid, "SR") in "SR"
