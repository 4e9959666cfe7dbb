"""'heapwalk report': malloc_info XML rebuilt to the byte, totals that add up, and a verdict that fits."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess

import pytest

from conftest import GDBINIT, GLIBCS, capture, glibc, run_gdb, version_tuple
from harness import REPRODUCERS

from heapwalk.glibc.locate.layout import layout_for
from heapwalk.glibc.model import HeapState
from heapwalk.glibc.account.summary import arena_limit

pytestmark = pytest.mark.cores

CASES = [pytest.param(g, n, id=f"{g}-{n}") for g in GLIBCS for n in REPRODUCERS]


@pytest.fixture(scope="session")
def report_of(tmp_path_factory):
    """report_of(glibc, name) -> (JSON document, XML text, gdb's stdout) of 'heapwalk report', symbols hidden."""
    tmp = tmp_path_factory.mktemp("report")

    @functools.cache
    def compute(g: str, name: str):
        c = capture(g, name)
        js, xml = tmp / f"{g}-{name}.json", tmp / f"{g}-{name}.xml"
        result = run_gdb([str(c.exe), str(c.core)], [f"heapwalk report --json {js} --xml {xml}"],
                         iex=glibc(g).gdb_settings(False))
        assert result.returncode == 0 and js.exists(), result.stderr
        return json.loads(js.read_text()), xml.read_text(), result.stdout
    return compute


@pytest.mark.parametrize("g,name", CASES)
def test_xml_is_what_malloc_info_printed(report_of, g, name):
    _, xml, _ = report_of(g, name)
    assert xml == capture(g, name).malloc_info.read_text()


@pytest.mark.parametrize("g,name", CASES)
def test_report_totals_add_up(report_of, g, name):
    doc, _, _ = report_of(g, name)
    rep = doc["report"]
    for row in rep["arenas"]:
        assert row["balanced"]
        assert row["in_use"] + sum(row["free"].values()) + row["top"] + row["overhead"] == row["system"]
    assert rep["totals"]["system"] == sum(a["system_mem"] for a in doc["arenas"])
    assert sum(b["bytes"] for b in rep["histogram"]) == rep["totals"]["free"]
    assert sum(c["bytes"] for c in rep["by_size_class"]) == rep["totals"]["free"]
    for row in rep["arenas"]:
        arena_hist = rep["histogram_by_arena"][str(row["number"])]
        assert sum(b["bytes"] for b in arena_hist) == sum(row["free"].values()), row["number"]
    assert rep["largest_free"] <= rep["totals"]["free"]
    assert rep["mmapped"] == {"count": doc["mp"]["n_mmaps"], "bytes": doc["mp"]["mmapped_mem"], "resident": None}


@pytest.mark.parametrize("g", GLIBCS)
def test_verdict_names_fragmentation_only_where_memory_is_free(report_of, g):
    for name in ("thread_arenas", "small_vectors"):
        verdict = report_of(g, name)[0]["report"]["verdict"]
        assert verdict[0].startswith("Fragmentation, not a leak"), (name, verdict)
    arenas = report_of(g, "thread_arenas")[0]["report"]["verdict"]
    assert any("MALLOC_ARENA_MAX" in v for v in arenas) and any("malloc_trim(0) would give back" in v for v in arenas)
    small = report_of(g, "small_vectors")[0]["report"]["verdict"]
    assert any("chunks under 4 KiB" in v for v in small) and not any("MALLOC_ARENA_MAX" in v for v in small)
    leak = report_of(g, "leak")[0]["report"]["verdict"]
    assert leak[0].startswith("A leak, not fragmentation") and not any("Fragmentation" in v for v in leak)


#: the reproducers that drop blocks on purpose: every other one holds all it allocated (cores/common/hw.c's live set)
LEAKING = ("leak", "reach")
#: reproducers whose threads exit around the snapshot: glibc 2.43 may leave the dynamic thread vector of one
#: (a chunk of a few hundred bytes that no word of the core points to), at most one per exited thread
EXITING = {"many_arenas": 7}


@pytest.mark.parametrize("g,name", CASES)
def test_the_leak_scan_in_the_report_finds_what_each_reproducer_dropped(report_of, g, name):
    """The report's leak totals: the leak reproducer's ledger exactly (every block it dropped, their bytes),
    nothing on the reproducers that keep what they allocate; per arena they add up to the totals."""
    rep = report_of(g, name)[0]["report"]
    leaks = rep["leaks"]
    facts = json.loads(capture(g, name).ledger.read_text())["facts"]
    if name == "leak":
        assert (leaks["leaked_count"], leaks["leaked_bytes"]) == (facts["leaked_count"], facts["leaked_bytes"])
        assert leaks["unreferenced_count"] == facts["leaked_count"]
    elif name in EXITING:
        assert leaks["leaked_count"] <= EXITING[name] and leaks["leaked_bytes"] <= 1024 * leaks["leaked_count"]
    elif name not in LEAKING:
        assert (leaks["leaked_count"], leaks["leaked_bytes"], leaks["unreferenced_count"]) == (0, 0, 0)
        assert not any("leak scan found" in v for v in rep["verdict"])
    assert sum(a["leaked_bytes"] for a in leaks["by_arena"].values()) == leaks["leaked_bytes"]
    assert sum(a["leaked_count"] for a in leaks["by_arena"].values()) == leaks["leaked_count"]
    assert leaks["unread_bytes"] == 0


@pytest.mark.parametrize("g,name", CASES)
def test_in_use_groups_hold_every_chunk_in_use(report_of, g, name):
    """In-use chunks by size add up, in all and per arena, to the arenas' in-use bytes less one tcache struct
    per thread that has a tcache there (malloc's own, never grouped: each of one size, or 16 bytes more when
    malloc gave it a free chunk it could not split); their leaked shares add up to the scan's; signature
    groups never hold more than there is."""
    doc = report_of(g, name)[0]
    rep = doc["report"]
    used, leaks = rep["in_use"], rep["leaks"]
    assert sum(b["bytes"] for b in used["histogram"]) == used["bytes"] == leaks["in_use_bytes"]
    assert sum(b["count"] for b in used["histogram"]) == used["count"] == leaks["in_use_count"]
    assert sum(b["leaked_bytes"] for b in used["histogram"]) == leaks["leaked_bytes"]
    tcaches: dict[int, int] = {}
    for t in doc["threads"]:
        if t["tcache"]:
            tcaches[t["arena"]] = tcaches.get(t["arena"], 0) + 1
    rests = []
    for a in rep["arenas"]:
        grouped = sum(b["bytes"] for b in used["histogram_by_arena"].get(str(a["number"]), []))
        rest, n = a["in_use"] - grouped, tcaches.get(a["address"], 0)
        assert rest == 0 if not n else rest > 0, (a["number"], rest, n)
        if n:
            rests.append((rest, n))
    if rests:
        size = min(rest // n for rest, n in rests)
        struct = layout_for(version_tuple(glibc(g).version)).tcache_chunk_size   # 0x250, 0x290 or 0x300
        assert size >= struct and all(n * size <= rest <= n * (size + 16) for rest, n in rests), rests
    for sig in used["by_signature"]:
        assert 0 < sig["bytes"] <= used["bytes"] and 0 <= sig["leaked_bytes"] <= sig["bytes"]


def test_report_reads_well_in_a_batch_log(report_of):
    doc, _, out = report_of("system", "thread_arenas")
    assert "\x1b[" not in out
    for line in ("where the memory is", "9 arenas", "free chunks by size", "verdict:", "trim frees",
                 "main_arena 0x", "in-use chunks by size", "leaked chunks",
                 "The leak scan reached every chunk in use from the program's roots: nothing leaked."):
        assert line in out, line
    # tables stay narrow; sentences are never broken for a width (one line each, for copy and paste)
    assert max(len(line) for line in out.splitlines() if line[:1] in "+|") <= 200
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("malloc_trim(0) would release"))
    assert len(lines[at]) > 200 and lines[at + 1].startswith("free chunks:"), lines[at:at + 2]


def _report_interrupted(tmp_path, module: str, function: str, call: int, careful: bool = False,
                        env: dict | None = None, before: str = ""):
    """'heapwalk report' on the thread_arenas core with Ctrl-C (a KeyboardInterrupt) raised in the CALLth
    call of MODULE.FUNCTION: gdb's output, checked free of tracebacks, and the JSON report.  CAREFUL: with
    the one pass turned off, as on a damaged heap, so the careful walkers walk the chunks; ENV: gdb's environment
    besides the test's; BEFORE: Python run first."""
    cap = capture("system", "thread_arenas")
    script = tmp_path / "interrupt.py"
    off = "import heapwalk.glibc.bulk.onepass as _o; _o.OnePass.lists = lambda self, arena, raw: None\n"
    script.write_text(before + (off if careful else "") + f"import {module} as _m; _real = _m.{function}; _n = [0]\n"
                      "def _stop(*a, **k):\n"
                      "    _n[0] += 1\n"
                      f"    if _n[0] == {call}: raise KeyboardInterrupt\n"
                      "    return _real(*a, **k)\n"
                      f"_m.{function} = _stop\n")
    out = tmp_path / "report.json"
    result = run_gdb([str(cap.exe), str(cap.core)], [f"source {script}", f"heapwalk report --json {out}"], env=env)
    output = result.stdout + result.stderr
    assert "Traceback" not in output and "internal error" not in output, output
    return result, json.loads(out.read_text())


def test_ctrl_c_during_the_chunk_walk_leaves_partial_results(tmp_path):
    """Ctrl-C (KeyboardInterrupt) in the middle of the third arena's walk: the command still prints its
    report, says the walk was interrupted and which numbers are partial, and exits without a traceback."""
    result, report = _report_interrupted(tmp_path, "heapwalk.glibc.walk.chunkwalk", "walk_batches", 3, careful=True)
    assert "the chunk walk was interrupted (Ctrl-C)" in result.stdout
    assert any("interrupted" in line for line in report["report"]["partial"])
    walked = [a["accounting"]["unwalked"] == 0 for a in report["arenas"]]
    assert walked[:2] == [True, True] and not any(walked[2:])
    assert [f["kind"] for f in report["findings"]].count("interrupted") == 1


def test_ctrl_c_while_the_free_lists_are_read_leaves_the_arenas_read_so_far(tmp_path):
    """Ctrl-C while the fourth arena's bins are read: the report shows the three arenas read, says the rest
    are left out and nothing was walked, and exits without a traceback."""
    result, report = _report_interrupted(tmp_path, "heapwalk.glibc.decode", "decode_arena", 4)
    assert "reading the free lists was interrupted (Ctrl-C) in arena 3: it and the 5 arena(s) after it are " \
           "left out" in " ".join(result.stdout.split())
    assert [a["number"] for a in report["arenas"]] == [0, 1, 2]
    assert all(a["accounting"]["unwalked"] == a["system_mem"] for a in report["arenas"])
    assert any("reading the free lists was interrupted" in line for line in report["report"]["partial"])


def test_the_progress_bar_shows_in_an_interactive_gdb_only(tmp_path):
    """On a terminal (gdb run under script(1)) a walk that takes long enough draws rich's progress bar;
    gdb -batch output never has it."""
    cap = capture("system", "thread_arenas")
    batch = run_gdb([str(cap.exe), str(cap.core)], ["python import heapwalk.gdb.console as c; c._PROGRESS_AFTER = 0",
                                                     "heapwalk report"])
    assert "walking chunks" not in batch.stdout + batch.stderr and "where the memory is" in batch.stdout
    gdb_line = (f"gdb -nx -q -iex 'set pagination off' -iex 'set confirm off' -x {GDBINIT} "
                "-ex 'python import heapwalk.gdb.console as c; c._PROGRESS_AFTER = 0' "
                f"-ex 'heapwalk report' -ex quit {cap.exe} {cap.core}")
    typescript = subprocess.run(["script", "-qc", gdb_line, "/dev/null"], capture_output=True, text=True,
                                timeout=120, stdin=subprocess.DEVNULL, env={**os.environ, "TERM": "xterm"})
    assert "walking chunks" in typescript.stdout and "where the memory is" in typescript.stdout


@pytest.mark.parametrize("where", ["ahead", "in turn"])
def test_ctrl_c_during_the_one_pass_leaves_the_arenas_swept_so_far(tmp_path, where):
    """Ctrl-C while the one pass sweeps the fourth arena's heaps (where its lists are read): as while the
    lists are read, the three arenas before it are shown, and the command exits without a traceback.  On a core
    read from its file the arenas are swept ahead on a thread of heapwalk's own, and Ctrl-C comes while gdb's
    thread waits for the sweep; where gdb reads the core, the sweep is gdb's thread's own."""
    if where == "ahead":       # the reproducer's arenas are small: swept ahead all the same
        result, report = _report_interrupted(tmp_path, "heapwalk.glibc.bulk.ahead", "_waited", 4,
                                             before="import heapwalk.glibc.bulk.ahead as _p; _p.AHEAD_FROM = 0\n")
    else:
        result, report = _report_interrupted(tmp_path, "heapwalk.glibc.bulk.onepass", "sweep_extents", 4,
                                             env={"HEAPWALK_READ_BY_GDB": "1"})
    assert "reading the free lists was interrupted (Ctrl-C) in arena 3" in " ".join(result.stdout.split())
    assert [a["number"] for a in report["arenas"]] == [0, 1, 2]


def test_the_arena_limit_says_when_it_is_reached():
    """glibc's limit is 8 arenas per CPU unless MALLOC_ARENA_MAX says otherwise; with the CPU count known (a
    live process, or heapwalk's core) the report says how many were made, and when every one was."""
    state = HeapState("t", (2, 36), "2.36", None, None, (object(),) * 16, ())
    assert "does not record the CPU count" in arena_limit(state)
    assert arena_limit(dataclasses.replace(state, cpus=(2, 2))).startswith("16 (the default: 8 x 2 CPUs online): reached")
    assert arena_limit(dataclasses.replace(state, cpus=(4, 1))) == (
        "32 (the default: 8 x 4 CPUs online; 8 on glibc 2.35-2.38 builds that count the 1 CPU the process may "
        "use), 16 made")
    assert arena_limit(dataclasses.replace(state, mp={"arena_max": 2}, cpus=(4, 4))).startswith(
        "2 (MALLOC_ARENA_MAX / M_ARENA_MAX): reached")
