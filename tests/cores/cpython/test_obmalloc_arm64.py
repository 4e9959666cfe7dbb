"""CPython's obmalloc on arm64: cores/cpython/pyobjects.py run by Debian bookworm's arm64 python3.11 under qemu-user,
its core completed as an arm64 kernel writes it (cores/scripts/foreign.py), read here by gdb-multiarch through the
command line, symbols hidden: every total and every class's row sys._debugmallocstats() printed, the arena
table found, glibc's malloc beside it decoded too."""

from __future__ import annotations

import json

import pytest

from conftest import capture_foreign, foreign_root, heapwalk
from cpython_oracle import matches, obmalloc

pytestmark = pytest.mark.cores


def test_a_core_gives_what_the_interpreter_printed(tmp_path):
    cap = capture_foreign("pyobjects")
    out = tmp_path / "report.json"
    result = heapwalk("report", str(cap.core), str(cap.exe), "--sysroot", str(foreign_root()), "--no-symbols",
                      "--no-leaks", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    matches(doc, cap.directory / "stats.txt")
    assert obmalloc(doc)["obmalloc"]["arena_table"] is not None
    assert doc["allocator"] == "glibc" and "CPython 3.11" in " ".join(result.stdout.split())
