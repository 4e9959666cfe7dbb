"""Targets that are not what heapwalk expects: each gets one clear line and no traceback."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

import harness
from conftest import BINDIR, capture, run_gdb

LIBDIR = "/usr/lib/x86_64-linux-gnu"


def _one_line_refusal(result, *words: str) -> None:
    output = result.stdout + result.stderr
    assert "Traceback" not in output and "internal error" not in output, output
    assert result.returncode == 1, output
    last = result.stderr.strip().splitlines()[-1]
    assert all(w in last for w in words), last


def _plain_core(tmp_path, env: dict[str, str]):
    exe = harness.build("plain", BINDIR)
    proc = harness.run_to_snapshot(exe, tmp_path, env=env)
    try:
        harness.take_core(proc.pid, tmp_path / "core")
    finally:
        proc.kill()
        proc.wait()
    return exe, tmp_path / "core"


def test_no_process_and_no_core():
    _one_line_refusal(run_gdb([], ["heapwalk report"]), "no process or core file")


@pytest.mark.parametrize("symbols", [True, False])
def test_process_that_never_called_malloc(tmp_path, symbols):
    exe, core = _plain_core(tmp_path, {"HW_NO_MALLOC": "1"})
    iex = [] if symbols else ["set debug-file-directory /nonexistent"]
    _one_line_refusal(run_gdb([str(exe), str(core)], ["heapwalk report"], iex=iex), "malloc was never used")


@pytest.mark.parametrize("library,name", [("libjemalloc.so.2", "jemalloc"), ("libtcmalloc_minimal.so.4", "tcmalloc")])
def test_process_using_another_allocator_is_named(tmp_path, library, name):
    exe, core = _plain_core(tmp_path, {"LD_PRELOAD": f"{LIBDIR}/{library}"})
    for command in ("heapwalk report", "heapwalk check", "heapwalk bins"):
        _one_line_refusal(run_gdb([str(exe), str(core)], [command]), f"allocates with {name}",
                          "glibc's arenas hold nothing of interest")


def test_core_cut_short_is_refused_in_one_line(tmp_path):
    """gcore writes its notes last: a core cut short loses them, and gdb cannot open it at all."""
    cap = capture("system", "thread_arenas")
    cut = tmp_path / "core"
    shutil.copyfile(cap.core, cut)
    with cut.open("r+b") as fh:
        fh.truncate(cap.core.stat().st_size * 2 // 3)
    _one_line_refusal(run_gdb([str(cap.exe), str(cut)], ["heapwalk report"]), "no process or core file")


def test_core_with_missing_pages_gives_partial_results(tmp_path, json_of):
    """A core whose segment holding one thread arena has no bytes (as when a dump was cut or filtered; gdb
    then reads zeros): that arena is reported as unreadable, the ring is cut after it, and the report says so
    and decodes the arenas before it in full."""
    cap = capture("system", "thread_arenas")
    document = json_of("system", "thread_arenas")
    victim = document["arenas"][3]["address"]
    damaged = tmp_path / "core"
    shutil.copyfile(cap.core, damaged)
    with damaged.open("r+b") as fh:
        header = fh.read(64)
        phoff, = struct.unpack_from("<Q", header, 32)
        phentsize, phnum = struct.unpack_from("<HH", header, 54)
        for i in range(phnum):
            fh.seek(phoff + i * phentsize)
            p_type, _, _, vaddr, _, filesz = struct.unpack("<IIQQQQ", fh.read(40))
            if p_type == 1 and vaddr <= victim < vaddr + max(filesz, 1):
                fh.seek(phoff + i * phentsize + 32)
                fh.write(struct.pack("<Q", 0))  # p_filesz: the segment's bytes are not in the file
                break
        else:
            raise AssertionError("no segment holds the arena")
    out = tmp_path / "report.json"
    result = run_gdb([str(cap.exe), str(damaged)], [f"heapwalk report --json {out}", "heapwalk check"])
    output = result.stdout + result.stderr
    assert "Traceback" not in output and "internal error" not in output, output
    report = json.loads(out.read_text())
    assert [a["address"] for a in report["arenas"]] == [a["address"] for a in document["arenas"][:4]]
    assert report["arenas"][:3] and all(a["accounting"]["balanced"] for a in report["arenas"][:3])
    (blank,) = report["arenas"][3]["findings"]
    assert blank["kind"] == "arena" and "missing from the core" in blank["message"]
    assert any("ring" in note for note in report["report"]["partial"]), report["report"]["partial"]
    assert any("arena 3: could not be read" in note for note in report["report"]["partial"])
    assert "partial results" in result.stdout and "heap DAMAGED" in result.stdout
