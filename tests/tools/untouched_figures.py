"""What a read that faults pages in would change in a process of cores/glibc/untouched.c: its RSS, RssShmem, the
machine's Shmem, and the pages present in each mapping its ledger names (tests/live/test_untouched.py on this
machine's kernel; tests/tools/untouched_driver.py in the qemu machine, where a capture pre-copies)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

#: the kernel's page, which its page map counts in
PAGE = os.sysconf("SC_PAGE_SIZE")
#: heapwalk's commands run in gdb attached to the process
LIVE_COMMANDS = ("report", "leaks", "check", "map", "chunks --free", "threads", "arenas")


def _present(pid: int, start: int, size: int) -> int:
    """Pages of [START, START+SIZE) present in PID's page tables."""
    size = -(-size // PAGE) * PAGE
    with open(f"/proc/{pid}/pagemap", "rb", buffering=0) as f:
        entries = np.frombuffer(os.pread(f.fileno(), size // PAGE * 8, start // PAGE * 8), dtype=np.uint64)
    return int((entries >> np.uint64(63)).sum())


def measure(pid: int, ledger: dict) -> dict:
    """What a read that faults pages in would change: PID's RSS and RssShmem (KiB), the machine's Shmem (KiB),
    and the pages present in each mapping of LEDGER and in its vDSO."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    out = {"VmRSS": int(status["VmRSS"].split()[0]), "RssShmem": int(status["RssShmem"].split()[0]),
           "Shmem": int(meminfo["Shmem"].split()[0])}
    for name in ("shared", "memfd", "private", "file"):
        out[name] = _present(pid, ledger[name][0], ledger[name][1])
    for i, (start, size) in enumerate(ledger["mmapped"]):
        out[f"mmapped{i}"] = _present(pid, start, size)
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():   # the kernel maps a vDSO page on first read
        if line.endswith("[vdso]"):
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            out["vdso"] = _present(pid, start, end - start)
    return out


def assert_unchanged(before: dict, after: dict, gdb_attached: bool = False) -> None:
    """The pages present and RssShmem exactly as they were; RSS and the machine's Shmem within a few pages
    (the kernel's own bookkeeping, and the rest of the machine, move them a little).  GDB_ATTACHED: gdb read
    the vDSO when it attached, before heapwalk ran (it loads its symbols from memory; gdb has no setting to
    stop it): its pages may be mapped in since, and nothing else."""
    skip = ("VmRSS", "Shmem", "vdso") if gdb_attached else ("VmRSS", "Shmem")
    assert {k: v for k, v in after.items() if k not in skip} == {k: v for k, v in before.items() if k not in skip}
    assert abs(after["VmRSS"] - before["VmRSS"]) <= 8, (before, after)
    assert abs(after["Shmem"] - before["Shmem"]) <= 256, (before, after)
