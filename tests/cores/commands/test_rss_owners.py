"""The process's RSS by owner, and the reason for what stays, on real processes: 'heapwalk capture PID' of a
reproducer at its snapshot, and gdb attached to it: every resident byte has one owner, the rows add up to the
RSS /proc/PID/smaps gives at the same instant (the process stopped), the allocators' heaps are what their own
arenas' RSS says, and each thread's stack is its own row; a top chunk kept under a raised trim threshold is
named with its reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BINDIR, NO_SYMBOLS, ROOT, SYSROOTS, run_gdb
import harness
from figures import page_disagreements
from heapwalk.capture.proc import read_smaps

pytestmark = pytest.mark.cores

CLI = Path(sys.executable).with_name("heapwalk")


def _started(name: str, tmp_path: Path, jemalloc: str | None = None):
    """Reproducer NAME run to its snapshot (on JEMALLOC's library, if given): the stopped process."""
    if jemalloc is None:
        return harness.run_to_snapshot(harness.build(name, BINDIR), tmp_path / "run")
    je = harness.prepare_jemalloc(SYSROOTS, jemalloc)
    exe = harness.build(name, BINDIR, jemalloc=je)
    return harness.run_to_snapshot(exe, tmp_path / "run", env={**je.environment(), **harness._options_named(je, name)})


def _compiled(source: str, tmp_path: Path, *flags: str) -> Path:
    """cores/SOURCE.c compiled (with FLAGS) into TMP_PATH, a program of the tests' own (not a harness
    reproducer: it takes the folder it writes in as its one argument, and stops itself)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    exe = tmp_path / source
    subprocess.run(["gcc", "-O1", "-Wall", *flags, "-o", str(exe), str(harness.source(f"{source}.c"))], check=True)
    return exe


def _captured(proc: subprocess.Popen, out: Path) -> tuple[dict, dict, str]:
    """'heapwalk capture' of the stopped process PROC into OUT, which is then killed: (the report's JSON, the
    capture's record, what it printed, on one line)."""
    try:
        result = subprocess.run([str(CLI), "capture", str(proc.pid), "--out", str(out), "--no-symbols"],
                                capture_output=True, text=True, timeout=600)
    finally:
        proc.kill()
        proc.wait()
    assert result.returncode == 0, result.stderr
    return (json.loads((out / "report.json").read_text()), json.loads((out / "capture.json").read_text()),
            " ".join(result.stdout.split()))


def _rows(doc: dict) -> dict[tuple[str, str], int]:
    return {(r["kind"], r["name"]): r["bytes"] for r in doc["report"]["rss_by_owner"]["rows"]}


@pytest.mark.parametrize("name,jemalloc", [("thread_arenas", None), ("je_dns", "bookworm")])
def test_a_capture_puts_every_resident_byte_with_one_owner(name, jemalloc, tmp_path):
    """The capture's breakdown sums to the RSS smaps gave at its stop; the heaps' rows equal the allocator's own
    arenas' RSS (glibc: every arena's; jemalloc: every arena's extents and base blocks); every thread has its
    stack, and the report says how much of the RSS the heaps hold."""
    doc, record, said = _captured(_started(name, tmp_path, jemalloc), tmp_path / "out")
    rss = doc["report"]["rss_by_owner"]
    assert rss["measure"] == "resident" and rss["total"] == sum(m["rss"] for m in record["smaps"]) > 0
    assert rss["total"] == sum(r["bytes"] for r in rss["rows"])
    rows = _rows(doc)
    heap = sum(b for (kind, _), b in rows.items() if kind == "heap")
    arenas = doc["report"]["arenas"]
    assert heap == sum(a["rss"] for a in arenas) + (doc["report"].get("mmapped_resident") or 0), rows
    stacks = [n for kind, n in rows if kind == "stack"]
    assert len(stacks) == len(record["thread_names"]), stacks
    assert "where the RSS is" in said and "The allocators' heaps hold" in said
    page = (tmp_path / "out" / "report.html").read_text()     # the page's first picture: the RSS bar
    assert page.index('<section id="rss">') < page.index('<section id="verdict">')
    assert f'data-kind="heap" data-bytes="{heap}"' in page
    if jemalloc is None:      # no two figures of the page disagree: each arena's row, maps and captions (in RAM)
        assert page_disagreements(page, doc) == []
    # 'heapwalk diff' of the capture with itself: every kind unchanged, the same total
    out = tmp_path / "diff.json"
    same = subprocess.run([str(CLI), "diff", str(tmp_path / "out"), str(tmp_path / "out"), "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert same.returncode == 0 and "RSS by owner:" in same.stdout, same.stderr
    owners = json.loads(out.read_text())["rss_by_owner"]
    assert owners[-1] == {"kind": "total", "before": rss["total"], "after": rss["total"]}
    assert all(o["before"] == o["after"] for o in owners)


def test_gdb_attached_to_a_process_sums_to_its_rss(tmp_path):
    """gdb -p PID on the stopped reproducer: the breakdown, read from the process's page map, sums to the RSS
    smaps gives for it (the process does not run between the two)."""
    proc = _started("thread_arenas", tmp_path)
    try:
        out = tmp_path / "report.json"
        result = run_gdb(["-p", str(proc.pid)], [f"heapwalk report --no-leaks --json {out}"], iex=[NO_SYMBOLS])
        smaps = read_smaps(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert result.returncode == 0, result.stderr
    rss = json.loads(out.read_text())["report"]["rss_by_owner"]
    assert rss["total"] == sum(m["rss"] for m in smaps) == sum(r["bytes"] for r in rss["rows"])
    assert rss["source"] == "the process's page map, /proc/PID/pagemap"


def _raised(tmp_path: Path, env: dict[str, str]) -> tuple[dict, str]:
    """cores/glibc/raised_threshold.c run to its stop (with ENV) and captured: (the report's JSON, what it printed)."""
    proc = harness.run_to_snapshot(_compiled("raised_threshold", tmp_path), tmp_path / "run", env=env)
    doc, _, said = _captured(proc, tmp_path / "out")
    return doc, said


def test_a_top_kept_under_a_trim_threshold_glibc_raised_is_named_on_a_real_process(tmp_path):
    """A 20 MiB block freed from its mapping raised glibc's thresholds (mmap 20 MiB, trim 40 MiB, as mp_ says);
    the ~29 MiB top the freed small blocks left is under it: the verdict names the top, the thresholds, what pins
    them and what malloc_trim(0) gives back; with MALLOC_TRIM_THRESHOLD_ set, it says the user set it."""
    doc, said = _raised(tmp_path / "dynamic", {})
    assert doc["mp"]["mmap_threshold"] >= 20 << 20 and doc["mp"]["trim_threshold"] == 2 * doc["mp"]["mmap_threshold"]
    verdict = doc["report"]["verdict"]
    assert verdict[0].startswith("Free memory glibc keeps under its trim threshold, not fragmentation nor a leak")
    kept = next(s for s in verdict if s.startswith("The main arena's top chunk holds"))
    assert "which glibc raised from 128 KiB on its own" in kept and "malloc_trim(0) gives back" in kept
    assert kept in said
    pinned, _ = _raised(tmp_path / "pinned", {"MALLOC_TRIM_THRESHOLD_": str(64 << 20)})
    assert pinned["mp"]["no_dyn_threshold"] == 1
    assert any("as MALLOC_TRIM_THRESHOLD_ or mallopt(M_TRIM_THRESHOLD) set it" in s for s in pinned["report"]["verdict"])


def test_large_holes_kept_in_the_arena_by_a_raised_mmap_threshold_are_named_on_a_real_process(tmp_path):
    """cores/glibc/raised_threshold.c with HEAPWALK_HOLES: twelve 2 MiB blocks, which the raised mmap threshold (20 MiB)
    sent to the main arena, freed between small blocks it keeps: the verdict names the 24 MiB in large free
    chunks, the threshold glibc raised on its own and what pinning it does."""
    doc, said = _raised(tmp_path / "holes", {"HEAPWALK_HOLES": "1"})
    assert doc["mp"]["mmap_threshold"] >= 20 << 20 and doc["mp"]["no_dyn_threshold"] == 0
    (sentence,) = [s for s in doc["report"]["verdict"] if "mmap threshold" in s]
    assert sentence.startswith("24 MiB of the free memory is in chunks of 128 KiB or more")
    assert "raised its mmap threshold from 128 KiB to 20 MiB on its own" in sentence and sentence in said


def test_every_owner_of_a_process_with_a_ledger_is_what_it_mapped_and_touched(tmp_path):
    """cores/glibc/rss_owners.c: its own pool (8 MiB, 5 MiB touched) is one anonymous row of exactly 5 MiB; its POSIX
    shared memory (4 MiB, 3 MiB touched) a shared row of exactly 3 MiB; each of its three threads' 512 KiB stacks
    a row that exceeds the depth it touched (64, 128, 192 KiB) by the same few pages (the thread's descriptor
    and TLS at the top of its stack, and its first frames); and the rows add up to the RSS."""
    run = tmp_path / "run"
    proc = harness.run_to_snapshot(_compiled("rss_owners", tmp_path, "-pthread"), run)
    doc, record, _ = _captured(proc, tmp_path / "out")
    ledger = json.loads((run / "ledger.json").read_text())
    rss = doc["report"]["rss_by_owner"]
    rows = {(r["kind"], r["name"]): r for r in rss["rows"]}
    pool, size, touched = ledger["pool"]
    assert (rows[("anonymous", f"at {pool:#x}")]["bytes"], rows[("anonymous", f"at {pool:#x}")]["mapped"]) == \
        (touched, size)
    shm, size, touched = ledger["shm"]
    (shared,) = [r for r in rss["rows"] if r["kind"] == "shared"]
    assert shared["name"].startswith("/dev/shm/heapwalk-rss-") and (shared["bytes"], shared["mapped"]) == (touched, size)
    numbers = {t["lwp"]: t["number"] for t in doc["threads"]}
    beyond = set()
    for t in ledger["threads"]:
        (row,) = [r for r in rss["rows"] if r["kind"] == "stack" and r["name"].startswith(f"thread {numbers[t['tid']]} ")]
        assert row["mapped"] == 512 << 10 and t["depth"] < row["bytes"] <= t["depth"] + (32 << 10), (t, row)
        beyond.add(row["bytes"] - t["depth"])
    assert len(beyond) == 1, beyond
    assert rss["total"] == sum(r["bytes"] for r in rss["rows"]) == sum(m["rss"] for m in record["smaps"])


def test_a_plain_core_gives_what_it_holds_by_owner(tmp_path):
    """gcore's core of cores/glibc/rss_owners.c (made sparse, as the kernel writes its cores: a page never written is
    a hole), opened with no capture's record: the breakdown measures the bytes the core holds, and says so; its
    own pool's row is the 5 MiB it touched, each stack holds at least the depth its thread touched, the rows add
    up; the verdict weighs nothing against it (it is not the RSS), and 'heapwalk diff' does not compare it."""
    run = tmp_path / "run"
    exe = _compiled("rss_owners", tmp_path, "-pthread")
    harness.snapshot_core(exe, run, tmp_path / "core")
    ledger = json.loads((run / "ledger.json").read_text())
    out = tmp_path / "report.json"
    result = run_gdb([str(exe), str(tmp_path / "core")], [f"heapwalk report --json {out}"], iex=[NO_SYMBOLS])
    assert result.returncode == 0, result.stderr
    rss = json.loads(out.read_text())["report"]["rss_by_owner"]
    assert rss["measure"] == "in the core" and rss["source"].startswith("its pages that hold anything")
    assert rss["total"] == sum(r["bytes"] for r in rss["rows"]) > 0
    rows = {(r["kind"], r["name"]): r for r in rss["rows"]}
    pool, size, touched = ledger["pool"]
    assert (rows[("anonymous", f"at {pool:#x}")]["bytes"], rows[("anonymous", f"at {pool:#x}")]["mapped"]) == \
        (touched, size)
    stacks = sorted(r["bytes"] for r in rss["rows"] if r["kind"] == "stack" and r["mapped"] == 512 << 10)
    assert len(stacks) == 3 and all(b >= t["depth"] for b, t in zip(stacks, sorted(ledger["threads"],
                                                                                   key=lambda t: t["depth"])))
    said = " ".join(result.stdout.split())
    assert "what the core holds, by owner (in the core:" in said
    assert "of the" in said and "the core holds (a plain core does not say what was resident)." in said
    doc = json.loads(out.read_text())
    assert not [s for s in doc["report"]["verdict"] if s.startswith("The allocators' heaps hold")]
    diff = subprocess.run([str(CLI), "diff", str(out), str(out)], capture_output=True, text=True, timeout=300)
    assert diff.returncode == 0 and "RSS by owner: not compared" in diff.stdout, diff.stdout + diff.stderr
    # the pages the leak scan read (the pool among its roots) are judged as it reads them, not read again from
    # the core's file: the same breakdown as a report without the scan, which reads them there
    reads = {}
    for name, options in (("scan", ""), ("no-scan", " --no-leaks")):
        log, doc_path = tmp_path / f"{name}.reads", tmp_path / f"{name}.json"
        run_gdb([str(exe), str(tmp_path / "core")], [_logging_core_reads(log), f"heapwalk report{options} --json "
                                                     f"{doc_path}"], iex=[NO_SYMBOLS])
        assert json.loads(doc_path.read_text())["report"]["rss_by_owner"] == rss
        reads[name] = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    in_pool = [(a, b) for a, b in reads["no-scan"] if a < pool + size and b > pool]
    assert in_pool and not [(a, b) for a, b in reads["scan"] if a < pool + size and b > pool]


def _logging_core_reads(log: Path) -> str:
    """A gdb command that has each range of a core's file `residency.in_core` reads logged to LOG as [lo, hi]."""
    return ("python import json, heapwalk.inferior.residency as r; o = r._read_runs; r._read_runs = "
            "lambda fd, v, off, fs, a, b, o=o: (open(%r, 'a').write(json.dumps([v + a * 4096, v + b * 4096]) + "
            "'\\n'), o(fd, v, off, fs, a, b))[1]" % str(log))
