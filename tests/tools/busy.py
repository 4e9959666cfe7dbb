"""Capturing a busy service again and again while it serves (cores/glibc/busy.c): the stress that proves a capture
harmless (tests/live/test_busy.py runs a short one in `make test`, tests/tools/bench.py a long one in `make bench`).

While clients on loopback keep sending requests and a sender keeps queueing real-time signals, each round
takes a capture (`heapwalk capture`, or `--live`, or heapwalk's commands in `gdb -p`) and checks that the
service's shared memory (RssShmem), the machine's Shmem and its file pages are as before; at the end, that no
request failed or waited longer than the longest pause printed plus a bound, that every signal sent was
received, that no timed wait ended before its time or overslept by more than a pause; and that a capture
killed at any moment leaves the service running."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from heapwalk.capture import guard

ROOT = Path(__file__).resolve().parents[2]
HEAPWALK = Path(sys.executable).parent / "heapwalk"
GDBINIT = ROOT / "gdbinit"
SIGNAL = signal.SIGRTMIN + 1
#: how much longer than the longest pause a request or a timed wait may take (scheduling on a busy machine)
SLACK = 0.5


def _status(pid: int) -> dict[str, int]:
    """PID's RssAnon, RssFile, RssShmem (KiB) and the machine's Shmem (KiB)."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    out = {k: int(status[k].split()[0]) for k in ("RssAnon", "RssFile", "RssShmem")}
    out["Shmem"] = int(meminfo["Shmem"].split()[0])
    return out


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


@dataclass
class Load:
    """Clients that keep requesting, and a sender of queued signals, until stopped."""

    port: int
    pid: int
    clients: int = 3
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sent: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
                while not self._stop.is_set():
                    started = time.monotonic()
                    s.sendall(struct.pack("<Q", rng.randint(1, 200)))
                    answer = b""
                    while len(answer) < 8:
                        piece = s.recv(8 - len(answer))
                        if not piece:
                            raise ConnectionError("the service closed the connection")
                        answer += piece
                    self.latencies.append(time.monotonic() - started)
                    time.sleep(0.002)
        except OSError as exc:
            self.errors.append(f"client {seed}: {exc}")

    def _signals(self) -> None:
        while not self._stop.is_set():
            os.kill(self.pid, SIGNAL)
            self.sent += 1
            time.sleep(0.003)

    def __enter__(self) -> "Load":
        self._threads = [threading.Thread(target=self._client, args=(i,)) for i in range(self.clients)]
        self._threads.append(threading.Thread(target=self._signals))
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def account(state_dir: Path, pid: int, asked: int) -> dict:
    """The service's own account (signals received, each timed wait's record), asked with SIGUSR2."""
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + 90      # a loaded 2-core machine, with a backlog of queued signals before it
    while time.monotonic() < deadline:
        try:
            if int((state_dir / "state").read_text().split()[0]) >= asked and (state_dir / "account").exists():
                break
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.02)
    else:
        raise RuntimeError(f"the busy service (pid {pid}, in state {state(pid)}) answered no SIGUSR2 within 90 s: "
                           f"its state file says {_text(state_dir / 'state')!r}, {asked} wanted")
    text = (state_dir / "account").read_text()
    out: dict = {"signals": int(re.search(r"signals (\d+)", text).group(1)), "waits": {}}
    for kind, waits, short, late, eintr in re.findall(r"(\S+) waits (\d+) short (\d+) late_us (\d+) eintr (\d+)",
                                                      text):
        out["waits"][kind] = {"waits": int(waits), "short": int(short), "late": int(late) / 1e6,
                              "eintr": int(eintr)}
    return out


def _text(path: Path) -> str:
    """PATH's text, stripped, or what stands in its place."""
    try:
        return path.read_text().strip()
    except OSError as exc:
        return f"({exc.strerror})"


