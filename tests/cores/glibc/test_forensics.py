"""Damaged heaps: `heapwalk check` names each corruption of corrupt.c at its exact address, under every glibc
of the matrix and without debug symbols; every other command still finishes and says what is partial."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import figures
import harness
from conftest import GLIBCS, capture, collection_version, corruption, glibc, rotating, run_gdb, version_tuple

pytestmark = pytest.mark.cores

OTHER_COMMANDS = ("heapwalk bins", "heapwalk tcache", "heapwalk chunks --limit 5", "heapwalk threads",
                  "heapwalk arenas")


def _applies(glibc_name: str, mode: str) -> bool:
    return harness.corruption_applies(mode, version_tuple(collection_version(glibc_name)))


def _cases(modes):
    """(glibc, mode): each mode under the glibcs that can show it (no fastbins in 2.43, no tcache alignment
    check in 2.31), on conftest's fixed subset (`rotating`: the system glibc and one other in turn)."""
    return [pytest.param(g, mode, id=f"{g}-{mode}") for i, mode in enumerate(modes)
            for g in rotating(i, [g for g in GLIBCS if _applies(g, mode)])]


def _run_all(glibc_name: str, mode: str, tmp_path: Path, symbols: bool = False, kernel: bool = False):
    """check --json and report --json, then every other command, in one gdb on the corrupted core."""
    cap = corruption(glibc_name, mode, kernel)
    tmp_path.mkdir(parents=True, exist_ok=True)
    checked, reported = tmp_path / "check.json", tmp_path / "report.json"
    others = () if kernel else OTHER_COMMANDS  # the kernel's dump of a crash gcore's core has shown them on
    result = run_gdb([str(cap.exe), str(cap.core)],
                     [f"heapwalk check --json {checked}", f"heapwalk report --json {reported}", *others],
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
    assert_possible(reported["report"])
    for arena in reported["arenas"]:  # nothing the walk could not pass hides: check fails on it
        if arena["accounting"] and arena["accounting"]["unwalked"]:
            assert not checked["clean"] and any(f["kind"] == "accounting" and f["address"] == arena["address"]
                                                for f in checked["findings"])


@pytest.mark.parametrize("glibc_name,mode", _cases(harness.LEGITIMATE))
def test_a_heap_glibc_accepts_is_consistent(glibc_name, mode, tmp_path):
    """Shapes glibc's own code makes and goes on with (the program moving the break itself between mallocs:
    two fenceposts, then memory that is not malloc's, counted in system_mem) are no damage."""
    _, checked, reported, result = _run_all(glibc_name, mode, tmp_path)
    assert checked["clean"] and not [f for f in checked["findings"] if f["severity"] == "error"], checked["findings"]
    assert not reported["report"]["partial"] and "heap consistent" in result.stdout
    assert_possible(reported["report"])


def assert_possible(report: dict) -> None:
    """Every figure of a report is one a heap can have, damaged or not (tests/tools/figures.py)."""
    assert not figures.impossible(report), figures.impossible(report)


@pytest.mark.parametrize("mode", ["arena_ring", "main_arena_next"])
@pytest.mark.parametrize("glibc_name", GLIBCS)
def test_a_broken_arena_ring_loses_no_arena(glibc_name, mode, tmp_path):
    """A thread arena's (or main_arena's) next overwritten: the bad link is named at its arena, and the
    arenas the ring no longer reaches are found by their heaps (five arenas: main and the four workers')."""
    expected, checked, reported, _ = _run_all(glibc_name, mode, tmp_path)
    arenas = {a["address"] for a in reported["arenas"]}
    assert len(arenas) == 5 and expected["address"] in arenas
    assert all(a["accounting"]["balanced"] for a in reported["arenas"])
    assert any(f["kind"] == "arena_ring" and "found by their heaps" in f["message"] for f in checked["findings"])


@pytest.mark.parametrize("mode", ["fd_bk", "tcache_count", "chunk_size", "double_free", "tcache_to_stack",
                                  "top_shrunk", "tcache_in_free", "mp_tcache_bins", "mmapped_grown"])
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


#: the message of glibc's abort in each crash mode (the same wording in every glibc of the matrix)
ABORTS = {"abort_double_free": "double free or corruption (!prev)",
          "abort_unaligned_tcache": "malloc(): unaligned tcache chunk detected",
          "abort_tcache_double_free": "free(): double free detected in tcache 2",
          "abort_fasttop": "double free or corruption (fasttop)",
          "abort_out": "double free or corruption (out)",
          "abort_invalid_pointer": "free(): invalid pointer",
          "abort_invalid_size": "free(): invalid size",
          "abort_munmap": "munmap_chunk(): invalid pointer",
          "abort_top_size": "malloc(): corrupted top size",
          "abort_size_vs_prev_size": "corrupted size vs. prev_size",
          "abort_unsorted": "malloc(): unsorted double linked list corrupted",
          "abort_smallbin": "malloc(): smallbin double linked list corrupted",
          "abort_free_unsorted": "free(): corrupted unsorted chunks",
          "abort_consolidate": "malloc_consolidate(): invalid chunk size",
          "abort_realloc_next_size": "realloc(): invalid next size"}
def _crash_cases():
    """Every crash from gcore's core on the glibcs that can show it, on conftest's fixed subset (`rotating`),
    and each crash from the kernel's dump too on one glibc, the glibcs in turn (the kernel's dump differs from
    gcore's in its notes, not by glibc)."""
    cases = [pytest.param(g, mode, False, id=f"{g}-{mode}-gcore") for i, mode in enumerate(harness.CRASHES)
             for g in rotating(i + 1, [g for g in GLIBCS if _applies(g, mode)])]
    for i, mode in enumerate(harness.CRASHES):
        shown = [g for g in GLIBCS if _applies(g, mode)]
        if shown:
            g = shown[i % len(shown)]
            cases.append(pytest.param(g, mode, True, id=f"{g}-{mode}-kernel"))
    return cases


@pytest.mark.parametrize("glibc_name,mode,kernel", _crash_cases())
def test_crash_core_names_the_chunk_glibc_aborted_on(glibc_name, mode, kernel, tmp_path):
    """The first error of check on a crash core is glibc's abort, at the chunk that fails the check the
    message names, with the evidence; the same on gcore's core at the abort and on the kernel's dump.
    No debug symbols: the crashing thread's registers and stack are what tells."""
    expected, checked, _, _ = _run_all(glibc_name, mode, tmp_path, kernel=kernel)
    if mode == "abort_unaligned_tcache":  # the bad link is in a tcache struct, named as damage
        (last_words,) = [f for f in checked["findings"] if f["kind"] == "abort"]
        assert last_words["found"] == ABORTS[mode]
        assert any(_matches(f, expected, 0) for f in checked["findings"]), checked["findings"]
        return
    first = checked["findings"][0]
    assert (first["kind"], first["severity"], first["address"]) == ("abort", "error", expected["address"]), \
        json.dumps(checked["findings"], indent=1)
    assert f'"{ABORTS[mode]}"' in first["message"] and "fails it: " in first["message"]
    assert first["found"] and first["expected"]


@pytest.mark.parametrize("mode", ["abort_double_free", "abort_realloc_next_size"])
def test_with_symbols_the_arguments_of_free_and_realloc_are_cited(mode, tmp_path):
    """With libc's debug symbols the chunk free() or realloc() was given is read from their frames, and
    cited first."""
    expected, checked, _, _ = _run_all("system", mode, tmp_path, symbols=True)
    first = checked["findings"][0]
    assert first["address"] == expected["address"]
    assert "; argument p of _int_free (frame " in first["message"] or \
        "; argument oldp of _int_realloc (frame " in first["message"]


def test_a_core_s_threads_kept_between_commands_are_its_own(tmp_path):
    """A core's threads are read once and kept for the next command (with symbols, malloc's arguments are evaluated
    in the crashing thread's frames): a second `check` says what the first said, and another core opened in the
    same gdb (`core-file`) is read afresh, its findings those a gdb of its own gives."""
    first, second = corruption("system", "abort_double_free"), corruption("system", "abort_realloc_next_size")
    assert first.exe == second.exe
    out = {name: tmp_path / f"{name}.json" for name in ("once", "again", "other", "alone")}
    settings = glibc("system").gdb_settings(True)
    run_gdb([str(first.exe), str(first.core)],
            [f"heapwalk check --json {out['once']}", f"heapwalk check --json {out['again']}",
             f"core-file {second.core}", f"heapwalk check --json {out['other']}"], iex=settings, timeout=120)
    run_gdb([str(second.exe), str(second.core)], [f"heapwalk check --json {out['alone']}"], iex=settings)
    found = {name: json.loads(path.read_text()) for name, path in out.items()}
    assert found["once"] == found["again"] and found["other"] == found["alone"]
    assert "argument p of _int_free" in found["once"]["findings"][0]["message"]
    assert "argument oldp of _int_realloc" in found["other"]["findings"][0]["message"]


def test_a_crash_core_names_no_chunk_that_passes_the_check(tmp_path):
    """A double free into the unsorted bin: of the chunks the crashing thread points at, only the one whose
    next chunk says it is free is named; free chunks the stack also holds (tcache entries) are not."""
    _, checked, _, _ = _run_all("system", "abort_double_free", tmp_path)
    aborts = [f for f in checked["findings"] if f["kind"] == "abort"]
    assert len(aborts) == 1 and "has PREV_INUSE clear" in aborts[0]["message"]
    assert not [f for f in checked["findings"] if f["kind"] == "crash_pointer"]


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


CLEAN = [pytest.param(g, name, id=f"{name}-{g}") for i, name in enumerate(harness.REPRODUCERS) for g in rotating(i)]


@pytest.mark.parametrize("glibc_name,name", CLEAN)
def test_check_finds_nothing_on_every_clean_core(glibc_name, name, json_of, tmp_path):
    c = capture(glibc_name, name)
    out = tmp_path / "check.json"
    result = run_gdb([str(c.exe), str(c.core)], [f"heapwalk check --json {out}"],
                     iex=glibc(glibc_name).gdb_settings(False))
    document = json.loads(out.read_text())
    assert document["clean"] and document["errors"] == 0, result.stdout
    assert document["checked"]["chunks"] > 0 and result.returncode == 0


@pytest.mark.parametrize("mode", [m for m in harness.CORRUPTIONS if _applies("system", m)])
def test_the_command_line_names_each_corruption_where_gdb_does(mode, tmp_path):
    """'heapwalk report CORE EXE --check --no-symbols --json FILE' (the CLI, pygdbmi driving gdb): the same
    finding at the same address as the gdb command, in the text and in the JSON, and the exit status says so."""
    import subprocess
    import sys
    cap = corruption("system", mode)
    out = tmp_path / "report.json"
    result = subprocess.run([str(Path(sys.executable).with_name("heapwalk")), "report", str(cap.core), str(cap.exe),
                             "--check", "--no-symbols", "--json", str(out)], capture_output=True, text=True, timeout=300)
    expected = json.loads((cap.directory / "expected.json").read_text())
    doc = json.loads(out.read_text())
    main_arena = next(a["address"] for a in doc["arenas"] if a["kind"] == "main")
    hits = [f for f in doc["findings"] if _matches(f, expected, main_arena)]
    assert hits, f"expected {expected}, got:\n" + "\n".join(json.dumps(f) for f in doc["findings"])
    assert f"{expected['kind']:20} {hits[0]['address']:#x}" in result.stdout, result.stdout
    assert result.returncode == (0 if mode == "mutex" else 1), result.stderr


def test_the_command_line_s_json_holds_every_finding_that_sets_its_exit_status(tmp_path):
    """'heapwalk report CORE --check --json FILE' exits 1 on a damaged heap, and FILE holds the error that says
    why, a finding only the check makes (a tcache entry inside a free chunk), with the check's verdict."""
    import subprocess
    import sys
    cap = corruption("system", "tcache_in_free")
    out = tmp_path / "report.json"
    result = subprocess.run([str(Path(sys.executable).with_name("heapwalk")), "report", str(cap.core), str(cap.exe),
                             "--check", "--no-symbols", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    expected = json.loads((cap.directory / "expected.json").read_text())
    assert any(f["kind"] == expected["kind"] and f["address"] == expected["address"] and f["severity"] == "error"
               for f in doc["findings"])
    assert doc["check"]["clean"] is False and not list(tmp_path.glob("*.check"))
