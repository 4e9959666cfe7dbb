"""A real redis-server, 7.0 and 8.0, built as Redis builds it (make MALLOC=jemalloc: its vendored jemalloc,
5.2.1 in 7.0 and 5.3.0 in 7.2 and later, linked in under the je_ prefix, an 8-byte quantum, background
threads turned on at run time), loaded on loopback with
keys of mixed sizes most of which are then deleted, captured live as it runs, then stopped and decoded
without symbols: every figure of every arena equals what its own malloc_stats_print printed at the instant
of the core (cores/jemalloc/redis_snapshot.c, a module, prints the statistics and stops the process from Redis's main
thread, background threads turned off first so that no thread of jemalloc's runs in between)."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import NO_SYMBOLS, SYSROOTS, run_gdb
from oracle import jemalloc_arena_view, jemalloc_printed_view
import harness
import jebuilds
from verdicts import contradictions

pytestmark = pytest.mark.cores

KEYS = 120_000
SIZES = (20, 60, 100, 200, 500, 1500, 5000)


class Resp:
    """The few Redis commands the test sends, pipelined over one connection."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.reader = self.sock.makefile("rb")

    def batch(self, commands: list[tuple]) -> list[bytes | None]:
        self.sock.sendall(b"".join(self._encode(c) for c in commands))
        return [self._reply() for _ in commands]

    @staticmethod
    def _encode(args: tuple) -> bytes:
        parts = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(parts)

    def _reply(self) -> bytes | None:
        line = self.reader.readline()
        if line[:1] == b"$":
            size = int(line[1:])
            return None if size < 0 else self.reader.read(size + 2)[:-2]
        if line[:1] == b"-":
            raise AssertionError(line.decode())
        return line.rstrip(b"\r\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")


def _stats_buffer(version: str) -> dict | None:
    """What the module did to jemalloc's printer buffer (cores/jemalloc/redis_snapshot.c), as the oracle's ledger says
    it: jemalloc 5.3 prints through a buffer of arena 0's, which the module takes back."""
    if tuple(int(p) for p in version.split("-")[0].split(".")) < (5, 3):
        return None
    return {"arena": 0, "size": 65536, "internal": True, "retaken": True}


