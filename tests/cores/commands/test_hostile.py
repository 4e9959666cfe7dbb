"""Targets that are not what heapwalk expects: each gets one clear line and no traceback."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

import harness
from conftest import BINDIR, GLIBCS, blank_stacks, capture, glibc, heapwalk_json, run_gdb
from oracle import malloc_info_view, parse_malloc_info

pytestmark = pytest.mark.cores

LIBDIR = "/usr/lib/x86_64-linux-gnu"


def _one_line_refusal(result, *words: str) -> None:
    output = result.stdout + result.stderr
    assert "Traceback" not in output and "internal error" not in output, output
    assert result.returncode == 1, output
    last = result.stderr.strip().splitlines()[-1]
    assert all(w in last for w in words), last


def _plain_core(tmp_path, env: dict[str, str]):
    exe = harness.build("plain", BINDIR)
    harness.snapshot_core(exe, tmp_path, tmp_path / "core", env)
    return exe, tmp_path / "core"


@pytest.mark.parametrize("command", ["heapwalk report", "heapwalk map", "heapwalk leaks"])
def test_no_process_and_no_core(command):
    _one_line_refusal(run_gdb([], [command]), "no process or core file")


@pytest.mark.parametrize("symbols", [True, False])
def test_process_that_never_called_malloc(tmp_path, symbols):
    exe, core = _plain_core(tmp_path, {"HW_NO_MALLOC": "1"})
    iex = [] if symbols else ["set debug-file-directory /nonexistent"]
    _one_line_refusal(run_gdb([str(exe), str(core)], ["heapwalk report"], iex=iex), "malloc was never used")


@pytest.mark.parametrize("library,name", [("libjemalloc.so.2", "jemalloc"), ("libtcmalloc_minimal.so.4", "tcmalloc")])
def test_process_using_another_allocator_is_named(tmp_path, library, name):
    """Commands that have no view of this allocator say which it is in one line; jemalloc's own (report,
    check, arenas, threads, map, leaks, bins, tcache, chunk: docs/jemalloc.md) and tcmalloc's (report, check,
    threads: docs/tcmalloc.md) decode it."""
    exe, core = _plain_core(tmp_path, {"LD_PRELOAD": f"{LIBDIR}/{library}"})
    # both are decoded: chunks is glibc's own command
    _one_line_refusal(run_gdb([str(exe), str(core)], ["heapwalk chunks"]), f"allocates with {name}",
                      "a command of glibc's malloc only")
    if name == "tcmalloc":
        result = run_gdb([str(exe), str(core)], ["heapwalk report", "heapwalk check", "heapwalk threads"])
        assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr, result.stderr
        assert "tcmalloc: gperftools 2.10" in result.stdout and "tcmalloc consistent: checked" in result.stdout
        assert "tcmalloc thread caches (" in result.stdout
    if name == "jemalloc":       # its allocations are scanned: nothing of the plain program's is leaked
        scanned = run_gdb([str(exe), str(core)], ["heapwalk leaks"])
        assert scanned.returncode == 0 and "Traceback" not in scanned.stdout + scanned.stderr
        assert "leaked: 0 allocations" in scanned.stdout and "an allocation reached" in scanned.stdout
        result = run_gdb([str(exe), str(core)], ["heapwalk report", "heapwalk check", "heapwalk map", "heapwalk bins"])
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        assert "jemalloc arena 0 bins" in result.stdout
        assert "where the memory is" in result.stdout and "jemalloc consistent" in result.stdout
        assert "jemalloc arena 0 extents 1" in result.stdout


@pytest.mark.parametrize("command", ["heapwalk report --html {}", "heapwalk map --png {}", "heapwalk map --svg {}"])
def test_a_file_that_cannot_be_written_is_said_in_one_line(command):
    cap = capture("system", "thread_arenas")
    _one_line_refusal(run_gdb([str(cap.exe), str(cap.core)], [command.format("/nonexistent/dir/out")]),
                      "cannot write /nonexistent/dir/out", "No such file or directory")


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
    then reads zeros): that arena is reported as unreadable, the ring is cut after it, the arenas after it
    are found by their heaps, and the report says so and decodes all the others in full."""
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
    assert [a["address"] for a in report["arenas"][:4]] == [a["address"] for a in document["arenas"][:4]]
    assert sorted(a["address"] for a in report["arenas"][4:]) == sorted(a["address"] for a in document["arenas"][4:])
    assert all(a["accounting"]["balanced"] for i, a in enumerate(report["arenas"]) if i != 3)
    (blank,) = report["arenas"][3]["findings"]
    assert blank["kind"] == "arena" and "missing from the core" in blank["message"]
    assert any("ring" in note for note in report["report"]["partial"]), report["report"]["partial"]
    assert any("arena 3: could not be read" in note for note in report["report"]["partial"])
    assert "partial results" in result.stdout and "heap DAMAGED" in result.stdout


