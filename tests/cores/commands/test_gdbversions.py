"""What differs between the gdb versions heapwalk runs on (10 to 18), checked on this machine's gdb by making
it look like the others: gdb 10 and 11 have no `Inferior.connection`, so a core is told from a process by what
'info target' says; gdb 18 under MI returns MI records to `gdb.execute(..., to_string=True)`, which heapwalk
reads as the console's text (tests/unit/gdb/test_mitext.py).  The same report either way."""

from __future__ import annotations

import json

import pytest

from conftest import capture, run_gdb
from conftest import heapwalk
from services import running

pytestmark = pytest.mark.cores

#: makes gdb's Python look like gdb 10/11's: an inferior without the `connection` attribute
GDB10 = """python
import gdb
class _Gdb10Inferior:
    def __init__(self, inferior):
        self._inferior = inferior
    def __getattr__(self, name):
        if name == "connection":
            raise AttributeError(name)
        return getattr(self._inferior, name)
_real_selected_inferior = gdb.selected_inferior
gdb.selected_inferior = lambda: _Gdb10Inferior(_real_selected_inferior())
end
"""

#: makes gdb.execute(..., to_string=True) answer as gdb 18 does under MI: console output as ~"..." records
GDB18_MI = r'''python
import gdb
_real_execute = gdb.execute
def _mi_execute(command, from_tty=False, to_string=False):
    text = _real_execute(command, from_tty, to_string)
    if not to_string or not text:
        return text
    records = []
    for line in text.splitlines(True):
        body = line.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        records.append('~"%s"' % body)
    return "\n".join(records) + "\n^done\n"
gdb.execute = _mi_execute
end
'''


def _report(target: list[str], tmp_path, name: str, preamble: str = "") -> dict:
    script = tmp_path / f"{name}.gdb"
    script.write_text(preamble)
    out = tmp_path / f"{name}.json"
    result = run_gdb(target, [f"source {script}", f"heapwalk report --json {out}"])
    assert "internal error" not in result.stdout + result.stderr and "Traceback" not in result.stderr, \
        result.stdout + result.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", ["thread_arenas", "mmapped"])
def test_a_core_under_gdb_10_and_18_reports_as_under_this_gdb(name, tmp_path):
    cap = capture("system", name)
    target = [str(cap.exe), str(cap.core)]
    today = _report(target, tmp_path, "today")
    assert today["target"].startswith("core file ") and len(today["arenas"]) > 1 or name == "mmapped"
    assert _report(target, tmp_path, "gdb10", GDB10) == today
    assert _report(target, tmp_path, "gdb18", GDB18_MI) == today


def test_a_live_process_under_gdb_10_is_a_process(tmp_path):
    with running(tmp_path, "grow") as (proc, _):
        doc = _report(["-p", str(proc.pid)], tmp_path, "gdb10", GDB10)
    assert doc["target"].startswith(f"process {proc.pid}") and len(doc["arenas"]) == 3


#: makes gdb's Python say it is gdb 9.2 (before gdbinit loads heapwalk)
GDB9 = "python import gdb; gdb.VERSION = '9.2'"


def test_a_gdb_older_than_10_is_refused_in_one_line_with_a_failing_status():
    cap = capture("system", "thread_arenas")
    result = run_gdb([str(cap.exe), str(cap.core)], ["heapwalk report"], iex=[GDB9])
    out = result.stdout + result.stderr
    line = "heapwalk: gdb 9.2 is older than gdb 10, the oldest heapwalk is tested on"
    said = [text for text in out.splitlines() if text.startswith("heapwalk") or "in use" in text]
    assert len(said) == 2 and all(text.startswith(line) for text in said), out   # when loaded, and the command
    assert "Traceback" not in out and result.returncode != 0


def test_the_command_line_in_a_gdb_older_than_10_exits_2_with_that_line(tmp_path):
    cap = capture("system", "thread_arenas")
    wrapper = tmp_path / "gdb9"
    wrapper.write_text(f'#!/bin/sh\nexec gdb -iex "{GDB9}" "$@"\n')
    wrapper.chmod(0o755)
    result = heapwalk("report", str(cap.core), str(cap.exe), "--gdb", str(wrapper))
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        "heapwalk: gdb 9.2 is older than gdb 10, the oldest heapwalk is tested on; run it in gdb 10 or later "
        "(a core or a capture can be opened on another machine: docs/platforms.md)"], result.stderr
