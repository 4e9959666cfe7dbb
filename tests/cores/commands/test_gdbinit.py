"""Loading heapwalk into gdb's own Python, and the one-line messages users see."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import GDBINIT, ROOT, run_gdb

pytestmark = pytest.mark.cores


def test_sourcing_gdbinit_from_another_directory_registers_the_commands(tmp_path):
    result = subprocess.run(["gdb", "-nx", "-batch", "-q", "-ex", f"source {GDBINIT}", "-ex", "help heapwalk"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert "heapwalk arenas" in result.stdout and "heapwalk tcache" in result.stdout
    assert result.stderr.strip() == ""


def test_each_subcommand_has_its_own_help():
    result = run_gdb([], ["help heapwalk bins", "help heapwalk tcache", "help heapwalk arenas"])
    assert "--arena ADDR" in result.stdout and "--thread N" in result.stdout and "--json FILE" in result.stdout


def test_a_missing_dependency_is_named_in_one_line():
    result = run_gdb([], [], iex=["python import sys; sys.modules['rich'] = None"],
                     env={"HEAPWALK_VENV": "/nonexistent"})
    lines = [line for line in result.stdout.splitlines() if line.startswith("heapwalk:")]
    assert len(lines) == 1 and "cannot import rich" in lines[0] and str(ROOT) in lines[0]
    assert "Traceback" not in result.stdout + result.stderr


def test_no_target_is_one_clear_error():
    result = run_gdb([], ["heapwalk arenas"])
    assert "no process or core file" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_bad_arguments_are_one_clear_error(cores):
    c = cores["bins"]
    result = run_gdb([str(c.exe), str(c.core)], ["heapwalk bins --arena 0x1234", "heapwalk bins nosuchkind"])
    assert "no arena at 0x1234" in result.stderr
    assert "invalid choice" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_commands_restore_the_selected_thread(cores):
    c = cores["thread_arenas"]
    result = run_gdb([str(c.exe), str(c.core)], ["thread 3", "heapwalk tcache", "thread"])
    assert "Current thread is 3" in result.stdout.splitlines()[-1]


def test_overrides_are_used_and_reported(cores, tmp_path):
    c = cores["bins"]
    out = tmp_path / "o.json"
    plain = tmp_path / "p.json"
    run_gdb([str(c.exe), str(c.core)], [f"heapwalk arenas --json {plain}"])
    main_arena = json.loads(plain.read_text())["main_arena"]
    run_gdb([str(c.exe), str(c.core)], ["set heapwalk glibc-version 2.36", f"set heapwalk main-arena {main_arena:#x}",
                                        f"heapwalk arenas --json {out}"])
    doc = json.loads(out.read_text())
    assert doc["discovery"]["glibc_version"]["found_by"] == "set heapwalk glibc-version"
    assert doc["discovery"]["main_arena"]["found_by"] == "set heapwalk main-arena"
    assert doc["arenas"] == json.loads(plain.read_text())["arenas"]


def test_a_glibc_outside_the_known_layouts_is_one_line_and_no_report(cores):
    """A glibc newer (or older) than any layout heapwalk knows: one line says so, and no report that reads as
    normal is printed (here forced with 'set heapwalk glibc-version', as a future glibc would be found)."""
    c = cores["bins"]
    for version in ("2.50", "2.16"):
        result = run_gdb([str(c.exe), str(c.core)], [f"set heapwalk glibc-version {version}", "heapwalk report"])
        errors = [line for line in result.stderr.splitlines() if "no malloc layout" in line]
        assert errors == [f"no malloc layout for glibc {version} (known: 2.17 to 2.43)"], result.stderr
        assert "where the memory is" not in result.stdout and "Traceback" not in result.stdout + result.stderr
