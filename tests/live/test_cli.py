"""The heapwalk command line, end to end: report on cores, capture of a running process, diff of two snapshots,
and each error a user meets, with its message and exit status."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

import harness
import sysroots
from heapwalk.capture import precopy
from heapwalk.inferior.corefile import CoreFile, file_build_id
from browser import Browser, heap_groups, png_pixels
from figures import diff_page_disagreements
from conftest import BINDIR, GLIBCS, HEAPWALK, NO_SYMBOLS, ROOT, capture, corruption, glibc, heapwalk, heapwalk_json
from oracle import malloc_info_view, parse_malloc_info
from services import gcore_report, process_state, running, wait_for_step

pytestmark = pytest.mark.live

@pytest.mark.parametrize("name,symbols", [("thread_arenas", True), ("bins", False), ("many_arenas", True)])
def test_report_on_a_core_equals_the_report_inside_gdb(name, symbols, tmp_path):
    cap = capture("system", name)
    out = tmp_path / "cli.json"
    args = ["report", str(cap.core), "--json", str(out)] + ([] if symbols else ["--no-symbols"])
    result = heapwalk(*args)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    exe = cap.exe.resolve()
    assert f"executable from the core: {exe}" in result.stderr   # EXE was not given: found in the core
    in_gdb = heapwalk_json([str(exe), str(cap.core)], tmp_path, iex=[] if symbols else [NO_SYMBOLS],
                           before=[])
    cli = json.loads(out.read_text())
    assert cli["report"] and cli == {**in_gdb, "report": cli["report"]}
    # the text is gdb's own: the same report, line for line
    gdb_text = subprocess.run(["gdb", "-nx", "-batch", "-q", "-x", str(ROOT / "gdbinit"), *(
        [] if symbols else ["-iex", NO_SYMBOLS]), "-ex", "heapwalk report", str(exe), str(cap.core)],
        capture_output=True, text=True, timeout=300).stdout
    start = gdb_text.index("core file ")
    assert result.stdout.strip() == gdb_text[start:].strip()


def test_report_with_the_executable_and_xml(tmp_path):
    cap = capture("system", "bins")
    xml = tmp_path / "mi.xml"
    result = heapwalk("report", str(cap.core), str(cap.exe), "--xml", str(xml))
    assert result.returncode == 0, result.stderr
    assert xml.read_text().startswith("<malloc version=")


@pytest.fixture(scope="module")
def core_from_elsewhere(tmp_path_factory):
    """A core of the bins reproducer run under trixie's glibc from a folder that is then deleted, as a core
    from a production machine arrives: its libraries exist here only in copies (trixie's sysroot)."""
    tmp = tmp_path_factory.mktemp("elsewhere")
    trixie = glibc("trixie").sysroot
    machine = tmp / "production"
    libdir = machine / "usr/lib" / sysroots.MULTIARCH
    libdir.mkdir(parents=True)
    for lib in trixie.libdir.glob("*.so*"):
        shutil.copy2(lib, libdir / lib.name)
    cap = harness.capture("bins", tmp / "captures", BINDIR, sysroot=sysroots.Sysroot("trixie", machine))
    shutil.rmtree(machine)
    return cap, machine, trixie


def _copy_of_the_machine(machine: Path, trixie: sysroots.Sysroot, root: Path) -> Path:
    """ROOT laid out as the production machine's /: its libraries at the paths the core records, and the
    debug files of its libc package under usr/lib/debug."""
    libdir = root / str(machine).lstrip("/") / "usr/lib" / sysroots.MULTIARCH
    libdir.mkdir(parents=True)
    for lib in trixie.libdir.glob("*.so*"):
        shutil.copy2(lib, libdir / lib.name)
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/debug").symlink_to(trixie.debug_dir)
    return root


def _version_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("glibc "))


