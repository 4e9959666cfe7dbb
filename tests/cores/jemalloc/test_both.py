"""A process with both allocators: a program on jemalloc (LD_PRELOAD, Debian's 5.2.1 and 5.3.0) whose library,
loaded with RTLD_DEEPBIND, allocates with glibc's malloc (cores/jemalloc/je_both.c).  Both are decoded with no debug
symbols, each equal to what it printed at the snapshot: jemalloc's malloc_stats_print "J" and glibc's
malloc_info(3)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

import harness
import sysroots
from conftest import BINDIR, JEMALLOCS, NO_SYMBOLS, SYSROOTS, capture_jemalloc, run_gdb
from heapwalk.output.jsondoc import together
from oracle import jemalloc_arena_view, jemalloc_printed_view, malloc_info_view, parse_malloc_info

pytestmark = pytest.mark.cores


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """both(suite) -> (capture, the text of 'heapwalk arenas', its JSON) of je_both on SUITE's jemalloc."""
    tmp = tmp_path_factory.mktemp("both")

    @functools.cache
    def compute(suite: str):
        cap = capture_jemalloc(suite, "je_both")
        out = tmp / f"{suite}.json"
        result = run_gdb([str(cap.exe), str(cap.core)], [f"heapwalk arenas --json {out}"], iex=[NO_SYMBOLS])
        assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr, result.stderr
        return cap, " ".join(result.stdout.split()), json.loads(out.read_text())
    return compute


@pytest.mark.parametrize("suite", JEMALLOCS)
def test_jemalloc_is_what_malloc_stats_print_printed_beside_glibc(both, suite):
    cap, text, doc = both(suite)
    stats = json.loads((cap.directory / "stats.json").read_text())["jemalloc"]
    ledger = json.loads((cap.ledger).read_text())
    assert doc["allocator"] == "jemalloc" and doc["allocators"] == ["jemalloc", "glibc"]
    assert doc["jemalloc"]["version"] == stats["version"]
    compared = 0
    for arena in doc["jemalloc"]["arenas"]:
        if arena["index"] != ledger["stats_arena"]:
            printed = stats["stats.arenas"][str(arena["index"])]
            assert jemalloc_arena_view(arena) == jemalloc_printed_view(printed, arena["index"], ledger)
            compared += 1
    assert compared == 2


@pytest.mark.parametrize("suite", JEMALLOCS)
def test_glibc_is_what_malloc_info_printed_beside_jemalloc(both, suite):
    """glibc's arenas per bin, its mmapped chunks and system memory, equal to malloc_info; each thread in the
    glibc arena its library calls made (the main arena for the main thread, a thread arena for the worker);
    and no finding that another allocator is mapped, since it is decoded too."""
    cap, text, doc = both(suite)
    glibc = doc["glibc_malloc"]
    assert malloc_info_view(glibc) == parse_malloc_info(cap.malloc_info)
    kinds = {a["address"]: a["kind"] for a in glibc["arenas"]}
    assert sorted(kinds.values()) == ["main", "thread"]
    lwps = {t["role"]: t["lwp"] for t in json.loads(cap.ledger.read_text())["threads"]}
    arena_of = {t["lwp"]: kinds.get(t["arena"]) for t in glibc["threads"]}
    assert arena_of == {lwps["main"]: "main", lwps["worker"]: "thread"}
    assert glibc["mmapped"]["count"] == 2 and not glibc["findings"]
    assert "jemalloc arenas" in text and "glibc's malloc, in use beside jemalloc:" in text


@pytest.mark.parametrize("suite", JEMALLOCS)
def test_report_threads_and_check_show_both(both, suite, tmp_path):
    """The report of each allocator, and the sentence that says what each holds; check of both, consistent,
    with $heapwalk_errors 0; 'bins' and 'tcache' show jemalloc's, and with glibc's own arguments (a kind of
    free list, --entries) glibc's heap beside it."""
    cap = both(suite)[0]
    report, check = tmp_path / "report.json", tmp_path / "check.json"
    result = run_gdb([str(cap.exe), str(cap.core)], [
        f"heapwalk report --json {report}", "heapwalk threads", f"heapwalk check --json {check}",
        "printf \"errors=%d\\n\", $heapwalk_errors", "heapwalk bins", "heapwalk tcache", "heapwalk bins small",
        "heapwalk tcache --entries"], iex=[NO_SYMBOLS])
    text = " ".join(result.stdout.split())
    assert result.returncode == 0 and "Traceback" not in text + result.stderr, result.stderr
    assert "This process allocates with both: jemalloc maps" in text
    assert "jemalloc threads" in text and "arenas and their threads" in text
    assert "jemalloc consistent" in text and "heap consistent" in text and "errors=0" in text
    assert "jemalloc arena 0 bins" in text and " tcache of arena " in text
    assert ": free lists" in text and "tcache per thread" in text
    doc = json.loads(report.read_text())
    assert doc["report"]["verdict"][0].startswith("Held free by jemalloc")
    assert any("slabs not full" in line and "a slab goes back to its arena only when its last region is freed"
               in line for line in doc["report"]["verdict"])      # the objects half freed: slabs half used
    assert doc["glibc_malloc"]["report"]["verdict"] and doc["glibc_malloc"]["report"]["partial"] == []
    checked = json.loads(check.read_text())
    assert checked["clean"] and checked["glibc_malloc"]["clean"] and checked["glibc_malloc"]["checked"]["chunks"] > 6000


