"""A capture, a live capture and heapwalk's commands in `gdb -p` never change the process they read
(docs/runbook.md, "What a capture guarantees"): on cores/glibc/untouched.c, which mapped memory it barely touched
(128 MiB of shared anonymous memory and a 64 MiB memfd with 1 MiB written each, private memory with 8 pages
written, a file mapped writable and never written, mmapped chunks whose tails were never written) and wrote
its title over its environment block, its RSS, RssShmem, the machine's Shmem and the pages present in each
of those mappings are the same before and after; the capture's core decodes as gcore's core of the same
instant, holds the file's bytes, and reads no zeros where it holds nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import harness
import sysroots
from conftest import BINDIR, JEMALLOCS, ROOT, SYSROOTS
from heapwalk.inferior.corefile import CoreFile
from services import gcore_report, process_state, running
from untouched_figures import LIVE_COMMANDS, assert_unchanged, measure

pytestmark = pytest.mark.live

HEAPWALK = Path(sys.executable).parent / "heapwalk"
PAGE, MiB = 4096, 1 << 20


@pytest.fixture
def untouched(tmp_path):
    """cores/glibc/untouched.c running with MALLOC_ARENA_MAX=2 and a data file mapped: (process, its ledger, the
    file's bytes)."""
    data = bytes(range(251)) * 800 + b"end"                     # 200,803 bytes: 50 pages, the last partial
    (tmp_path / "data.bin").write_bytes(data)
    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
    with running(tmp_path, "untouched", str(tmp_path / "data.bin"), env=env) as (proc, state_dir):
        ledger = json.loads((state_dir / "ledger.json").read_text())
        assert ledger["shared"][2] == MiB and ledger["file"][1] == len(data)
        yield proc, ledger, data


def _heapwalk(*args) -> subprocess.CompletedProcess:
    result = subprocess.run([str(HEAPWALK), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr and "internal error" not in result.stderr
    return result


def _comparable(doc: dict) -> dict:
    """A report's JSON without what says how it was read (target, residency source, the arena limit's CPU
    count, which a gcore core lacks, and the finding that a capture left memory unread), nor the process's RSS
    by owner and the verdict's sentence on it (compared apart)."""
    doc = json.loads(json.dumps(doc))
    doc.pop("target")
    doc["findings"] = [f for f in doc["findings"] if f["structure"] != "core file"]
    doc["report"].pop("residency")
    doc["report"].pop("arena_limit")
    doc["report"].pop("rss_by_owner")
    doc["report"]["verdict"] = [s for s in doc["report"]["verdict"] if not s.startswith("The allocators' heaps hold")]
    return doc


def test_capture_changes_nothing_and_decodes_as_gcore(untouched, tmp_path):
    proc, ledger, data = untouched
    before = measure(proc.pid, ledger)
    for name, extra in (("ours", ()), ("full", ("--full",)), ("live", ("--live",))):
        result = _heapwalk("capture", proc.pid, "--out", tmp_path / name, *extra)
        assert_unchanged(before, measure(proc.pid, ledger), gdb_attached=name == "live")
        assert proc.poll() is None and process_state(proc.pid) in "SR"
    printed = result.stdout
    before = measure(proc.pid, ledger)       # (gdb, attached for --live, read the vDSO)
    ours = _heapwalk("capture", proc.pid, "--out", tmp_path / "again").stdout
    assert_unchanged(before, measure(proc.pid, ledger))
    # what the capture did not read: the untouched shared memory, to the page
    record = json.loads((tmp_path / "ours" / "capture.json").read_text())
    shared, memfd = ledger["shared"], ledger["memfd"]
    assert sorted((r["start"], r["end"]) for r in record["not_read"]) == sorted([
        (shared[0] + MiB, shared[0] + shared[1]), (memfd[0] + MiB, memfd[0] + memfd[1])])
    assert "not read, so not in the core: 190 MiB" in ours
    assert "info: core file at 0x%x: the capture did not read 2 range(s)" % (ledger["memfd"][0] + MiB) in ours or \
        "info: core file at 0x%x: the capture did not read 2 range(s)" % (shared[0] + MiB) in ours
    # where malloc's settings come from, when the process wrote over its environment block
    assert 'the process wrote over its environment block (it now holds "untouched: serving")' in ours
    assert "malloc's own state (mp_): arena_max 2," in ours and "limit 2 (MALLOC_ARENA_MAX" in printed
    # the same decode as gcore's core of the same instant (gcore faults pages in: it comes last)
    oracle = gcore_report(proc.pid, tmp_path / "gcore", tmp_path / "ours" / "capture.json")
    docs = {name: json.loads((tmp_path / name / "report.json").read_text()) for name in ("ours", "full")}
    assert _comparable(docs["ours"]) == _comparable(docs["full"]) == _comparable(oracle)
    # the RSS by owner: the capture's sums to what smaps gave at its stop, and gcore's core with the capture's
    # record says the same
    owners = [doc["report"]["rss_by_owner"] for doc in (docs["ours"], oracle)]
    assert owners[0]["total"] == sum(m["rss"] for m in record["smaps"]) == owners[1]["total"]
    # the mmapped chunks, whose untouched tails are not in the core, found as in gcore's: the ledger's
    chunks = {c["address"]: c["size"] for c in docs["ours"]["mmapped"]["chunks"]}
    assert sorted(chunks) == sorted(start for start, _ in ledger["mmapped"])
    assert all(request < chunks[start] <= request + PAGE for start, request in ledger["mmapped"])
    assert "found 0 mmapped chunks" not in ours


def test_a_capture_core_holds_the_files_bytes_and_no_zeros_where_it_holds_nothing(untouched, tmp_path):
    proc, ledger, data = untouched
    _heapwalk("capture", proc.pid, "--out", tmp_path / "cap")
    core = CoreFile(tmp_path / "cap" / "core")
    # the file mapped writable and never written: its bytes are in the core, read from the file
    start, size = ledger["file"]
    assert core.read(start, size) == data and core.read(start + size, PAGE - size % PAGE) == bytes(PAGE - size % PAGE)
    (tmp_path / "data.bin").unlink()
    # the touched shared memory is there; past it, gdb finds no bytes (an error, never zeros)
    shared = ledger["shared"][0]
    out = subprocess.run(["gdb", "-nx", "-batch", "-ex", f"x/gx {shared:#x}", "-ex", f"x/gx {shared + 2 * MiB:#x}",
                          "-ex", f"x/gx {ledger['memfd'][0] + 8 * MiB:#x}", str(ROOT / "build" / "bin" / "untouched"),
                          str(tmp_path / "cap" / "core")], capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert "0x5a5a5a5a5a5a5a5a" in text
    assert text.count("Cannot access memory at address") == 2, text
    # heapwalk's map of the core leaves those ranges out of what it may read
    holes = core.holes(lambda mapping, address: True)
    assert (shared + MiB, shared + ledger["shared"][1]) in holes


def test_live_commands_in_gdb_change_nothing(untouched, tmp_path):
    proc, ledger, _ = untouched
    before = measure(proc.pid, ledger)
    args = ["gdb", "-nx", "-batch", "-q", "-x", str(ROOT / "gdbinit")]
    for command in LIVE_COMMANDS:
        args += ["-ex", f"heapwalk {command}"]
    out = subprocess.run(args + ["-p", str(proc.pid)], capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert "internal error" not in text and "Traceback" not in text, text
    assert "mmapped chunks: 2, 11 MiB" in text and "nothing leaked" in text
    assert_unchanged(before, measure(proc.pid, ledger), gdb_attached=True)


def _without_clock_and_ram(doc: dict) -> dict:
    """DOC without what only a capture knows: the process's clock at the stop (and so each arena's uptime), and
    what was in RAM (and so the RSS by owner)."""
    doc = json.loads(json.dumps(doc))
    doc["jemalloc"].pop("clock_ns")
    doc["report"].pop("rss_by_owner", None)
    for arena in doc["jemalloc"]["arenas"]:
        arena.pop("uptime_ns")
    rep = doc["report"]
    for row in (*rep["arenas"], rep["totals"]):
        for key in ("rss", "free_resident", "top_resident", "thread_names"):   # (names: the capture's)
            row.pop(key, None)
    rep.pop("residency"), rep["mmapped"].pop("resident")
    rep["verdict"] = [s for s in rep["verdict"] if not s.startswith(("Overdue:", "Whether their decay is overdue",
                                                                     "The allocators' heaps hold"))]
    # the headline's last clause: how much of the free memory is in RAM, or that a plain core does not say
    rep["verdict"] = [s.rsplit("; ", 1)[0] + "." if s.startswith("Held free by jemalloc") else s
                      for s in rep["verdict"]]
    return doc


@pytest.mark.parametrize("suite", JEMALLOCS)
def test_a_jemalloc_process_captured_decodes_as_gcores_core(suite, tmp_path):
    """A process on Debian's shared libjemalloc2 (je_dns at its snapshot): jemalloc's data pages that the
    process never wrote (its options, read by the decoder) are in the capture's core, which decodes exactly
    as gcore's core of the same instant, its figures equal to what malloc_stats_print printed."""
    jemalloc = sysroots.prepare_jemalloc(SYSROOTS, suite)
    exe = harness.build("je_dns", BINDIR)
    directory = tmp_path / "je_dns"
    proc = harness.run_to_snapshot(exe, directory, env={**jemalloc.environment(), **harness.JEMALLOC_ENV["je_dns"]})
    try:
        _heapwalk("capture", proc.pid, "--out", tmp_path / "cap")
        oracle = gcore_report(proc.pid, tmp_path / "gcore")
    finally:
        proc.kill()
        proc.wait()
    ours = json.loads((tmp_path / "cap" / "report.json").read_text())
    ours.pop("target"), oracle.pop("target")
    # the capture knows each thread's name, which gcore's core does not hold
    names = [t.pop("name") for t in ours["jemalloc"]["threads"]]
    assert all(names) and not any(t.pop("name") for t in oracle["jemalloc"]["threads"])
    # and the process's clock and which pages were in RAM (each arena's RSS, the decay that is overdue)
    assert ours["jemalloc"]["clock_ns"] and oracle["jemalloc"]["clock_ns"] is None
    assert ours["report"]["residency"] and all(a["rss"] for a in ours["report"]["arenas"])
    assert _without_clock_and_ram(ours) == _without_clock_and_ram(oracle)
    # what the named capture of the issue lost: the options, each thread's tsd, its tcache
    je = ours["jemalloc"]
    assert ours["allocator"] == "jemalloc" and je["opt"]["narenas"] == 8 and je["opt"]["dirty_decay_ms"] == 100
    assert je["threads"] and all(t["tsd"] for t in je["threads"])
    assert sum(t["tcache"]["bytes"] for t in je["threads"] if t.get("tcache")) > 0
