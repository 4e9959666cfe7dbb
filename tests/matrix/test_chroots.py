"""heapwalk where production runs: the gdb and Python of Debian 11 (gdb 10.1, Python 3.9), Debian 13 (gdb 16,
Python 3.13) and sid (gdb 18, Python 3.14), each in a chroot (cores/scripts/chroots.py) where heapwalk is set up as
README says.  On reference cores of the matrix (each suite's own glibc), with and without debug symbols, in gdb
and through the command line, the output there is this machine's, byte for byte (text, JSON, XML); and a
program run inside the chroot, captured there with `heapwalk capture`, reports there as its core reports here.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import chroots
from conftest import FULL_MATRIX, GDBINIT, ROOT, SYSROOTS, capture, gdb_command, glibc

pytestmark = pytest.mark.matrix

NAMES = ("bins", "thread_arenas", "mmapped")
OUT = Path("/tmp/heapwalk-matrix")
HOST_CLI = Path(sys.executable).parent / "heapwalk"


@pytest.fixture(scope="module", params=chroots.SUITES)
def chroot(request):
    """A suite's chroot with heapwalk set up and the suite's reference cores copied in: (chroot, venv)."""
    suite = request.param
    c = chroots.prepare(suite)
    venv = c.venv()
    for name in NAMES:
        cap = capture(suite, name)
        program = json.loads((cap.directory / "meta.json").read_text())["program"]
        c.copy_in(cap.directory, cap.exe, Path(program))
    c.copy_in(SYSROOTS / suite)
    return c, venv


def _both(c, venv, args: list[str], out_dir: Path) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """ARGS run on this machine and in the chroot C, each writing its files into OUT_DIR (its own)."""
    for base in (Path("/"), c.path):
        folder = base / str(out_dir).lstrip("/")
        subprocess.run(["rm", "-rf", str(folder)], check=True)
        folder.mkdir(parents=True)
    here = subprocess.run(args, capture_output=True, text=True, timeout=600)
    there = c.run(" ".join(map(shlex.quote, args)), timeout=600, env={"HEAPWALK_VENV": str(venv)})
    return here, there


def heapwalk_output(stdout: str) -> str:
    """What heapwalk printed of gdb's STDOUT: from its first header line on (gdb's own messages before it,
    about threads and the frame, differ from one gdb version to another)."""
    lines = stdout.splitlines(keepends=True)
    first = next((i for i, line in enumerate(lines) if line.startswith(("core file ", "process "))), len(lines))
    return "".join(lines[first:])


def _same_values(doc: dict) -> dict:
    """DOC with how each discovered fact was found left out, its value kept: a newer gdb resolves a TLS
    symbol (tcache, thread_arena) in a core where an older one cannot, and heapwalk then says it used the
    symbol instead of its own reading of libc's code, for the same value."""
    doc = json.loads(json.dumps(doc))
    for fact in (doc.get("discovery") or {}).values():
        if isinstance(fact, dict):
            fact.pop("found_by", None)
    return doc


def _files(base: Path, out_dir: Path) -> dict[str, bytes]:
    folder = base / str(out_dir).lstrip("/")
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_the_chroot_has_the_gdb_and_python_of_its_suite(chroot):
    c, _ = chroot
    versions = c.versions()
    expected = {"bullseye": ("GNU gdb (Debian 10.", "3.9."), "trixie": ("GNU gdb (Debian 16.", "3.13.")}
    if c.suite in expected:
        gdb_version, python = expected[c.suite]
        assert versions["gdb"].startswith(gdb_version) and versions["python"].startswith(python), versions


#: (reproducer, symbols): each reference core with symbols hidden, and one with them too (every pair with
#: HEAPWALK_FULL_MATRIX=1)
THERE = [pytest.param(n, s, id=f"{n}-{'symbols' if s else 'no-symbols'}") for n in NAMES for s in (True, False)
         if FULL_MATRIX or not s or n == "thread_arenas"]


@pytest.mark.parametrize("name,symbols", THERE)
def test_gdb_there_prints_what_gdb_here_prints(chroot, name, symbols):
    c, venv = chroot
    cap = capture(c.suite, name)
    out_dir = OUT / f"{c.suite}-{name}-{symbols}"
    commands = [f"heapwalk report --json {out_dir}/report.json --xml {out_dir}/malloc_info.xml",
                "heapwalk check", "heapwalk threads", f"heapwalk leaks --json {out_dir}/leaks.json"]
    here, there = _both(c, venv, gdb_command([str(cap.exe), str(cap.core)], commands, glibc(c.suite).gdb_settings(symbols)), out_dir)
    assert here.returncode == 0 and "internal error" not in here.stdout + here.stderr, here.stderr[-2000:]
    assert there.returncode == 0, there.stderr[-3000:]
    assert heapwalk_output(here.stdout).startswith("core file ")
    assert heapwalk_output(there.stdout) == heapwalk_output(here.stdout)
    ours, theirs = _files(Path("/"), out_dir), _files(c.path, out_dir)
    assert sorted(theirs) == ["leaks.json", "malloc_info.xml", "report.json"]
    assert theirs["malloc_info.xml"] == ours["malloc_info.xml"]
    for doc in ("report.json", "leaks.json"):
        assert _same_values(json.loads(theirs[doc])) == _same_values(json.loads(ours[doc]))


