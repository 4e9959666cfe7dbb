"""gperftools' tcmalloc on arm64: cores/tcmalloc/tc_hold.c built with Debian's aarch64 cross compiler and run under
qemu-user on Debian bookworm's arm64 libtcmalloc-minimal4 (2.10) and glibc, its core completed as an arm64 kernel
writes it (cores/scripts/foreign.py), read here by gdb-multiarch, symbols hidden: every figure tcmalloc printed,
the check sound, the exiting thread's blocks leaked, and nothing said undecoded (exit status 0)."""

from __future__ import annotations

import json

import pytest

from conftest import capture_foreign, foreign_root, foreign_settings, heapwalk, run_gdb
from tcmalloc_oracle import check, ledgers

pytestmark = pytest.mark.cores


def test_a_core_gives_every_figure_tcmalloc_printed_and_its_leaks(tmp_path):
    cap = capture_foreign("tc_hold")
    out = tmp_path / "report.json"
    result = heapwalk("report", str(cap.core), str(cap.exe), "--sysroot", str(foreign_root()), "--no-symbols",
                      "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    doc, stats = json.loads(out.read_text()), json.loads((cap.directory / "stats.json").read_text())
    check(doc, stats, "2.10")
    assert "could not" not in result.stdout + result.stderr     # glibc's malloc, unused, is not called undecoded
    parked, exited = ledgers(cap.directory)
    leaks = doc["report"]["leaks"]
    assert leaks["in_use_bytes"] == stats["properties"]["generic.current_allocated_bytes"]
    assert leaks["leaked_count"] == len(exited) + 1         # and gperftools' own MallocExtension (8 bytes)
    assert leaks["leaked_bytes"] >= sum(exited.values()) + 8


def test_check_walks_every_span_and_list_and_finds_it_sound():
    cap = capture_foreign("tc_hold")
    result = run_gdb([str(cap.exe), str(cap.core)], ["heapwalk check"], iex=foreign_settings(False),
                     gdb="gdb-multiarch", timeout=600)
    said = " ".join(result.stdout.split())
    assert "tcmalloc consistent: checked the page map's spans" in said and "6 thread caches" in said, said
    assert "Traceback" not in result.stdout + result.stderr
