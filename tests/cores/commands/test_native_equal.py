"""heapwalk's C libraries change no byte of what it says: `heapwalk report` and `heapwalk leaks` write the same
JSON and the same text with them and with HEAPWALK_PURE=1 (the Python and numpy forms, as where `pip install`
built none), on the bench's smoke cores of every allocator the bench runs (glibc's random shape, jemalloc,
tcmalloc, mimalloc 2 and 3: some 30,000 blocks each, every free list of the slabs, spans and pages walked)."""

from __future__ import annotations

from pathlib import Path

import pytest

import bench
import bench_jemalloc
import bench_preload
from conftest import run_gdb

pytestmark = pytest.mark.cores

CORES = ("glibc", "jemalloc", *bench_preload.ALLOCATORS)


def _core(name: str) -> tuple[Path, Path]:
    """The bench's smoke core of allocator NAME (taken unless it is there): (program, core)."""
    chunks = bench.SIZES["smoke"]
    if name == "glibc":
        cap = bench.capture("smoke", bench.BUILD / "bin", "random")
    elif name == "jemalloc":
        cap = bench_jemalloc.capture("smoke", chunks, bench.BUILD)
    else:
        cap = bench_preload.capture(name, "smoke", chunks, bench.BUILD)
    return cap.exe, cap.core


def _said(exe: Path, core: Path, out: Path, pure: bool) -> tuple[str, str, str]:
    """(report's JSON, leaks' JSON, both commands' text) on the core, with the C libraries or without."""
    report, leaks = out / f"report-{pure}.json", out / f"leaks-{pure}.json"
    result = run_gdb([str(exe), str(core)], [f"heapwalk report --json {report}", f"heapwalk leaks --json {leaks}"],
                     env={"HEAPWALK_PURE": "1"} if pure else {"HEAPWALK_PURE": ""}, timeout=600)
    assert report.exists() and leaks.exists(), result.stdout[-2000:] + result.stderr[-2000:]
    text = "\n".join(line for line in result.stdout.splitlines() if not line.startswith("[New "))
    return report.read_text(), leaks.read_text(), text


@pytest.mark.parametrize("name", CORES)
def test_the_c_libraries_change_no_byte_said(name, tmp_path):
    exe, core = _core(name)
    native, pure = _said(exe, core, tmp_path, False), _said(exe, core, tmp_path, True)
    assert native[0] == pure[0], "report --json"
    assert native[1] == pure[1], "leaks --json"
    assert native[2] == pure[2]
