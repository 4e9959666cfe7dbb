"""The capture's pre-copy against a stop-the-world capture of the same instant, on a process that keeps writing
(cores/glibc/scribble.c); run as root under a kernel that tracks soft-dirty pages (tests/vm/test_precopy.py runs it in
Debian's kernel, cores/scripts/vm.py).

Usage: precopy_driver.py OUT SCRIBBLE MIB THREADS RATE [--alone] [--no-compare].  It starts SCRIBBLE, with
--alone times a stop-the-world capture first (the pause of a capture without pre-copy), then takes a
pre-copied one (`precopy.run`, then `write_core` at the final
stop) and, in the same stop, a stop-the-world core of that instant (not with --no-compare, for timing alone), and compares the two:
the same segments, the same bytes in each.  OUT/result.json gets the figures and every page that differs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from heapwalk.capture import precopy, ptrace  # noqa: E402
from heapwalk.capture.corewriter import hold_for, write_core  # noqa: E402
from heapwalk.inferior.corefile import CoreFile  # noqa: E402

def segments(core: Path) -> list[tuple[int, int, int, int]]:
    """(address, memsz, file offset, filesz) of each PT_LOAD of CORE."""
    f = CoreFile(core)
    try:
        return list(f.loads)
    finally:
        f.close()


def differences(a: Path, b: Path, most: int = 20) -> dict:
    """Where cores A and B differ: their segment lists, and the pages of memory both hold that differ."""
    sa, sb = segments(a), segments(b)
    shape = [(v, m, n) for v, m, _, n in sa], [(v, m, n) for v, m, _, n in sb]
    if shape[0] != shape[1]:
        only_a = sorted(set(shape[0]) - set(shape[1]))
        only_b = sorted(set(shape[1]) - set(shape[0]))
        return {"segments": {"only_precopy": [list(s) for s in only_a[:most]],
                             "only_stop_the_world": [list(s) for s in only_b[:most]]}, "pages": [], "compared": 0}
    pages, compared = [], 0
    with open(a, "rb") as fa, open(b, "rb") as fb:
        for (vaddr, _, oa, filesz), (_, _, ob, _) in zip(sa, sb):
            for at in range(0, filesz, 1 << 22):
                n = min(1 << 22, filesz - at)
                da, db = os.pread(fa.fileno(), n, oa + at), os.pread(fb.fileno(), n, ob + at)
                compared += n
                if da != db:
                    pages += [vaddr + at + p for p in range(0, n, 4096) if da[p:p + 4096] != db[p:p + 4096]]
    return {"segments": None, "pages": [hex(p) for p in pages[:most]], "different_pages": len(pages),
            "compared": compared}


def stop_the_world(pid: int, core: Path) -> tuple[float, int]:
    """The pause of a capture of PID with no pre-copy (into CORE): its seconds, and the bytes of its core that
    are not zeros."""
    hold = hold_for(pid)
    core.unlink(missing_ok=True)
    started = time.monotonic()
    with ptrace.stop(pid) as stopped:
        pending = write_core(stopped, core, {}, hold)
    pause = time.monotonic() - started
    return pause, pending.finish().written


def main(argv: list[str]) -> int:
    out, scribble, mib, threads, rate = Path(argv[0]), argv[1], argv[2], argv[3], argv[4]
    alone, compare = "--alone" in argv[5:], "--no-compare" not in argv[5:]
    out.mkdir(parents=True, exist_ok=True)
    (out / "ready").unlink(missing_ok=True)
    child = subprocess.Popen([scribble, str(out), mib, threads, rate])
    result: dict = {"kernel": os.uname().release, "mib": int(mib), "rate": int(rate),
                    "tracked": precopy.untracked_reason() is None}
    try:
        deadline = time.monotonic() + 600
        while not (out / "ready").exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.1)
        time.sleep(1)
        pid = child.pid
        if alone:
            result["stop_the_world_pause"], result["stop_the_world_written"] = \
                stop_the_world(pid, out / "core-alone")
            (out / "core-alone").unlink()
        started = time.monotonic()
        copies = precopy.run(pid, out / "core.precopy")
        hold = hold_for(pid, False, copies.expected_at_stop())
        (out / "core").unlink(missing_ok=True)
        stopped_at = time.monotonic()
        with ptrace.stop(pid) as stopped:
            pending = write_core(stopped, out / "core", {}, hold, False, copies)
            result["pause"] = time.monotonic() - stopped_at
            same_instant = write_core(stopped, out / "core-stop-the-world", {}) if compare else None
        finished = time.monotonic()
        result["written"] = pending.finish().written
        result["finish_seconds"] = time.monotonic() - finished
        if same_instant is not None:
            same_instant.finish()
        result.update(capture_seconds=time.monotonic() - started, written_meanwhile=copies.forgotten,
                      from_copies=sum(n for _, _, n in pending.deferred),
                      rounds=[vars(r) for r in copies.rounds])
        copies.close()
        if compare:
            result["differences"] = differences(out / "core", out / "core-stop-the-world")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