def test_sysroot_opens_a_core_whose_libraries_are_only_in_a_copy(core_from_elsewhere, tmp_path):
    cap, machine, trixie = core_from_elsewhere
    version = trixie.version
    # without the copy: the recorded program and libc are nowhere here, so only memory speaks
    bare = heapwalk("report", str(cap.core))
    assert bare.returncode == 0, bare.stderr
    assert "the core's executable is not known" in bare.stderr and "not on this machine" in bare.stderr
    assert "version: not determined" in _version_line(bare.stdout)

    root = _copy_of_the_machine(machine, trixie, tmp_path / "root")
    out = tmp_path / "cli.json"
    result = heapwalk("report", str(cap.core), "--sysroot", str(root), "--json", str(out))
    assert result.returncode == 0, result.stderr
    exe = root / str(cap.exe).lstrip("/")
    assert f"executable from the core: {exe}" in result.stderr   # the program, found in the copy
    assert _version_line(result.stdout) == f"glibc {version} (version: symbol __libc_version)"
    cli = json.loads(out.read_text())
    assert malloc_info_view(cli) == parse_malloc_info(cap.malloc_info)
    in_gdb = heapwalk_json([str(exe), str(cap.core)], tmp_path, iex=[
        f"set sysroot {root}", f"set debug-file-directory {root / 'usr/lib/debug'}"])
    assert cli == {**in_gdb, "report": cli["report"]}

    # no debug symbols: libc's own file, read from the copy, still names the version
    stripped = heapwalk("report", str(cap.core), "--sysroot", str(root), "--no-symbols")
    assert stripped.returncode == 0, stripped.stderr
    assert _version_line(stripped.stdout).startswith(f"glibc {version} (version: banner in libc's read-only data")