def _tcache_contents(tcache: dict) -> tuple:
    return tuple((b["chunk_size"], tuple(b["entries"])) for b in tcache["bins"])


@pytest.mark.parametrize("symbols", [True, False])
@pytest.mark.parametrize("g", GLIBCS)
def test_blank_thread_stacks_tcaches_are_found_by_scanning(g, symbols, tmp_path):
    """gcore writes the worker threads' stacks, and the TLS on them, as zeros: heapwalk says so in one
    warning, finds each tcache struct in the arenas instead, and every arena's numbers stay exact."""
    cap, blank = blank_stacks(g)
    iex = glibc(g).gdb_settings(symbols)
    intact = heapwalk_json([str(cap.exe), str(cap.core)], tmp_path, iex=iex)
    doc = heapwalk_json([str(cap.exe), str(blank)], tmp_path, iex=iex)
    workers = {t["lwp"] for t in intact["threads"] if t["lwp"] != cap.pid}
    assert {t["lwp"] for t in doc["threads"] if not t["tls_intact"]} == workers
    assert all(t["arena"] is None and t["tcache"] is None for t in doc["threads"] if t["lwp"] in workers)
    lost = [t["tcache"] for t in intact["threads"] if t["lwp"] in workers and t["tcache"]]
    assert sorted((tc["address"], _tcache_contents(tc)) for tc in doc["scanned_tcaches"]) == \
        sorted((tc["address"], _tcache_contents(tc)) for tc in lost)
    ledger = json.loads(cap.ledger.read_text())
    recorded = sorted(tuple((b["chunk_size"], tuple(b["entries"])) for b in t["tcache"])
                      for t in ledger["threads"] if t["tid"] in workers)
    assert sorted(_tcache_contents(tc) for tc in doc["scanned_tcaches"] if tc["bins"]) == \
        [r for r in recorded if r]
    assert [a["accounting"] for a in doc["arenas"]] == [a["accounting"] for a in intact["arenas"]]
    assert malloc_info_view(doc) == parse_malloc_info(cap.malloc_info)
    warning, note = [f for f in doc["findings"] if f["kind"] == "thread_tls_lost"]
    assert warning["severity"] == "warning" and f"TLS of {len(workers)} threads" in warning["message"]
    assert note["severity"] == "info" and f"{len(lost)} found" in note["message"]
    assert not [f for f in doc["findings"] if f["severity"] == "error"]


def test_blank_main_tls_too_still_finds_every_tcache(tmp_path):
    """With no thread's TLS in the core (the main thread's blanked as well) and no symbols, the tcache
    TLS offset cannot be checked on any thread: the scan still finds every tcache, the main thread's
    empty one included (an all-zero struct is taken only at an arena's first chunk)."""
    cap, blank = blank_stacks("system", main_tls=True)
    iex = glibc("system").gdb_settings(False)
    intact = heapwalk_json([str(cap.exe), str(cap.core)], tmp_path, iex=iex)
    doc = heapwalk_json([str(cap.exe), str(blank)], tmp_path, iex=iex)
    assert not any(t["tls_intact"] for t in doc["threads"])
    assert sorted((tc["address"], _tcache_contents(tc)) for tc in doc["scanned_tcaches"]) == \
        sorted((t["tcache"]["address"], _tcache_contents(t["tcache"])) for t in intact["threads"] if t["tcache"])
    assert [a["accounting"] for a in doc["arenas"]] == [a["accounting"] for a in intact["arenas"]]
    out = tmp_path / "report.json"
    result = run_gdb([str(cap.exe), str(blank)], [f"heapwalk report --json {out}", "heapwalk tcache",
                                                  "heapwalk check"], iex=iex)
    assert result.returncode == 0, result.stdout + result.stderr
    users = {}
    for t in intact["threads"]:
        users[t["arena"]] = users.get(t["arena"], 0) + 1
    assert [a["threads"] for a in json.loads(out.read_text())["report"]["arenas"]] == \
        [users.get(a["address"], 0) for a in intact["arenas"]]   # glibc's attached_threads stands in
    assert "found by scanning" in result.stdout and "heap DAMAGED" not in result.stdout
    assert "threads 1-" in result.stdout


@pytest.mark.parametrize("command", ["heapwalk arenas", "heapwalk report", "heapwalk check", "heapwalk chunks"])
def test_a_32bit_core_is_refused_in_one_line(tmp_path, command):
    """An i386 process's core: heapwalk says 32-bit targets are not supported yet, naming the architecture."""
    exe = harness.build_32bit(BINDIR)
    harness.snapshot_core(exe, tmp_path, tmp_path / "core")
    _one_line_refusal(run_gdb([str(exe), str(tmp_path / "core")], [command]), "32-bit targets are not supported yet",
                      "i386")