def _capture(pid: int, folder: Path, mode: str) -> float:
    """One capture of PID in MODE ("core", "live" or "gdb"); the seconds the process was stopped (printed by
    heapwalk; for gdb -p, the whole run)."""
    if mode == "gdb":
        started = time.monotonic()
        out = subprocess.run(["gdb", "-nx", "-batch", "-q", "-x", str(GDBINIT), "-ex", "heapwalk report --no-leaks",
                              "-p", str(pid)], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0 and "internal error" not in out.stdout + out.stderr, out.stderr[-2000:]
        return time.monotonic() - started
    args = [str(HEAPWALK), "capture", str(pid), "--out", str(folder), "--no-leaks"]
    out = subprocess.run(args + (["--live"] if mode == "live" else []), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(re.search(r"was stopped for ([\d.]+) s", out.stdout).group(1))


def _settled_state(pid: int, seconds: float = 3.0) -> str:
    """PID's state once it runs or sleeps again, or the one it is still in after SECONDS: a process the killed
    capture left stopped stays stopped ("t" or "T"), where one that was only busy a moment (in "D" writing, or
    still being let go under a loaded machine) is soon "S" or "R"."""
    deadline = time.monotonic() + seconds
    time.sleep(0.3)
    while state(pid) not in "SR" and time.monotonic() < deadline:
        time.sleep(0.05)
    return state(pid)


def _attached(pid: int) -> bool:
    """Whether gdb's attach to PID is over: every thread has a tracer, and none has the SIGSTOP the attach
    queued still pending."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        every = all("TracerPid:\t0\n" not in (t / "status").read_text() for t in tasks.iterdir())
    except OSError:
        return False
    return every and not guard.stop_held(pid)


def _killed_capture(pid: int, folder: Path, mode: str, after: float) -> None:
    """A capture of PID in MODE killed with SIGKILL AFTER seconds, with everything it started.  In gdb -p the
    seconds count from the end of gdb's attach: gdb killed while it attaches leaves the SIGSTOP its attach
    queued, and the process stopped (gdb's own, which `capture --live` undoes with heapwalk.capture.guard and
    tests/live/test_cli.py tests); what is held here is heapwalk's commands killed in gdb."""
    if mode == "gdb":
        args = ["gdb", "-nx", "-batch", "-q", "-x", str(GDBINIT), "-ex", "heapwalk report", "-p", str(pid)]
    else:
        args = [str(HEAPWALK), "capture", str(pid), "--out", str(folder)] + (["--live"] if mode == "live" else [])
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    if mode == "gdb":
        deadline = time.monotonic() + 60
        while not _attached(pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
    time.sleep(after)
    try:
        os.killpg(proc.pid, signal.SIGKILL)      # heapwalk and the gdb it runs, at once
    except ProcessLookupError:
        pass
    proc.wait()


def stress(exe: Path, workdir: Path, rounds: int, seconds: float, kills: int) -> dict:
    """Runs the stress (see the module) on a fresh service: up to ROUNDS captures within SECONDS, then KILLS
    captures killed at random moments.  What it measured, for the caller to assert on."""
    state_dir = workdir / "busy"
    state_dir.mkdir(parents=True, exist_ok=True)
    for name in ("state", "port", "account"):     # a port left by an earlier run would be read before this one's
        (state_dir / name).unlink(missing_ok=True)
    proc = subprocess.Popen([str(exe), str(state_dir)])
    result: dict = {"rounds": 0, "pauses": [], "changes": [], "modes": {}, "killed": [], "states": []}
    try:
        deadline = time.monotonic() + 30
        while not (state_dir / "port").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        port = int((state_dir / "port").read_text())
        with Load(port, proc.pid) as load:
            time.sleep(1.0)                                  # the heaps settle
            started = time.monotonic()
            modes = ("core",) * 6 + ("live", "gdb")
            while result["rounds"] < rounds and time.monotonic() - started < seconds:
                mode = modes[result["rounds"] % len(modes)]
                before = _status(proc.pid)
                pause = _capture(proc.pid, workdir / f"cap{result['rounds'] % 2}", mode)
                after = _status(proc.pid)
                result["pauses"].append(pause)
                result["modes"][mode] = result["modes"].get(mode, 0) + 1
                result["changes"].append({k: after[k] - before[k] for k in after})
                result["states"].append(state(proc.pid))
                result["rounds"] += 1
            rng = random.Random(7)
            for i in range(kills):
                mode = ("core", "live", "gdb")[i % 3]
                after = rng.uniform(0.0, 1.5)
                _killed_capture(proc.pid, workdir / "killed", mode, after)
                result["killed"].append({"mode": mode, "after": after, "state": _settled_state(proc.pid)})
            time.sleep(0.5)
        result["latencies"] = sorted(load.latencies)
        result["errors"] = load.errors
        result["sent"] = load.sent
        time.sleep(0.3)                                      # the last signals are handled
        try:
            result["account"] = account(state_dir, proc.pid, 1)
        except RuntimeError as exc:                          # what each killed capture left it in, to say why
            left = ", ".join(f"{k['mode']} at {k['after']:.2f} s: {k['state']}" for k in result["killed"])
            raise RuntimeError(f"{exc}; after {result['rounds']} captures, the killed ones left it {left}") from None
        result["alive"] = proc.poll() is None and state(proc.pid) in "SR"
    finally:
        proc.kill()
        proc.wait()
    return result


def stress_line(run: dict) -> str:
    """One line of what a `stress` run measured, for the bench's output."""
    changed = max((abs(c["RssShmem"]) + abs(c["Shmem"]) for c in run["changes"]), default=0)
    short = sum(w["short"] for w in run["account"]["waits"].values())
    late = max(w["late"] for w in run["account"]["waits"].values())
    lat = run["latencies"]
    modes = ", ".join(f"{count} {mode}" for mode, count in run["modes"].items())
    return (f"busy service (cores/glibc/busy.c) captured {run['rounds']} times under load ({modes}), "
            f"{len(run['killed'])} captures killed: RssShmem+Shmem moved at most {changed} KiB; "
            f"{len(lat):,} requests, {len(run['errors'])} failed, "
            + (f"slowest {lat[-1]:.3f} s" if lat else "none answered: the load did not reach the service")
            + f" (longest pause {max(run['pauses'], default=0):.3f} s); signals {run['account']['signals']:,} of "
            f"{run['sent']:,}; timed waits cut short {short}, latest {late:.3f} s; running after every kill: "
            f"{all(k['state'] in 'SR' for k in run['killed'])}")
