"""mimalloc on arm64: cores/mimalloc/mi_hold.c built with Debian's aarch64 cross compiler and run under qemu-user on
Debian bookworm's arm64 libmimalloc2.0 (2.0.9) and glibc, its core completed as an arm64 kernel writes it
(cores/scripts/foreign.py), read here by gdb-multiarch, symbols hidden: every figure mimalloc printed and every
heap's blocks as its ledger lists them, the check sound, the exited thread's blocks exactly the leaks."""

from __future__ import annotations

import json

import pytest

from conftest import capture_foreign, foreign_root, foreign_settings, heapwalk, run_gdb
from mimalloc_oracle import check, ledger

pytestmark = pytest.mark.cores


def test_a_core_gives_every_figure_mimalloc_printed(tmp_path):
    cap = capture_foreign("mi_hold")
    out = tmp_path / "report.json"
    result = heapwalk("report", str(cap.core), str(cap.exe), "--sysroot", str(foreign_root()), "--no-symbols",
                      "--no-leaks", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    check(json.loads(out.read_text()), cap.directory, "2.0.9")


def test_check_is_sound_and_the_leaks_are_the_exited_threads_blocks(tmp_path):
    cap = capture_foreign("mi_hold")
    out = tmp_path / "leaks.json"
    result = run_gdb([str(cap.exe), str(cap.core)], ["heapwalk check", f"heapwalk leaks --json {out}"],
                     iex=foreign_settings(False), gdb="gdb-multiarch", timeout=600)
    assert "mimalloc consistent: checked every page's counters" in " ".join(result.stdout.split()), result.stdout
    exited = next(e for e in ledger(cap.directory).values() if e["how"] == "exits")["blocks"]
    assert {b["address"]: b["size"] for b in json.loads(out.read_text())["leaked"]} == exited