@pytest.mark.parametrize("name", ["thread_arenas"])
def test_the_command_line_there_prints_what_it_prints_here(chroot, name):
    c, venv = chroot
    cap = capture(c.suite, name)
    out_dir = OUT / f"{c.suite}-cli-{name}"
    # without debug symbols: the chroot has its suite's libc6-dbg installed, this machine has not
    args = [str(HOST_CLI), "report", str(cap.core), str(cap.exe), "--no-symbols", "--json", f"{out_dir}/report.json",
            "--xml", f"{out_dir}/malloc_info.xml"]
    for base in (Path("/"), c.path):
        subprocess.run(["rm", "-rf", str(base / str(out_dir).lstrip("/"))], check=True)
        (base / str(out_dir).lstrip("/")).mkdir(parents=True)
    here = subprocess.run(args, capture_output=True, text=True, timeout=600)
    there = c.run(" ".join(map(shlex.quote, [f"{venv}/bin/heapwalk", *args[1:]])), timeout=600)
    assert here.returncode == 0, here.stderr[-2000:]
    assert there.returncode == 0, there.stderr[-3000:]
    assert there.stdout == here.stdout
    assert _files(c.path, out_dir) == _files(Path("/"), out_dir)


def test_a_program_captured_there_reports_here_as_there(chroot, tmp_path):
    """cores/glibc/grow.c built and run inside the chroot, captured there by its heapwalk; this machine's heapwalk
    reads the core with the chroot as its sysroot and gives the same report (both without debug symbols,
    which only the chroot has)."""
    c, venv = chroot
    work = Path("/tmp/heapwalk-grow")
    (c.path / str(work).lstrip("/")).mkdir(parents=True, exist_ok=True)
    source = ROOT / "cores" / "glibc" / "grow.c"
    script = (f"set -e; cd {work}; rm -rf state snap; mkdir state; gcc -O1 -g -pthread {source} -o grow; "
              "./grow state & pid=$!; for i in $(seq 300); do [ -s state/state ] && break; sleep 0.05; done; "
              f"{venv}/bin/heapwalk capture $pid --out snap --no-leaks --no-symbols > capture.txt; status=$?; "
              "kill $pid; exit $status")
    there = c.run(script, timeout=600)
    assert there.returncode == 0, there.stdout[-2000:] + there.stderr[-2000:]
    folder = c.path / str(work).lstrip("/")
    theirs = json.loads((folder / "snap" / "report.json").read_text())
    here = subprocess.run([str(HOST_CLI), "report", str(folder / "snap" / "core"), str(folder / "grow"), "--sysroot",
                           str(c.path), "--no-leaks", "--no-symbols", "--json", str(tmp_path / "here.json")], capture_output=True,
                          text=True, timeout=600)
    assert here.returncode == 0, here.stderr[-2000:]
    ours = json.loads((tmp_path / "here.json").read_text())
    assert len(theirs["arenas"]) == 3 and "was stopped for" in (folder / "capture.txt").read_text()
    for doc in (ours, theirs):
        doc.pop("target")
    assert ours == theirs


def test_gdb_10_on_a_newer_glibc_decodes_from_memory():
    """gdb 10's BFD cannot read this machine's libc (glibc 2.36's .relr.dyn section): gdb warns and loads no
    symbols from it, and heapwalk decodes the core from memory alone, to the same arenas and report as here."""
    c = chroots.prepare("bullseye")
    venv = c.venv()
    cap = capture("system", "thread_arenas")
    c.copy_in(cap.directory, cap.exe)
    libs = [Path(p) for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2")]
    for lib in libs:              # this machine's libraries, as a sysroot inside, at each path that names them
        for path in {str(lib), os.path.realpath(lib)}:
            dest = c.path / "hostroot" / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-L", str(lib), str(dest)], check=True)
    out = Path("/tmp/heapwalk-matrix/gdb10-glibc236.json")
    args = ["gdb", "-nx", "-batch", "-q", "-iex", "set debug-file-directory /nonexistent", "-x", str(GDBINIT),
            "-ex", f"heapwalk report --json {out}", os.path.abspath(cap.exe), os.path.abspath(cap.core)]
    (c.path / str(out.parent).lstrip("/")).mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    there = c.run(" ".join(map(shlex.quote, args[:4] + ["-iex", "set sysroot /hostroot"] + args[4:])),
                  env={"HEAPWALK_VENV": str(venv)})
    here = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert here.returncode == 0 and there.returncode == 0, there.stderr[-2000:]
    assert "glibc 2.36" in heapwalk_output(there.stdout)
    ours, theirs = json.loads(out.read_text()), json.loads((c.path / str(out).lstrip("/")).read_text())
    assert theirs["arenas"] == ours["arenas"] and theirs["report"] == ours["report"]


def test_paths_with_blanks_and_quotes_reach_gdb_whole(chroot):
    """The command line passes the core, the program and the files it writes to gdb as whole arguments, under
    every gdb (10 to 13 take core-file's argument as it is, 16 on split it like 'file')."""
    c, venv = chroot
    cap = capture(c.suite, "bins")
    odd = Path("/tmp/heapwalk matrix/it's")
    inside = c.path / str(odd).lstrip("/")
    subprocess.run(["rm", "-rf", str(inside.parent)], check=True)
    inside.mkdir(parents=True)
    subprocess.run(["cp", "--sparse=always", str(cap.core), str(inside / "core x")], check=True)
    subprocess.run(["cp", str(cap.exe), str(inside / "prog y")], check=True)
    args = [f"{venv}/bin/heapwalk", "report", str(odd / "core x"), str(odd / "prog y"), "--no-symbols", "--json",
            str(odd / "r 1.json")]
    there = c.run(" ".join(map(shlex.quote, args)), timeout=600)
    assert there.returncode == 0, there.stderr[-3000:]
    assert there.stdout.startswith(f"core file {odd / 'core x'} of {odd / 'prog y'}\n"), there.stdout[:500]
    assert json.loads((inside / "r 1.json").read_text())["arenas"]
