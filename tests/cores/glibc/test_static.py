"""A stripped, statically linked program: glibc lives inside the program, and nothing names main_arena."""

from __future__ import annotations

import json
import subprocess

import pytest

import harness
from conftest import BINDIR, CORES, heapwalk_json, run_gdb
from oracle import malloc_info_view, parse_malloc_info

pytestmark = pytest.mark.cores


@pytest.fixture(scope="module")
def static_cores():
    return {name: harness.capture(name, CORES / "static", BINDIR, static=True)
            for name in ("bins", "thread_arenas", "many_arenas")}


@pytest.mark.parametrize("name", ["bins", "thread_arenas", "many_arenas"])
def test_a_stripped_static_program_decodes_exactly(static_cores, name, tmp_path):
    cap = static_cores[name]
    doc = heapwalk_json([str(cap.exe), str(cap.core)], tmp_path)
    assert malloc_info_view(doc) == parse_malloc_info(cap.malloc_info)
    ledger = json.loads(cap.ledger.read_text())
    threads = {t["lwp"]: t for t in doc["threads"]}
    for lt in ledger["threads"]:
        tcache = threads[lt["tid"]]["tcache"]
        have = {b["chunk_size"]: b["entries"] for b in tcache["bins"]} if tcache else {}
        assert have == {b["chunk_size"]: b["entries"] for b in lt["tcache"]}, lt["label"]
    facts = doc["discovery"]
    assert facts["libc"]["found_by"] == "mappings: the only file mapped, a statically linked program"
    assert facts["main_arena"]["found_by"].startswith("bin-127 self-link scan")
    assert facts["glibc_version"]["found_by"].startswith("banner")
    assert doc["findings"] == [] and all(a["findings"] == [] for a in doc["arenas"])


def test_check_finds_a_stripped_static_programs_heap_consistent(static_cores):
    """heapwalk check on each static core: everything it checks is found and sound (exit status 0)."""
    for name, cap in static_cores.items():
        result = run_gdb([str(cap.exe), str(cap.core)], ["heapwalk check"])
        assert result.returncode == 0, result.stdout + result.stderr
        assert "heap consistent: no violations in" in result.stdout and " 0 tcaches" not in result.stdout, name


def test_a_static_program_whose_file_is_gone_is_decoded_and_the_header_says_which_file_to_give(tmp_path):
    """The program holds glibc: without its file, a capture's core lacks the read-only pages with glibc's
    version, so the header names the program's file to give, and memory still decodes the heap exactly."""
    cap = harness.capture("bins", tmp_path / "cores", tmp_path / "bin", static=True)
    cap.exe.unlink()
    result = run_gdb(["-c", str(cap.core)], ["heapwalk report"])
    header = next(line for line in result.stdout.splitlines() if line.startswith("glibc "))
    assert header.endswith(f"(version: not determined: glibc is linked into the program, whose read-only pages "
                           f"are not in the core and whose file ({cap.exe}) is not available: give the program "
                           "as EXE)"), result.stdout
    doc = heapwalk_json(["-c", str(cap.core)], tmp_path)
    assert malloc_info_view(doc) == parse_malloc_info(cap.malloc_info)


def test_a_static_program_without_a_version_string_is_not_said_to_lack_its_file(tmp_path):
    """A static program that never asks glibc its version (plain.c) holds no banner and no
    gnu_get_libc_version: given with its core, the header says that, and how to name the version, not that
    its file is missing ("give the program as EXE" with the program given); the heap decodes all the same."""
    exe = tmp_path / "plain"           # without hw.c, which asks glibc its version
    subprocess.run(["gcc", "-O1", "-static", "-s", str(harness.source("plain.c")), "-o", str(exe)], check=True)
    harness.snapshot_core(exe, tmp_path, tmp_path / "core")
    result = run_gdb([str(exe), str(tmp_path / "core")], ["heapwalk report"])
    assert result.returncode == 0, result.stdout + result.stderr
    header = next(line for line in result.stdout.splitlines() if line.startswith("glibc "))
    assert "holds no version string" in header and "'set heapwalk glibc-version X.Y' names it" in header, header
    assert "give the program as EXE" not in result.stdout
