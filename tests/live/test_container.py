"""Processes in containers, captured from this machine: each runs in a mount and a pid namespace of its own, its
root made by pivot_root (tests/tools/container.py), so that its files' paths in /proc/PID/maps name other files
here, or none.  On an Alpine-like root (trixie's musl 1.2.5 as /lib/ld-musl-x86_64.so.1, the program linked to
it there) and on Debian trixie's root (glibc 2.41, where this machine has another glibc): `heapwalk capture`
reads the files through /proc/PID/root, says the ids the process and its threads have in the container, and
reports what the program wrote (musl: its ledger; glibc: malloc_info's XML, to the byte); gcore's core of the
same instant gives the same report, and gdb attached from here the same; the captured core read later against
files that are not the ones the process mapped says so, naming the file, and takes nothing from it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import chroots
import harness
import muslbuilds
from conftest import BINDIR, ROOT, SYSROOTS, run_gdb
from services import process_state

pytestmark = pytest.mark.live

HEAPWALK = Path(sys.executable).parent / "heapwalk"
CONTAINER = ROOT / "tests" / "tools" / "container.py"


def _started(root: Path, program: str, out: str) -> tuple[subprocess.Popen, int]:
    """PROGRAM run in ROOT as a container, to its snapshot (it stops itself): (the launcher, its pid here)."""
    launcher = subprocess.Popen([sys.executable, str(CONTAINER), str(root), program, out])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for pid in _descendants(launcher.pid):
            if process_state(pid) == "T":
                return launcher, pid
        if launcher.poll() is not None:
            raise AssertionError(f"the container ended with {launcher.returncode} before its snapshot")
        time.sleep(0.1)
    launcher.kill()
    raise AssertionError("the program in the container did not reach its snapshot")


def _descendants(pid: int) -> list[int]:
    out = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split() if Path(f"/proc/{pid}").exists() \
            else []:
        out += [int(child), *_descendants(int(child))]
    return out


def _ended(launcher: subprocess.Popen, pid: int) -> None:
    for p in (pid, *_descendants(launcher.pid)):
        try:
            os.kill(p, 9)
        except ProcessLookupError:
            pass
    launcher.wait(timeout=60)


def _capture(pid: int, folder: Path) -> tuple[str, dict]:
    result = subprocess.run([str(HEAPWALK), "capture", str(pid), "--out", str(folder), "--no-leaks"],
                            capture_output=True, text=True, timeout=600)
    said = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in said, said
    return " ".join(said.split()), json.loads((folder / "report.json").read_text())


def _gcore_report(pid: int, folder: Path, *extra: str) -> dict:
    """gdb's gcore core of PID, reported with its root as the sysroot."""
    subprocess.run(["gcore", "-o", str(folder / "gcore"), str(pid)], capture_output=True, check=True, timeout=600)
    out = folder / "gcore.json"
    result = subprocess.run([str(HEAPWALK), "report", str(folder / f"gcore.{pid}"), "--sysroot", f"/proc/{pid}/root",
                             "--no-leaks", "--json", str(out), *extra], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(out.read_text())


def _same(captured: dict, gcored: dict, key: str) -> None:
    assert captured[key] == gcored[key]
    for a, b in zip(captured["report"]["arenas"], gcored["report"]["arenas"]):
        assert {k: a[k] for k in ("system", "in_use", "free", "overhead")} == \
            {k: b[k] for k in ("system", "in_use", "free", "overhead")}


@pytest.fixture
def alpine(tmp_path):
    """An Alpine-like root: trixie's musl as Alpine's dynamic linker, musl_hold linked to it."""
    musl = muslbuilds.prepare_musl(SYSROOTS, "trixie")
    root = tmp_path / "alpine"
    for folder in ("lib", "app", "out"):
        (root / folder).mkdir(parents=True)
    shutil.copy2(musl.libc, root / muslbuilds.alpine_interp("amd64").lstrip("/"))
    shutil.copy2(muslbuilds.build("musl_hold", BINDIR, musl, "alpine"), root / "app" / "musl_hold")
    return root


def test_a_musl_process_in_a_container_is_captured_through_its_root(alpine, tmp_path):
    launcher, pid = _started(alpine, "/app/musl_hold", "/out")
    try:
        said, doc = _capture(pid, tmp_path / "cap")
        inside = json.loads((tmp_path / "cap" / "capture.json").read_text())["container"]
        gcored = _gcore_report(pid, tmp_path)
        live = run_gdb(["-p", str(pid)], [f"heapwalk report --no-leaks --json {tmp_path / 'live.json'}"])
        assert process_state(pid) == "T"
    finally:
        _ended(launcher, pid)
    assert inside["mount"] and inside["pid"] and inside["pid_inside"] == 2
    assert f"process {pid} runs in a container (mount and pid namespaces of its own): pid 2 there" in said
    assert f"its files read through /proc/{pid}/root" in said
    ledger = {a: s for a, s in json.loads((alpine / "out" / "ledger.json").read_text())["live"]}
    assert doc["musl"]["version"] == "1.2.5"
    assert doc["musl"]["in_use"] == {"allocations": len(ledger), "requested": sum(ledger.values())}
    _same(doc, gcored, "musl")
    assert "Traceback" not in live.stdout + live.stderr
    _same(doc, json.loads((tmp_path / "live.json").read_text()), "musl")     # gdb attached from here


def test_a_core_read_against_files_that_are_not_the_processes_says_so(alpine, tmp_path):
    """The captured core, read with another musl at the path the process's was (bookworm's, as a host with
    Debian's musl has it): a line names the file and both build-ids, the version is not read from it (a
    warning says why), the allocations are still the ledger's; with the container's root, the version too."""
    launcher, pid = _started(alpine, "/app/musl_hold", "/out")
    try:
        _capture(pid, tmp_path / "cap")
    finally:
        _ended(launcher, pid)
    other = tmp_path / "other"
    (other / "lib").mkdir(parents=True)
    shutil.copy2(muslbuilds.prepare_musl(SYSROOTS, "bookworm").libc, other / "lib" / "ld-musl-x86_64.so.1")
    core, out = tmp_path / "cap" / "core", tmp_path / "other.json"
    result = subprocess.run([str(HEAPWALK), "report", str(core), "--sysroot", str(other), "--no-leaks", "--json",
                             str(out)], capture_output=True, text=True, timeout=600)
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0, said
    assert f"{other}/lib/ld-musl-x86_64.so.1 under {other} is not the file the process mapped at " \
        "/lib/ld-musl-x86_64.so.1: its build-id is" in said
    doc = json.loads(out.read_text())
    ledger = json.loads((alpine / "out" / "ledger.json").read_text())["live"]
    assert doc["musl"]["version"] == "" and doc["musl"]["in_use"]["allocations"] == len(ledger)
    assert any("is not the one the process ran" in f["message"] for f in doc["findings"])
    result = subprocess.run([str(HEAPWALK), "report", str(core), "--sysroot", str(alpine), "--no-leaks"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "musl 1.2.5" in result.stdout, result.stdout + result.stderr


def test_a_glibc_process_in_a_debian_container_is_captured_through_its_root(tmp_path):
    """thread_arenas in trixie's root (glibc 2.41; this machine's may be another): the capture decodes trixie's
    glibc, its report gives what malloc_info printed in the container, as gcore's core does."""
    root = chroots.prepare("trixie").path
    work = root / "tmp" / f"heapwalk-container-{os.getpid()}"
    (work / "out").mkdir(parents=True, exist_ok=True)
    try:
        shutil.copy2(harness.build("thread_arenas", BINDIR), work / "thread_arenas")
        inside = "/" + str(work.relative_to(root))
        launcher, pid = _started(root, f"{inside}/thread_arenas", f"{inside}/out")
        try:
            said, doc = _capture(pid, tmp_path / "cap")
            xml = tmp_path / "gcore.xml"
            gcored = _gcore_report(pid, tmp_path, "--xml", str(xml))
        finally:
            _ended(launcher, pid)
        assert "runs in a container" in said and "glibc 2.41" in said, said
        assert xml.read_text() == (work / "out" / "malloc_info.xml").read_text()
        _same(doc, gcored, "glibc")
    finally:
        shutil.rmtree(work, ignore_errors=True)
