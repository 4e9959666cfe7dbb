"""Builds reproducers, runs them to their snapshot point and takes their cores.

A reproducer writes malloc_info.xml and ledger.json into the directory given
as its first argument, then stops itself with SIGSTOP.  The harness waits for
that stop, takes a core with gdb's ``gcore`` (no core_pattern or ulimit
needed), punches holes in the core where gcore wrote zeros (thread-arena
reservations, untouched pages), and kills the process, or keeps it stopped for
live-attach tests.

Command line: ``python3 cores/harness.py OUTDIR [NAME ...]`` captures the named
reproducers (all by default) into OUTDIR/NAME/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CORES_DIR = Path(__file__).resolve().parent
REPRODUCERS = ("bins", "thread_arenas", "small_vectors", "mmapped", "second_heap", "many_arenas")
CFLAGS = ("-O1", "-g", "-pthread", "-Wall", "-Wextra", "-Wno-unused-but-set-variable")


class HarnessError(RuntimeError):
    """A reproducer could not be built, did not reach its snapshot, or gcore failed."""


@dataclass
class Capture:
    """One reproducer at its snapshot point: the directory holding its outputs."""

    name: str
    directory: Path
    exe: Path
    pid: int
    process: subprocess.Popen | None = None

    @property
    def core(self) -> Path:
        return self.directory / "core"

    @property
    def malloc_info(self) -> Path:
        return self.directory / "malloc_info.xml"

    @property
    def ledger(self) -> Path:
        return self.directory / "ledger.json"

    def kill(self) -> None:
        """Ends a kept process (SIGKILL works on a stopped process)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def build(name: str, bindir: Path) -> Path:
    """Compiles cores/NAME.c with the support library into BINDIR/NAME."""
    bindir.mkdir(parents=True, exist_ok=True)
    exe = bindir / name
    sources = [CORES_DIR / f"{name}.c", CORES_DIR / "hw.c"]
    if exe.exists() and all(exe.stat().st_mtime >= s.stat().st_mtime for s in sources + [CORES_DIR / "hw.h"]):
        return exe
    cmd = ["gcc", *CFLAGS, f"-I{CORES_DIR}", *map(str, sources), "-o", str(exe)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise HarnessError(f"building {name} failed:\n{result.stderr}")
    return exe


def _wait_for_stop(proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        pid, status = os.waitpid(proc.pid, os.WUNTRACED | os.WNOHANG)
        if pid == proc.pid:
            if os.WIFSTOPPED(status):
                return
            proc.returncode = os.waitstatus_to_exitcode(status)
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise HarnessError(f"reproducer exited before its snapshot (status {proc.returncode}): {err.strip()}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise HarnessError(f"reproducer did not reach its snapshot within {timeout:.0f} s")
        time.sleep(0.02)


def run_to_snapshot(exe: Path, directory: Path, env: dict[str, str] | None = None,
                    timeout: float = 120.0, launcher: list[str] | None = None) -> subprocess.Popen:
    """Starts EXE with DIRECTORY as its output folder and waits until it has stopped itself."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in ("malloc_info.xml", "ledger.json", "core"):
        (directory / stale).unlink(missing_ok=True)
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.Popen([*(launcher or []), str(exe), str(directory)], env=full_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_for_stop(proc, timeout)
    return proc


def take_core(pid: int, core: Path) -> None:
    """Writes a core of the stopped process PID to CORE with gcore, then makes it sparse."""
    prefix = core.with_name(core.name + ".gcore")
    result = subprocess.run(["gcore", "-o", str(prefix), str(pid)], capture_output=True, text=True, timeout=600)
    written = Path(f"{prefix}.{pid}")
    if result.returncode != 0 or not written.exists():
        raise HarnessError(f"gcore failed for pid {pid}: {result.stderr.strip() or result.stdout.strip()}")
    written.rename(core)
    if shutil.which("fallocate"):
        subprocess.run(["fallocate", "--dig-holes", str(core)], capture_output=True)


def arena_env() -> dict[str, str]:
    """Bounds the arena count on machines with many cores, so cores stay small.

    The arena limit is 8 x cores; gcore writes each thread arena's 64 MiB
    reservation, so above two cores the harness sets MALLOC_ARENA_MAX=16, the
    default of a two-core machine.
    """
    return {"MALLOC_ARENA_MAX": "16"} if (os.cpu_count() or 1) > 2 else {}


def capture(name: str, outdir: Path, bindir: Path, keep: bool = False) -> Capture:
    """Builds and runs reproducer NAME, takes its core into OUTDIR/NAME/core.

    With KEEP the process stays stopped (for live-attach tests); call kill().
    """
    exe = build(name, bindir)
    directory = outdir / name
    proc = run_to_snapshot(exe, directory, env=arena_env())
    cap = Capture(name=name, directory=directory, exe=exe, pid=proc.pid, process=proc)
    try:
        take_core(proc.pid, cap.core)
        meta = {"name": name, "exe": str(exe), "pid": proc.pid}
        (directory / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    except BaseException:
        cap.kill()
        raise
    if not keep:
        cap.kill()
        cap.process = None
    return cap


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("names", nargs="*", default=list(REPRODUCERS))
    parser.add_argument("--bindir", type=Path, help="where to build (default OUTDIR/bin)")
    args = parser.parse_intermixed_args(argv)
    bindir = args.bindir or args.outdir / "bin"
    for name in args.names:
        start = time.monotonic()
        try:
            cap = capture(name, args.outdir, bindir)
        except HarnessError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
        size = cap.core.stat().st_blocks * 512
        print(f"{name}: core {cap.core} ({size / 2**20:.1f} MiB on disk) in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(main())