@pytest.fixture(scope="module", params=list(jebuilds.REDIS_BUILDS))
def redis(request, tmp_path_factory):
    """(program, core, the statistics printed at the core's instant, the live capture's status and output, the
    live capture's report), for each Redis version."""
    program, module = jebuilds.prepare_redis(SYSROOTS, request.param)
    tmp = tmp_path_factory.mktemp("redis")
    port = _free_port()
    # its timer (serverCron) once a second, not ten times: it allocates, and a tick between the two prints around
    # the core (the guard below) made the capture try again, three times in a row under load
    proc = subprocess.Popen([str(program), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--jemalloc-bg-thread", "yes", "--hz", "1", "--dynamic-hz", "no",
                             "--dir", str(tmp), "--loadmodule", str(module)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = _connect(port)
        _load(client)
        status, output = _live_capture(proc.pid, tmp / "capture")
        assert client.batch([("PING",)]) == [b"+PONG"]   # it serves on after the capture
        client.batch([("CONFIG", "SET", "jemalloc-bg-thread", "no")])
        core = tmp / "core"
        for _ in range(6):
            _stop_at_snapshot(client, proc.pid, tmp / "stats.json")
            harness.take_core(proc.pid, core)
            os.kill(proc.pid, signal.SIGCONT)
            assert client._reply() == b"+OK"
            _stop_at_snapshot(client, proc.pid, tmp / "after.json")
            os.kill(proc.pid, signal.SIGCONT)
            assert client._reply() == b"+OK"
            if _small_counters(tmp / "stats.json") == _small_counters(tmp / "after.json"):
                break
        else:
            pytest.fail("Redis's small-object counters kept moving around the core in 6 tries")
    finally:
        proc.kill()
        proc.wait()
    printed = json.loads((tmp / "stats.json").read_text())["jemalloc"]
    report = json.loads((tmp / "capture" / "report.json").read_text()) if status == 0 else None
    return program, core, printed, (status, output), report


def _stop_at_snapshot(client: Resp, pid: int, path: Path) -> None:
    """Has the module print jemalloc's statistics into PATH and stop the process (no reply read yet)."""
    client.sock.sendall(client._encode(("HEAPWALK.SNAPSHOT", str(path))))
    deadline = time.monotonic() + 20
    while not _stopped(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _stopped(pid)


def _small_counters(path: Path) -> list:
    """Every arena's bin counters as printed in PATH. They only grow, so two prints that agree around a core
    say no thread allocated or freed a small region in between (a thread of Redis's own did, once, under load)."""
    arenas = json.loads(path.read_text())["jemalloc"]["stats.arenas"]
    return [(i, [(b["nmalloc"], b["ndalloc"], b["curregs"]) for b in arenas[i]["bins"]])
            for i in sorted(arenas) if i.isdigit()]


def _version(program: Path) -> str:
    """The version string of the jemalloc Redis vendors in PROGRAM's build, as its Makefile configures it."""
    return next(b.version for b in jebuilds.REDIS_BUILDS.values() if b.folder == program.parent.name) + "-0-g0"


def _connect(port: int) -> Resp:
    deadline = time.monotonic() + 20
    while True:
        try:
            client = Resp(port)
            if client.batch([("PING",)]) == [b"+PONG"]:
                return client
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def _load(client: Resp) -> None:
    """KEYS values of mixed sizes, then 70% of them deleted at random: slabs left partly used, dirty pages."""
    rng = random.Random(7)
    for start in range(0, KEYS, 5000):
        client.batch([("SET", f"key:{i}", b"x" * rng.choice(SIZES)) for i in range(start, start + 5000)])
    for start in range(0, KEYS, 5000):
        doomed = [("DEL", f"key:{i}") for i in range(start, start + 5000) if rng.random() < 0.7]
        client.batch(doomed)


def _live_capture(pid: int, out: Path) -> tuple[int, str]:
    cli = Path(sys.executable).with_name("heapwalk")
    result = subprocess.run([str(cli), "capture", str(pid), "--out", str(out), "--no-symbols"], capture_output=True,
                            text=True, timeout=600)
    return result.returncode, result.stdout + result.stderr


def test_every_arena_of_redis_is_what_its_malloc_stats_print_printed(redis, tmp_path):
    program, core, printed, _, _ = redis
    out = tmp_path / "arenas.json"
    result = run_gdb([str(program), str(core)], [f"heapwalk arenas --json {out}"], iex=[NO_SYMBOLS])
    assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr, result.stderr
    doc = json.loads(out.read_text())
    je = doc["jemalloc"]
    assert je["version"] == printed["version"] == _version(program)
    assert doc["discovery"]["jemalloc"]["value"]["prefix"] == "je_"
    assert [a["index"] for a in je["arenas"]] == sorted(int(i) for i in printed["stats.arenas"] if i.isdigit())
    for arena in je["arenas"]:
        shown = printed["stats.arenas"][str(arena["index"])]
        ledger = {"stats_buffer": _stats_buffer(printed["version"])}
        assert jemalloc_arena_view(arena) == jemalloc_printed_view(shown, arena["index"], ledger)
        assert arena["tcache_bytes"] == shown["tcache_bytes"]
    assert [b["size"] for b in je["arenas"][0]["bins"]] == [b["size"] for b in printed["arenas"]["bin"]]
    assert {k: je["opt"].get(k, "missing") for k in printed["opt"]} == printed["opt"]
    assert sum(a["small"]["allocated"] for a in je["arenas"]) > 20 << 20


def test_redis_runs_jemallocs_background_threads_and_the_verdict_says_so(redis):
    """Redis turns background threads on at run time (opt.background_thread stays false): the live capture's
    report says they purge the dirty pages on time, and shows the thread that does (named by the capture,
    bound to no arena), and no sentence of it that the pages wait for a thread's call; after CONFIG SET
    jemalloc-bg-thread no, the core's report says they are off."""
    program, core, printed, (status, output), report = redis
    assert status == 0, output
    assert report["jemalloc"]["opt"]["background_thread"] is False and report["jemalloc"]["background_thread"]
    verdict = " ".join(report["report"]["verdict"])
    assert "background threads purge them on time" in verdict and "background_thread is off" not in verdict
    assert "the pages stay until one does" not in verdict          # no sentence says the pages wait for a call
    assert [t for t in report["jemalloc"]["threads"] if t["name"] == "jemalloc_bg_thd" and t["arena"] is None]
    assert contradictions(report) == []
    cli = Path(sys.executable).with_name("heapwalk")
    result = subprocess.run([str(cli), "report", str(core), str(program), "--no-symbols"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "(background_thread is off;" in " ".join(result.stdout.split())


def test_a_live_capture_of_redis_reports_its_jemalloc(redis):
    """'heapwalk capture PID' on the loaded, running Redis: jemalloc decoded (never a glibc-only all-clear),
    and Redis serves on after it (the fixture checks)."""
    program, _, _, (status, output), report = redis
    said = " ".join(output.split())
    assert status == 0, output
    assert f"jemalloc {_version(program)}" in said and "Traceback" not in said and "could not decode" not in said
    assert report["allocator"] == "jemalloc"
    assert sum(a["in_use"] for a in report["report"]["arenas"]) > 10 << 20
    clock = report["jemalloc"]["clock_ns"]          # the capture's core records the process's clock
    assert clock and all(a["decay_clock"]["dirty_epoch_ns"] < clock for a in report["jemalloc"]["arenas"])


def test_check_finds_redis_jemalloc_sound(redis):
    """'heapwalk check' on the core: every extent, bin, cached region and free-extent list of Redis's
    jemalloc agrees, with no violation (and no refusal: 7.2 and later configure --disable-cache-oblivious)."""
    program, core, _, _, _ = redis
    result = run_gdb([str(program), str(core)], ["heapwalk check"], iex=[NO_SYMBOLS])
    said = " ".join(result.stdout.split())
    assert result.returncode == 0 and "Traceback" not in said + result.stderr, result.stderr
    assert f"jemalloc {_version(program)}" in said and "jemalloc consistent: no violations in" in said, said