@pytest.mark.parametrize("suite", JEMALLOCS[-1:])
def test_the_command_line_reports_both(both, suite, tmp_path):
    cap = both(suite)[0]
    cli = Path(sys.executable).with_name("heapwalk")
    out = tmp_path / "report.json"
    result = subprocess.run([str(cli), "report", str(cap.core), "--no-symbols", "--json", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "jemalloc threads" in text and "glibc's malloc, in use beside jemalloc:" in text
    assert "This process allocates with both" in text
    assert json.loads(out.read_text())["glibc_malloc"]["report"]["arenas"]


@pytest.mark.parametrize("suite", JEMALLOCS[-1:])
def test_a_process_on_jemalloc_alone_shows_no_glibc(suite, tmp_path):
    """Under LD_PRELOAD glibc's malloc is never called (je_dns): jemalloc alone, nothing said of glibc's."""
    cap = capture_jemalloc(suite, "je_dns")
    out = tmp_path / "arenas.json"
    result = run_gdb([str(cap.exe), str(cap.core)], [f"heapwalk arenas --json {out}"], iex=[NO_SYMBOLS])
    assert result.returncode == 0 and "glibc" not in result.stdout
    doc = json.loads(out.read_text())
    assert "glibc_malloc" not in doc and "allocators" not in doc


@pytest.mark.parametrize("suite", JEMALLOCS[:1])
def test_capture_reads_a_live_process_with_both(suite, tmp_path):
    """'heapwalk capture PID --live' on je_both at its snapshot (stopped, as it printed its statistics): each
    allocator read from the live process equals what it printed, and the process is left as it was."""
    jemalloc = sysroots.prepare_jemalloc(SYSROOTS, suite)
    exe = harness.build("je_both", BINDIR)
    proc = harness.run_to_snapshot(exe, tmp_path / "run", env=jemalloc.environment())
    try:
        cli = Path(sys.executable).with_name("heapwalk")
        result = subprocess.run([str(cli), "capture", str(proc.pid), "--live", "--no-symbols", "--out",
                                 str(tmp_path / "snap")], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        text = " ".join(result.stdout.split())
        assert "RSS per arena: not shown" not in text
        doc = json.loads((tmp_path / "snap" / "report.json").read_text())
        # jemalloc's arenas too, from the same page map
        assert doc["report"]["residency"] and all(a["rss"] is not None for a in doc["report"]["arenas"])
        # glibc's arenas beside jemalloc's know what is in RAM, read from the live process's page map
        beside = doc["glibc_malloc"]["report"]
        assert beside["residency"].startswith("the process's page map")
        assert all(a["rss"] is not None for a in beside["arenas"])
        stats = json.loads((tmp_path / "run" / "stats.json").read_text())["jemalloc"]
        ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
        for arena in doc["jemalloc"]["arenas"]:
            if arena["index"] != ledger["stats_arena"]:
                printed = stats["stats.arenas"][str(arena["index"])]
                assert jemalloc_arena_view(arena) == jemalloc_printed_view(printed, arena["index"], ledger)
        assert malloc_info_view(doc["glibc_malloc"]) == parse_malloc_info(tmp_path / "run" / "malloc_info.xml")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_one_document_holds_both_allocators():
    je, glibc = {"schema_version": 1, "target": "t", "allocator": "jemalloc"}, {"schema_version": 1, "target": "t",
                                                                                "arenas": []}
    assert together([("jemalloc", "jemalloc", je)]) is je and together([("glibc", "glibc_malloc", glibc)]) is glibc
    assert together([("jemalloc", "jemalloc", je), ("glibc", "glibc_malloc", glibc)]) == {
        **je, "allocators": ["jemalloc", "glibc"], "glibc_malloc": {"allocator": "glibc", "arenas": []}}
