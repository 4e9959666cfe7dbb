"""Damaged heaps: `heapwalk check` names each corruption of corrupt.c at its exact address, under every glibc
of the matrix and without debug symbols; every other command still finishes and says what is partial."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import harness
from conftest import GLIBCS, capture, corruption, glibc, run_gdb, version_tuple

OTHER_COMMANDS = ("heapwalk bins", "heapwalk tcache", "heapwalk chunks --limit 5", "heapwalk threads",
                  "heapwalk arenas")


def _applies(glibc_name: str, mode: str) -> bool:
    return harness.corruption_applies(mode, version_tuple(glibc(glibc_name).version))


def _cases(modes):
    """Every (glibc, mode) the glibc can show (no fastbins in 2.43, no tcache alignment check in 2.31)."""
    return [pytest.param(g, mode, id=f"{g}-{mode}") for g in GLIBCS for mode in modes if _applies(g, mode)]


def _run_all(glibc_name: str, mode: str, tmp_path: Path, symbols: bool = False):
    """check --json and report --json, then every other command, in one gdb on the corrupted core."""
    cap = corruption(glibc_name, mode)
    tmp_path.mkdir(parents=True, exist_ok=True)
    checked, reported = tmp_path / "check.json", tmp_path / "report.json"
    result = run_gdb([str(cap.exe), str(cap.core)],
                     [f"heapwalk check --json {checked}", f"heapwalk report --json {reported}", *OTHER_COMMANDS],
                     iex=glibc(glibc_name).gdb_settings(symbols), timeout=120)
    output = result.stdout + result.stderr
    assert "Traceback" not in output and "internal error" not in output, output
    assert checked.exists() and reported.exists(), output
    expected = json.loads((cap.directory / "expected.json").read_text())
    return expected, json.loads(checked.read_text()), json.loads(reported.read_text()), result


def _matches(finding: dict, expected: dict, main_arena: int) -> bool:
    if finding["kind"] != expected["kind"]:
        return False
    address = expected["address"] or (main_arena if expected["kind"] == "mutex_held" else 0)
    if address and finding["address"] != address:
        return False
    return not expected.get("found") or finding["found"] == hex(expected["found"])


@pytest.mark.parametrize("glibc_name,mode", _cases(harness.CORRUPTIONS))
def test_check_names_each_corruption_at_its_address(glibc_name, mode, tmp_path):
    expected, checked, reported, result = _run_all(glibc_name, mode, tmp_path)
    hits = [f for f in checked["findings"] if _matches(f, expected, checked["main_arena"])]
    assert hits, f"expected {expected}, got:\n" + "\n".join(json.dumps(f) for f in checked["findings"])
    if mode == "mutex":
        assert checked["clean"] and hits[0]["severity"] == "warning"
        assert any("mutex" in note for note in checked["partial"])
    else:
        assert not checked["clean"] and hits[0]["severity"] == "error"
    assert reported["report"]["partial"] == checked["partial"]
    if checked["partial"]:
        assert "partial results" in result.stdout


@pytest.mark.parametrize("mode", ["fd_bk", "tcache_count", "chunk_size", "double_free"])
def test_check_is_the_same_with_debug_symbols(mode, tmp_path):
    expected, with_symbols, _, _ = _run_all("system", mode, tmp_path / "a", symbols=True)
    _, without, _, _ = _run_all("system", mode, tmp_path / "b", symbols=False)
    assert with_symbols["findings"] == without["findings"]


def test_heap_walk_resynchronises_after_an_overwritten_size(tmp_path):
    """After the impossible size the walk goes on: only the damaged chunk's bytes are left unwalked."""
    expected, checked, reported, _ = _run_all("system", "chunk_size", tmp_path)
    (main,) = [a for a in reported["arenas"] if a["kind"] == "main"]
    accounting = main["accounting"]
    assert 0 < accounting["unwalked"] <= 0x50
    assert accounting["bytes"]["top"] == main["top"]["size"] > 0
    assert accounting["chunks"]["in_use"] > 20  # the chunks after the damaged one were walked too


@pytest.mark.parametrize("glibc_name,mode", _cases(harness.CRASHES))
def test_crash_core_names_glibcs_abort_and_the_damage(glibc_name, mode, tmp_path):
    expected, checked, _, _ = _run_all(glibc_name, mode, tmp_path)
    (last_words,) = [f for f in checked["findings"] if f["kind"] == "abort"]
    want = {"abort_double_free": "double free or corruption (!prev)",
            "abort_unaligned_tcache": "malloc(): unaligned tcache chunk detected"}[mode]
    assert last_words["found"] == want
    if mode == "abort_unaligned_tcache":
        assert any(_matches(f, expected, 0) for f in checked["findings"]), checked["findings"]
    else:
        clues = [f for f in checked["findings"] if f["kind"] == "crash_pointer"]
        assert any(f["address"] == expected["address"] for f in clues), checked["findings"]


def test_exit_status_tells_damaged_from_clean(tmp_path):
    damaged = corruption("system", "fd_bk")
    clean = capture("system", "bins")
    bad = run_gdb([str(damaged.exe), str(damaged.core)], ["heapwalk check"])
    good = run_gdb([str(clean.exe), str(clean.core)], ["heapwalk check"])
    assert bad.returncode == 1 and "the heap is damaged" in bad.stderr
    assert good.returncode == 0 and "heap consistent" in good.stdout
    counted = run_gdb([str(damaged.exe), str(damaged.core)],
                      ["heapwalk check", "print $heapwalk_errors", "print $heapwalk_warnings"])
    assert "$1 = 1\n$2 = 0" in counted.stdout


@pytest.mark.parametrize("glibc_name", GLIBCS)
@pytest.mark.parametrize("name", harness.REPRODUCERS)
def test_check_finds_nothing_on_every_clean_core(glibc_name, name, json_of, tmp_path):
    c = capture(glibc_name, name)
    out = tmp_path / "check.json"
    result = run_gdb([str(c.exe), str(c.core)], [f"heapwalk check --json {out}"],
                     iex=glibc(glibc_name).gdb_settings(False))
    document = json.loads(out.read_text())
    assert document["clean"] and document["errors"] == 0, result.stdout
    assert document["checked"]["chunks"] > 0 and result.returncode == 0
