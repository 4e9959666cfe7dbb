"""Every thread by its name: a capture records each thread's name (/proc's comm) in its core, and the thread
tables, their JSON and the page show it; jemalloc's own background threads are named as jemalloc's.  A core
gdb wrote holds no names, and its tables keep their columns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_gdb

pytestmark = pytest.mark.live

JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
CLI = Path(sys.executable).with_name("heapwalk")


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("named") / "named_threads"
    subprocess.run(["gcc", "-O1", "-pthread", str(ROOT / "cores" / "glibc" / "named_threads.c"), "-o", str(exe)], check=True)
    return exe


def _captured(program: Path, out: Path, env: dict[str, str]) -> tuple[str, dict, str]:
    """The text of 'heapwalk threads' on a capture of PROGRAM run with ENV, the capture's report.json, and
    what the capture printed."""
    proc = subprocess.Popen([str(program)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline() == "ready\n"
        result = subprocess.run([str(CLI), "capture", str(proc.pid), "--no-leaks", "--out", str(out)],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
    finally:
        proc.kill()
        proc.wait()
    shown = run_gdb([str(program), str(out / "core")], ["heapwalk threads"])
    assert shown.returncode == 0, shown.stderr
    return shown.stdout, json.loads((out / "report.json").read_text()), result.stdout


def test_a_capture_names_every_thread(program, tmp_path):
    text, doc, said = _captured(program, tmp_path / "glibc", {})
    assert "malloc's own state (mp_): " in said
    names = sorted(t["name"] for t in doc["threads"])
    assert names == ["named_threads", "worker-0", "worker-1", "worker-2"]
    assert "| name " in text and "worker-1" in text
    recorded = json.loads((tmp_path / "glibc" / "capture.json").read_text())["thread_names"]
    assert sorted(recorded.values()) == names


def test_jemallocs_background_threads_are_named_as_its_own(program, tmp_path):
    text, doc, said = _captured(program, tmp_path / "jemalloc", {"LD_PRELOAD": str(JEMALLOC),
                                                                "MALLOC_CONF": "background_thread:true"})
    # the capture says jemalloc's options beside the environment that set them
    assert "MALLOC_CONF=background_thread:true" in said and "jemalloc's options: " in said
    assert "background_thread:true" in said.split("jemalloc's options: ")[1]
    threads = doc["jemalloc"]["threads"]
    own = [t for t in threads if t["allocators_own"]]
    assert own and all(t["name"] == "jemalloc_bg_thd" and t["arena"] is None for t in own)
    assert {t["name"] for t in threads if not t["allocators_own"]} == {"named_threads", "worker-0", "worker-1",
                                                                        "worker-2"}
    assert text.count("jemalloc's background thread") == len(own)


def test_a_core_gdb_wrote_has_no_name_column(program, tmp_path):
    proc = subprocess.Popen([str(program)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        core = tmp_path / "core"
        subprocess.run(["gdb", "-nx", "-batch", "-p", str(proc.pid), "-ex", f"gcore {core}"], capture_output=True,
                       timeout=120, check=True)
    finally:
        proc.kill()
        proc.wait()
    shown = run_gdb([str(program), str(core)], ["heapwalk threads"])
    assert shown.returncode == 0 and "| name " not in shown.stdout and "worker-" not in shown.stdout