def test_sysroot_with_the_libraries_in_one_folder(core_from_elsewhere, tmp_path):
    """The libraries copied into DIR/lib/x86_64-linux-gnu, not under the paths the core records, and the
    program given: found by name."""
    cap, _, trixie = core_from_elsewhere
    flat = tmp_path / "flat"
    shutil.copytree(trixie.libdir, flat / "lib" / sysroots.MULTIARCH, ignore=shutil.ignore_patterns("gconv"))
    out = tmp_path / "cli.json"
    result = heapwalk("report", str(cap.core), str(flat / "lib" / sysroots.MULTIARCH / trixie.ld_so.name),
                      "--sysroot", str(flat), "--no-symbols", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert _version_line(result.stdout).startswith(f"glibc {trixie.version} (version: banner")
    assert malloc_info_view(json.loads(out.read_text())) == parse_malloc_info(cap.malloc_info)


def test_a_libc_of_another_build_is_named_and_not_trusted(core_from_elsewhere, tmp_path):
    """The copy holds the system's libc where the process ran trixie's (a core read on a machine with another
    glibc): its symbols would misplace main_arena, so heapwalk says so and decodes from memory."""
    cap, machine, trixie = core_from_elsewhere
    root = _copy_of_the_machine(machine, trixie, tmp_path / "root")
    system_libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
    assert file_build_id(system_libc) != file_build_id(trixie.libdir / "libc.so.6")
    shutil.copy2(system_libc, root / str(machine).lstrip("/") / "usr/lib" / sysroots.MULTIARCH / "libc.so.6")
    out = tmp_path / "cli.json"
    result = heapwalk("report", str(cap.core), "--sysroot", str(root), "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "is not the one the process ran" in result.stdout and "Traceback" not in result.stdout
    assert "version: not determined" in _version_line(result.stdout)
    assert malloc_info_view(json.loads(out.read_text())) == parse_malloc_info(cap.malloc_info)


def test_sysroot_that_does_not_exist(core_from_elsewhere, tmp_path):
    cap, _, _ = core_from_elsewhere
    result = heapwalk("report", str(cap.core), "--sysroot", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"heapwalk: no such sysroot folder: {tmp_path / 'nowhere'}"


def test_report_check_exits_1_on_a_damaged_heap():
    cap = corruption("system", "double_free")
    damaged = heapwalk("report", str(cap.core), str(cap.exe), "--check")
    assert damaged.returncode == 1, damaged.stderr
    assert "heap is damaged" in damaged.stderr
    assert "heap DAMAGED: 4 error(s)" in damaged.stdout and "double_free          0x" in damaged.stdout
    clean = heapwalk("report", str(capture("system", "bins").core), "--check")
    assert clean.returncode == 0, clean.stderr


def test_capture_writes_a_core_and_a_report_and_leaves_the_process_running(tmp_path):
    with running(tmp_path, "grow") as (proc, state_dir):
        out = tmp_path / "snap"
        result = heapwalk("capture", str(proc.pid), "--out", str(out))
        assert result.returncode == 0, result.stderr
        assert (out / "core").stat().st_size > 0 and json.loads((out / "report.json").read_text())["report"]
        record = json.loads((out / "capture.json").read_text())
        assert record["pid"] == proc.pid and record["threads"] == 3 and record["stopped_seconds"] > 0
        assert any(m["rss"] > 0 for m in record["smaps"]) and record["resident_runs"]
        assert f"process {proc.pid} was stopped for" in result.stdout and "RSS" in result.stdout
        # copied first as it ran where the kernel tracks the pages it writes (tests/vm/test_precopy.py), else one
        # stop for the whole read, and the capture says why
        reason = precopy.untracked_reason()
        if reason is None:
            assert record["precopy"]["rounds"] and "what it wrote while heapwalk copied its memory" in result.stdout
        else:
            assert record["precopy"] is None and f"(no copy first while it ran): {reason}" in result.stdout
        # still running, and still doing its work
        assert proc.poll() is None and process_state(proc.pid) in "SR"
        proc.send_signal(signal.SIGUSR1)
        wait_for_step(state_dir, 1)
        # the report of the core is the report of that core in gdb
        meta_exe = BINDIR / "grow"
        assert json.loads((out / "report.json").read_text())["arenas"] == \
            heapwalk_json([str(meta_exe), str(out / "core")], tmp_path)["arenas"]


def test_capture_writes_only_what_holds_anything_and_gives_gcores_report(tmp_path):
    """The default capture stops the process with ptrace and writes only the memory that holds anything: its
    core opens in gdb with exactly the report of gcore's whole core of the same moment (grow's threads are
    idle), takes far less disk, and the pause is short."""
    with running(tmp_path, "grow") as (proc, _):
        ours, full = tmp_path / "ours", tmp_path / "full"
        result = heapwalk("capture", str(proc.pid), "--out", str(ours))
        assert result.returncode == 0, result.stderr
        assert heapwalk("capture", str(proc.pid), "--full", "--out", str(full)).returncode == 0
        b = gcore_report(proc.pid, tmp_path / "gcore", ours / "capture.json")
        assert proc.poll() is None and process_state(proc.pid) in "SR"
        smaps = json.loads((ours / "capture.json").read_text())["smaps"]
    record = json.loads((ours / "capture.json").read_text())
    assert record["core_writer"] == "heapwalk" and "while heapwalk read its memory" in result.stdout
    a, c = (json.loads((d / "report.json").read_text()) for d in (ours, full))
    limits = [doc["report"].pop("arena_limit") for doc in (a, b, c)]
    # which pages were resident: from heapwalk's core, and from what the capture read beside gcore's
    assert [doc["report"].pop("residency") for doc in (a, b, c)] == [
        "the page map the capture recorded in its core", "the page map the capture recorded in capture.json",
        "the page map the capture recorded in its core"]
    # the same RSS by owner from heapwalk's cores (--full's too) and from gcore's with the capture's record,
    # summing to RSS (a capture maps no page of the process in: not even the vDSO's)
    owners = [doc["report"].pop("rss_by_owner") for doc in (a, b, c)]
    assert {**owners[0], "source": None} == {**owners[1], "source": None} == {**owners[2], "source": None}
    assert owners[0]["total"] == sum(m["rss"] for m in smaps)
    said = [[s for s in doc["report"]["verdict"] if s.startswith("The allocators' heaps hold")] for doc in (a, b, c)]
    assert said[0] == said[1] and len(said[0]) == 1
    for doc in (a, b, c):
        doc.pop("target")
        doc["report"]["verdict"] = [s for s in doc["report"]["verdict"] if not s.startswith("The allocators' heaps")]
    assert a == b == c
    assert all(r["rss"] > 0 and r["free_resident"] is not None for r in a["report"]["arenas"])
    # the page beside each: its heap maps mark the resident pages, each arena's adding up to its RSS
    for folder, doc in ((ours, a), (full, c)):
        resident: dict[int, int] = {}
        for group in heap_groups((folder / "report.html").read_text()):
            band = sum(int(r["data-bytes"]) for r in group["rects"] if r.get("class") == "resident")
            resident[int(group["data-arena"])] = resident.get(int(group["data-arena"]), 0) + band
        assert resident == {r["number"]: r["rss"] for r in doc["report"]["arenas"]}
    # the CPU count, which a core does not hold, comes with heapwalk's core: the arena limit is known
    cpus = os.cpu_count()
    assert limits[0] == limits[2] and limits[0].startswith(f"{8 * cpus} (the default: 8 x {cpus} CPUs online)") \
        and "3 made" in limits[0]
    assert "the core does not record the CPU count" in limits[1] and f"limit {8 * cpus} (" in result.stdout
    resident = sum(m["rss"] for m in smaps)
    on_disk = (ours / "core").stat().st_blocks * 512
    assert on_disk <= 1.2 * resident + (4 << 20), (on_disk, resident)
    assert on_disk * 10 < (tmp_path / "gcore" / f"core.{proc.pid}").stat().st_blocks * 512
    assert record["core_bytes_written"] <= on_disk and record["stopped_seconds"] < 2
    # --full holds the files' pages too: the program's code is in its core, not in the default one
    exe_text = next(m for m in CoreFile(full / "core").file_mappings() if m.path.endswith("/grow") and m.offset)
    with open(exe_text.path, "rb") as f:
        f.seek(exe_text.offset)
        code = f.read(64)
    assert CoreFile(full / "core").read(exe_text.start, 64) == code
    with pytest.raises(LookupError):
        CoreFile(ours / "core").read(exe_text.start, 64)


def test_capture_live_reads_the_process_without_a_core(tmp_path):
    with running(tmp_path, "grow") as (proc, _):
        out = tmp_path / "live"
        result = heapwalk("capture", str(proc.pid), "--live", "--out", str(out))
        assert result.returncode == 0, result.stderr
        assert not (out / "core").exists() and json.loads((out / "report.json").read_text())["target"].startswith(
            "process ")
        assert proc.poll() is None and process_state(proc.pid) in "SR"
    # the stop is announced, with its estimate, before it starts; and said, measured, after it
    first = result.stdout.splitlines()[0]
    assert first.startswith(f"heapwalk: --live keeps process {proc.pid} stopped while gdb attaches and the whole "
                            "report runs: about ") and " shared objects and " in first
    record = json.loads((out / "capture.json").read_text())
    assert f"about {record['live_estimate_seconds']:.1f} s" in first
    assert f"was stopped for {record['stopped_seconds']:.2f} s while heapwalk read it live" in result.stdout


def _traced(pid: int) -> bool:
    """Whether the main thread of PID has a tracer."""
    return "TracerPid:\t0\n" not in Path(f"/proc/{pid}/status").read_text()


def _no_watcher(pid: int) -> None:
    """Waits until no watcher (heapwalk.capture.guard) of PID runs."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        watching = []
        for entry in Path("/proc").iterdir():
            try:
                watching.append((entry / "cmdline").read_bytes().split(b"\0"))
            except OSError:
                continue
        if not any(b"heapwalk.capture.guard" in argv and str(pid).encode() in argv for argv in watching):
            return
        time.sleep(0.05)
    raise AssertionError(f"a watcher of {pid} still runs after 60 s")


def test_capture_live_killed_as_its_gdb_attaches_leaves_the_process_running(tmp_path):
    """gdb's attach queues a SIGSTOP on each thread and takes it back as each stops: a capture killed in that
    moment (7 kills in 10 before heapwalk.capture.guard) left it queued, and the process stopped for good.
    Each round kills the command line and its gdb (their process group) the moment the process has a tracer;
    and a process found stopped is left stopped, and said so."""
    with running(tmp_path, "grow") as (proc, _):
        for round_ in range(6):
            killed = subprocess.Popen([str(HEAPWALK), "capture", str(proc.pid),
                                       "--live", "--no-leaks", "--out", str(tmp_path / f"k{round_}")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + 60
            while not _traced(proc.pid) and killed.poll() is None and time.monotonic() < deadline:
                pass
            os.killpg(killed.pid, signal.SIGKILL)
            killed.wait()
            settled = time.monotonic() + 10
            while process_state(proc.pid) not in "SR" and time.monotonic() < settled:
                time.sleep(0.02)
            assert process_state(proc.pid) in "SR", f"round {round_}: left in state {process_state(proc.pid)}"
        _no_watcher(proc.pid)            # a killed capture's watcher looks for a stop for half a second more
        os.kill(proc.pid, signal.SIGSTOP)
        result = heapwalk("capture", str(proc.pid), "--live", "--no-leaks", "--out", str(tmp_path / "found"))
        assert result.returncode == 0, result.stderr
        assert "; it was stopped before the capture and is left stopped" in result.stdout
        assert process_state(proc.pid) == "T"
        os.kill(proc.pid, signal.SIGCONT)


#: an idle CPython with a few modules loaded and live objects, that says when it is ready
IDLE_PYTHON = ("import json, asyncio, http.server, decimal, sqlite3, signal, sys\n"
               "live = [{'n': i, 's': str(i)} for i in range(20000)]\n"
               "print('ready', flush=True)\n"
               "signal.pause()\n")


def test_an_idle_cpython_leaks_nothing(tmp_path):
    """A capture of the system's python3 at idle (docs/leaks.md): the report's leak scan reaches every chunk
    in use from its roots (module dicts, interpreter state, pymalloc's arenas), and its verdict says so."""
    proc = subprocess.Popen(["/usr/bin/python3", "-c", IDLE_PYTHON], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        result = heapwalk("capture", str(proc.pid), "--out", str(tmp_path / "py"))
        assert result.returncode == 0, result.stderr
    finally:
        proc.kill()
        proc.wait()
    rep = json.loads((tmp_path / "py" / "report.json").read_text())["report"]
    assert rep["leaks"]["in_use_count"] > 1000 and rep["leaks"]["unread_bytes"] == 0
    assert (rep["leaks"]["leaked_count"], rep["leaks"]["leaked_bytes"]) == (0, 0)
    assert "The leak scan reached every chunk in use from the program's roots: nothing leaked." in rep["verdict"]
    assert "in-use chunks by size" in result.stdout


def test_diff_of_two_snapshots_names_the_arena_that_grew(tmp_path):
    with running(tmp_path, "grow") as (proc, state_dir):
        assert heapwalk("capture", str(proc.pid), "--out", str(tmp_path / "a")).returncode == 0
        for step in (1, 2, 3):
            proc.send_signal(signal.SIGUSR1)
            _, grower, steady = wait_for_step(state_dir, step)
        assert heapwalk("capture", str(proc.pid), "--out", str(tmp_path / "b")).returncode == 0
    b = json.loads((tmp_path / "b" / "report.json").read_text())
    arena_of = {t["lwp"]: t["arena"] for t in b["threads"]}
    number_of = {a["address"]: a["number"] for a in b["arenas"]}
    grower_arena, steady_arena = number_of[arena_of[grower]], number_of[arena_of[steady]]
    # JSON against a core: both kinds of snapshot work
    result = heapwalk("diff", str(tmp_path / "a" / "report.json"), str(tmp_path / "b" / "core"),
                      "--json", str(tmp_path / "diff.json"), "--html", str(tmp_path / "diff.html"))
    assert result.returncode == 0, result.stderr
    d = json.loads((tmp_path / "diff.json").read_text())
    assert d["grew"] == [grower_arena] and steady_arena not in d["grew"]
    grown = next(e for e in d["arenas"] if e["number"] == grower_arena)
    assert grown["in_use_growth"] > 3 * 1000 * 1024 and grown["system_growth"] > 0
    assert any(c["low"] == 2048 and c["bytes_growth"] > 0 for c in grown["free_classes"])
    assert f"grew: arena {grower_arena}" in result.stdout
    # the grower kept every other chunk of 1-4 KiB it made, each begun with 'GGGG...' (text): 3000 of them
    kept = sum(c["count"][1] - c["count"][0] for c in grown["in_use_classes"] if c["low"] in (1024, 2048, 4096))
    assert kept == 3 * 1000 and sum(c["bytes_growth"] for c in grown["in_use_classes"]) == grown["in_use_growth"]
    steady = next(e for e in d["arenas"] if e["number"] == steady_arena)
    assert steady["in_use_classes"] == [] and steady["in_use_growth"] == 0
    text = next(c for c in d["signatures"] if c["signature"] == "text")
    assert text["count"][1] - text["count"][0] == kept and d["signatures"][0] == text
    assert f"arena {grower_arena}: chunks in use grew in " in result.stdout
    assert "chunks in use grew by signature: text (" in result.stdout
    # the page of the same differences, in a browser: drawn, the grower's chart of chunks in use that grew
    # holding that growth, and no sideways scrolling in a narrow window
    assert f"the differences as a page: {tmp_path / 'diff.html'}" in result.stdout
    assert diff_page_disagreements((tmp_path / "diff.html").read_text(), d) == []
    with Browser() as browser:
        browser.open(tmp_path / "diff.html", 1200)
        width, _, rows = png_pixels(browser.screenshot())
        assert len({bytes(row[i:i + 3]) for row in rows[::8] for i in range(0, len(row), 12)}) > 20
        charted = browser.evaluate(f"[...document.querySelectorAll('#arena-{grower_arena} svg')].map(s => "
                                   "[...s.querySelectorAll('rect.bar')].reduce((n, r) => n + Number(r.dataset.bytes), 0))")
        assert charted[-1] == sum(c["bytes_growth"] for c in grown["in_use_classes"] if c["bytes_growth"] > 0)
        # each arena three rows: A, B and the change
        assert browser.evaluate("document.querySelectorAll('#diff-arenas tbody tr').length") == 3 * len(d["arenas"])
        browser.resize(380)
        assert browser.evaluate("document.documentElement.scrollWidth") <= 380


# ------------------------------------------------------------------------------------------- errors


def _fails(result: subprocess.CompletedProcess, *phrases: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    message = result.stderr.strip()
    assert message.startswith("heapwalk: ") and len(message.splitlines()) == 1, message
    for phrase in phrases:
        assert phrase in message, message


def test_error_gdb_missing():
    _fails(heapwalk("report", str(capture("system", "bins").core), "--gdb", "/nonexistent/gdb"),
           "gdb not found", "apt install gdb")


def test_error_core_and_executable_do_not_match():
    cap = capture("system", "bins")
    other = capture("system", "thread_arenas").exe
    _fails(heapwalk("report", str(cap.core), str(other)), "does not match the core", "build-id")


def test_error_not_a_core(tmp_path):
    _fails(heapwalk("report", str(capture("system", "bins").exe)), "not a core file")
    _fails(heapwalk("report", str(tmp_path / "missing")), "no such core file")
    (tmp_path / "text").write_text("hello")
    _fails(heapwalk("report", str(tmp_path / "text")), "not an ELF file")


@pytest.mark.parametrize("kept", [50, 90, 99])
def test_a_truncated_core_is_named_as_truncated_not_as_no_core(kept, tmp_path):
    """A core cut short (a full disk, a copy interrupted): the command line says so, with how much is there
    and which memory is missing, opens a padded copy (never gdb's "not a core dump"), and when what heapwalk
    needs lies in the missing part says that, in one line."""
    cap = capture("system", "thread_arenas")
    core = tmp_path / "core"
    subprocess.run(["cp", "--sparse=always", str(cap.core), str(core)], check=True)
    full = core.stat().st_size
    os.truncate(core, full * kept // 100)
    result = heapwalk("report", str(core), str(cap.exe))
    err = result.stderr
    assert f"{core} is truncated: {full * kept // 100} of " in err and "memory region(s)" in err and "missing" in err
    assert "not a core dump" not in err and "Traceback" not in err + result.stdout and "internal error" not in err
    assert "malloc was never used" not in err + result.stdout
    if result.returncode:
        assert result.returncode == 2 and "the core is truncated, and what heapwalk needs lies in the part" in err


def _arena_figures(arena: dict) -> dict:
    """What a truncated core must still say of an arena it holds whole: its memory and top, what is held
    (in use, or in tcache, whose threads a truncated core may have lost, or in fastbins, which a main arena
    whose lists are lost cannot tell from in use) and what is free, and for a thread arena each list's bytes."""
    b = arena["accounting"]["bytes"]
    out = {"system_mem": arena["system_mem"], "top": arena["top"],
           "held": b["in_use"] + b["tcache"] + b["tcache_struct"] + b["fast"],
           "free": b["unsorted"] + b["small"] + b["large"] + b["free_unlisted"]}
    if arena["kind"] == "thread":
        out["lists"] = {k: b[k] for k in ("fast", "unsorted", "small", "large")}
    return out


def _cut_inside_heaps(core: Path, heaps: list[tuple[int, int]], share: float) -> int:
    """The file offset at which a copy of CORE keeps SHARE of the bytes of the segments in HEAPS and loses
    everything after (libc's data, and gcore's notes, among it)."""
    cf = CoreFile(core)
    inside = sorted((off, filesz) for vaddr, _, off, filesz in cf.loads
                    if filesz and any(a <= vaddr < b for a, b in heaps))
    cf.close()
    left = int(sum(filesz for _, filesz in inside) * share)
    for off, filesz in inside:
        if left <= filesz:
            return off + left
        left -= filesz
    return inside[-1][0] + inside[-1][1]


#: (reproducer, where in its heaps the cut falls): each once, over the glibcs in turn (a fixed subset of the matrix)
CUTS = [("thread_arenas", 1.0), ("thread_arenas", 0.5), ("leak", 1.0), ("leak", 0.5)]


@pytest.mark.parametrize("g,name,share", [(g, *CUTS[i % len(CUTS)]) for i, g in enumerate(GLIBCS)]
                         + [(GLIBCS[i % len(GLIBCS)], *CUTS[i]) for i in range(len(GLIBCS), len(CUTS))])
def test_a_core_cut_before_libc_still_reports_the_heaps_it_holds(g, name, share, tmp_path):
    """A core whose cut took libc's data (main_arena, mp_) and gcore's notes (the mapped files, the threads)
    with it: the thread arenas in the heaps it still holds are found by their heaps, the main heap by its
    chunks, and each is decoded as in the whole core when it is whole; the version comes from the layouts
    memory shows, main_arena (or the arenas the ring leads to whose memory is gone, or the cut inside a heap)
    is an error at its address, and `--check` exits 1."""
    cap = capture(g, name)
    sysroot = json.loads((cap.core.parent / "meta.json").read_text())["sysroot"]
    extra = ["--sysroot", sysroot] if sysroot else []
    whole_json = tmp_path / "whole.json"
    assert heapwalk("report", str(cap.core), str(cap.exe), *extra, "--json", str(whole_json)).returncode == 0
    whole = json.loads(whole_json.read_text())
    heaps = [(h["address"], h["address"] + (h["size"] if a["kind"] == "main" else 64 << 20))
             for a in whole["arenas"] for h in a["heaps"]]
    core = tmp_path / "core"
    subprocess.run(["cp", "--sparse=always", str(cap.core), str(core)], check=True)
    os.truncate(core, _cut_inside_heaps(core, heaps, share))
    cut_json = tmp_path / "cut.json"
    result = heapwalk("report", str(core), str(cap.exe), *extra, "--json", str(cut_json), "--check")
    assert result.returncode == 1, result.stderr
    assert "is truncated" in result.stderr and "Traceback" not in result.stdout + result.stderr
    cut = json.loads(cut_json.read_text())
    key = {a["address"] if a["kind"] == "thread" else "main": a for a in cut["arenas"]}
    expected = {a["address"] if a["kind"] == "thread" else "main": a for a in whole["arenas"]}
    assert "main" in key and set(key) <= set(expected), sorted(key)
    whole_here = [k for k in key if not key[k]["accounting"]["unwalked"]
                  and not any(f["kind"] == "unmapped_pointer" and f["severity"] == "error"
                              for f in key[k]["findings"] + key[k]["accounting"]["findings"])]
    for k in whole_here:
        assert _arena_figures(key[k]) == _arena_figures(expected[k]), k
    if share >= 1:
        assert set(key) == set(expected) and set(whole_here) == set(key)
    errors = [f for f in cut["findings"] if f["severity"] == "error"]
    assert any(f["address"] == whole["main_arena"] and "main_arena is not in the target's memory" in f["message"]
               for f in errors) or (cut["main_arena"] is None and any(
                   "main_arena is not found" in f["message"] for f in errors))
    assert _within(whole["glibc"]["version"], cut["glibc"]["version"]), (whole["glibc"], cut["glibc"])


def _within(version: str, label: str) -> bool:
    """Is glibc VERSION ("2.36") among those a layout LABEL ("2.35-2.41", "2.43+", "2.32 or later", "2.31")
    stands for?"""
    def key(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in text.split("."))
    if label.endswith("+") or label.endswith(" or later"):
        return key(version) >= key(label.removesuffix("+").removesuffix(" or later"))
    low, _, high = label.partition("-")
    return key(low) <= key(version) <= key(high or low)


def test_text_into_a_file_or_a_pipe_is_not_wrapped():
    """Out of a terminal, no line is broken for a width: each sentence of the report is one line (copy and
    paste, grep)."""
    cap = capture("system", "thread_arenas")
    result = heapwalk("report", str(cap.core), str(cap.exe))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("malloc_trim(0) would release"))
    assert len(lines[at]) > 200 and lines[at + 1].startswith("free chunks:"), lines[at:at + 2]
    assert all(line == line.rstrip() for line in lines)


def test_error_no_such_process():
    pid = 4_000_000  # above any pid_max
    _fails(heapwalk("capture", str(pid)), f"cannot attach to {pid}", "no process")


def test_error_capture_folder_that_cannot_be_made(tmp_path):
    """--out where no folder can be made: one line saying so and what to do, the process not touched."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with running(tmp_path, "grow") as (proc, _):
        _fails(heapwalk("capture", str(proc.pid), "--out", str(blocker / "snap")),
               f"cannot create the folder {blocker / 'snap'}", "give --out a folder")
        assert process_state(proc.pid) in "SR"


def test_error_process_of_another_user(tmp_path, monkeypatch, capsys):
    """A user who is not root, attaching to a process of another user (here: heapwalk's own check of the
    process's owner, with the effective uid made someone else's)."""
    from heapwalk.capture import proc as procfs
    from heapwalk.cli import main as cli

    with running(tmp_path, "grow") as (proc, _):
        owner = os.stat(f"/proc/{proc.pid}").st_uid
        monkeypatch.setattr(procfs.os, "geteuid", lambda: owner + 1000)
        assert cli.main(["capture", str(proc.pid), "--out", str(tmp_path / "denied")]) == 2
        message = capsys.readouterr().err.strip()
        assert message.startswith(f"heapwalk: cannot attach to {proc.pid}: process {proc.pid} belongs to user "
                                  f"{owner}, not to you") and "sudo" in message
        assert not (tmp_path / "denied").exists() and proc.poll() is None


def test_error_ptrace_scope_explained(monkeypatch, tmp_path):
    """A user attaching to their own process under Yama's ptrace_scope 1 (Ubuntu's default) or 3."""
    from heapwalk.capture import proc

    scope = tmp_path / "ptrace_scope"
    real_path = proc.Path
    monkeypatch.setattr(proc, "Path", lambda p, *rest: real_path(scope) if str(p) == "/proc/sys/kernel/yama/ptrace_scope"
                        else real_path(p, *rest))
    monkeypatch.setattr(proc.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(proc.os, "stat", lambda p: os.stat_result((0o40555, 0, 0, 0, 1000, 1000, 0, 0, 0, 0)))
    scope.write_text("1\n")
    advice = proc.ptrace_advice(os.getpid())
    assert "ptrace_scope is 1" in advice and "sysctl kernel.yama.ptrace_scope=0" in advice
    scope.write_text("3\n")
    assert "disabled on this machine" in proc.ptrace_advice(os.getpid())
    scope.write_text("0\n")
    assert proc.ptrace_advice(os.getpid()) is None


def test_help_lists_every_subcommand():
    result = heapwalk("--help")
    assert result.returncode == 0
    for name in ("report", "capture", "diff"):
        assert name in result.stdout


def test_commands_page_is_the_code_s_own_help():
    """docs/commands.md is what tests/tools/commands_doc.py makes of the gdb commands' and the CLI's help now."""
    import commands_doc

    assert commands_doc.DOC.read_text() == commands_doc.render(), "docs/commands.md is out of date: run 'make docs'"


def test_a_gdb_whose_python_cannot_load_heapwalk_is_named_with_the_module(tmp_path):
    """The command line installed with a Python other than the one gdb embeds: gdb's Python cannot import
    numpy from it.  One line names the module, gdb's Python and ours, and what to do; exit status 2."""
    wrapper = tmp_path / "gdb"
    wrapper.write_text("#!/bin/sh\nexec gdb -iex \"python import sys; sys.modules['numpy'] = None\" \"$@\"\n")
    wrapper.chmod(0o755)
    result = heapwalk("report", str(capture("system", "bins").core), "--gdb", str(wrapper))
    assert result.returncode == 2, result.stdout + result.stderr
    message = result.stderr.strip()
    assert message.startswith("heapwalk: gdb's Python 3.") and "cannot import numpy" in message, message
    assert "the heapwalk command line runs on Python" in message and "make venv" in message
    assert "Traceback" not in result.stdout + result.stderr and len(message.splitlines()) == 1
