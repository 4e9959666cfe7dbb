"""CPython's obmalloc on real interpreters, symbols hidden: cores/cpython/pyobjects.py (small objects kept and freed in a
scattered order, threads that allocated and exited) prints sys._debugmallocstats() and stops itself at once;
'heapwalk capture' of it gives every figure it printed, class by class and in total, on Debian's CPython 3.9
(bullseye), 3.11 (this machine's), 3.13 (trixie) and 3.14 (sid); its arenas are one owner of the RSS, their
resident bytes; and gdb attached to the running interpreter says the same."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import chroots
import harness
from browser import Browser, cut_off
from figures import page_disagreements
from conftest import NO_SYMBOLS, ROOT, run_gdb
from cpython_oracle import matches, obmalloc
from verdicts import contradictions

pytestmark = pytest.mark.cores

CLI = Path(sys.executable).with_name("heapwalk")
SCRIPT = ROOT / "cores" / "cpython" / "pyobjects.py"
#: the suite of each interpreter: this machine's (Debian 12) and the chroots'
SUITES = ("bookworm", "bullseye", "trixie", "sid")


def _launcher(suite: str) -> list[str]:
    """How SUITE's python3 is run on this machine: its own, or the chroot's through the chroot's ld.so."""
    if suite == "bookworm":
        return ["/usr/bin/python3"]
    root = chroots.prepare(suite).path
    python = sorted(p for p in (root / "usr" / "bin").glob("python3.*") if re.fullmatch(r"python3\.\d+", p.name))
    libs = root / "usr" / "lib" / "x86_64-linux-gnu"
    return [str(libs / "ld-linux-x86-64.so.2"), "--library-path", str(libs), str(python[-1])]


@pytest.mark.parametrize("suite", SUITES)
def test_a_capture_gives_what_the_interpreter_printed(suite, tmp_path):
    """Every total and every class row equal to the interpreter's own print, with the arena table found; the
    arenas one row of the RSS, their resident bytes."""
    run = tmp_path / "run"
    proc = harness.run_to_snapshot(SCRIPT, run, launcher=_launcher(suite))
    try:
        result = subprocess.run([str(CLI), "capture", str(proc.pid), "--out", str(tmp_path / "out"), "--no-symbols"],
                                capture_output=True, text=True, timeout=600)
    finally:
        proc.kill()
        proc.wait()
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    matches(doc, run / "stats.txt")
    assert contradictions(doc) == []            # malloc's verdict and obmalloc's, each with itself
    ob = obmalloc(doc)["obmalloc"]
    assert ob["arena_table"] is not None
    rows = {r["name"]: r for r in doc["report"]["rss_by_owner"]["rows"]}
    arenas = rows["CPython's obmalloc: arenas"]
    assert arenas["bytes"] == sum(a["resident"] for a in ob["arenas"]) > 0
    assert arenas["mapped"] == ob["totals"]["total"]
    assert "Free memory obmalloc keeps, not a leak" in " ".join(result.stdout.split())
    page = tmp_path / "out" / "report.html"
    assert page_disagreements(page.read_text(), doc) == []
    if suite == "bookworm":    # the page, obmalloc's part after malloc's, read at 1280 and 1400 pixels
        with Browser() as browser:
            browser.open(page, 1280)
            titles = browser.evaluate("[...document.querySelectorAll('h2')].map(h => h.textContent)")
            assert titles[0] == "Where the RSS is" and titles.count("Where the memory is") == 2, titles
            for width in (1280, 1400):
                assert cut_off(browser, width) == {"cut": [], "hidden": []}, width


def test_gdb_attached_to_the_interpreter_says_the_same(tmp_path):
    """gdb -p on the stopped interpreter (this machine's), symbols hidden: the same figures, read live."""
    run = tmp_path / "run"
    proc = harness.run_to_snapshot(SCRIPT, run, launcher=_launcher("bookworm"))
    try:
        out = tmp_path / "report.json"
        result = run_gdb(["-p", str(proc.pid)], [f"heapwalk report --no-leaks --json {out}"], iex=[NO_SYMBOLS])
    finally:
        proc.kill()
        proc.wait()
    assert result.returncode == 0, result.stderr
    matches(json.loads(out.read_text()), run / "stats.txt")
    assert "CPython's obmalloc: CPython 3.11" in result.stdout
