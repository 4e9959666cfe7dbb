"""`heapwalk capture` on a running multi-threaded service (cores/glibc/service.c: 16 workers whose arenas fill with
free memory) and a real malloc_trim(0) in it: the core's size beside the process's resident memory, its
report beside gcore's of the same instant, the trim estimate beside the RSS the trim gave back, the verdict
after the trim, and `heapwalk diff` of the two captures.  The service writes its own ledger (RSS just before
and after malloc_trim)."""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from heapwalk.capture import ptrace
from heapwalk.analysis.report import human
from heapwalk.capture.corewriter import write_core
from services import gcore_report, process_state, running, wait_for_step
from verdicts import contradictions

pytestmark = pytest.mark.live

HEAPWALK = Path(sys.executable).parent / "heapwalk"
WORKERS = 16
MiB = 1 << 20


def _heapwalk(*args) -> str:
    result = subprocess.run([str(HEAPWALK), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr and "internal error" not in result.stderr
    return result.stdout


def _report(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())["report"]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """Captures of the service before and after malloc_trim(0), gcore's whole core of the moment before, and
    the service's ledger of the trim: (folder, its ledger [step, RSS before, RSS after, trim's result])."""
    tmp = tmp_path_factory.mktemp("service")
    with running(tmp, "service", str(WORKERS)) as (proc, state_dir):
        printed = {"before": _heapwalk("capture", proc.pid, "--out", tmp / "before")}
        gcore_report(proc.pid, tmp / "full", tmp / "before" / "capture.json")
        assert proc.poll() is None and process_state(proc.pid) in "SR"
        os.kill(proc.pid, signal.SIGUSR2)
        ledger = wait_for_step(state_dir, 1)
        printed["after"] = _heapwalk("capture", proc.pid, "--out", tmp / "after")
        gcore_report(proc.pid, tmp / "plain-after")       # gcore's core of the same moment, nothing said of RAM
    (tmp / "printed.json").write_text(json.dumps(printed))
    return tmp, ledger


def test_the_core_holds_the_resident_memory_and_reports_as_gcores_does(service):
    tmp, _ = service
    record = json.loads((tmp / "before" / "capture.json").read_text())
    assert record["threads"] == WORKERS + 1 and record["core_writer"] == "heapwalk"
    resident = sum(m["rss"] for m in record["smaps"])
    on_disk = (tmp / "before" / "core").stat().st_blocks * 512
    assert on_disk <= 1.2 * resident + 4 * MiB, (on_disk, resident)
    assert on_disk * 10 < next((tmp / "full").glob("core.*")).stat().st_blocks * 512
    ours, full = _report(tmp / "before"), _report(tmp / "full")
    for rep in (ours, full):
        rep.pop("residency"), rep.pop("arena_limit"), rep["rss_by_owner"].pop("source")
    assert ours == full                   # exact, per arena, RSS included, and the RSS by owner
    assert ours["rss_by_owner"]["total"] == resident
    assert len(ours["arenas"]) == min(WORKERS + 1, 8 * os.cpu_count())


def test_the_trim_estimate_is_what_malloc_trim_gave_back(service):
    tmp, (_, rss_before, rss_after, trimmed) = service
    rep = _report(tmp / "before")
    assert trimmed == 1
    assert abs(rep["totals"]["trim"] - (rss_before - rss_after)) <= MiB // 5, (rep["totals"]["trim"],
                                                                               rss_before - rss_after)
    assert rep["totals"]["trim"] > 10 * MiB
    # and after it, nothing is left that trim would give back
    assert _report(tmp / "after")["totals"]["trim"] <= 64 << 10


def test_the_verdict_counts_free_memory_in_ram(service):
    tmp, (_, rss_before, rss_after, _) = service
    before, after = _report(tmp / "before"), _report(tmp / "after")
    assert before["verdict"][0].startswith("Fragmentation, not a leak") and " in RAM " in before["verdict"][0]
    assert any("malloc_trim(0) would give back" in s for s in before["verdict"])
    arena_max = next(s for s in before["verdict"] if "MALLOC_ARENA_MAX=2" in s)
    assert "it would have saved the free memory in RAM of the arenas beyond the cap: with 2, " in arena_max
    # after the trim the lead says the free memory is no longer in RAM, with the figures in RAM after it
    lead = after["verdict"][0]
    assert lead.startswith("Free memory, but not in RAM: ") and "needs no remedy" in lead
    assert not any("malloc_trim(0) would give back" in s for s in after["verdict"])
    assert after["totals"]["free_resident"] < before["totals"]["free_resident"] - 10 * MiB
    # each arena's RSS fell by what the trim gave back
    drop = before["totals"]["rss"] - after["totals"]["rss"]
    assert abs(drop - (rss_before - rss_after)) <= MiB // 5, (drop, rss_before - rss_after)
    for rep in (before, after):
        for a in rep["arenas"]:
            assert 0 <= a["free_resident"] + a["top_resident"] <= a["rss"] <= a["system"] + 4096


def test_a_plain_core_s_verdict_agrees_with_the_capture_s_and_says_what_it_cannot_know(service):
    """After the trim the capture says the free memory is not in RAM and needs no remedy; gcore's core of the
    same moment cannot tell: its verdict gives the same figures of what is free and in use, says that it does
    not know which of it is in RAM and what would say, and claims nothing in RAM.  No verdict of the three
    contradicts itself."""
    tmp, _ = service
    capture_doc, plain_doc = (json.loads((tmp / name / "report.json").read_text()) for name in ("after",
                                                                                              "plain-after"))
    plain, captured = plain_doc["report"], capture_doc["report"]
    assert not plain["residency"] and captured["residency"]
    assert plain["totals"]["free"] == captured["totals"]["free"]
    assert plain["totals"]["in_use"] == captured["totals"]["in_use"]
    said = " ".join(plain["verdict"])
    assert "Whether this free memory costs RAM a plain core does not say" in said
    assert "'heapwalk capture PID' on the running process" in said
    assert f"{human(plain['totals']['in_use'])} is in use" in said and f"{human(plain['totals']['in_use'])} is in use" \
        in " ".join(captured["verdict"])
    for doc in (capture_doc, plain_doc, json.loads((tmp / "before" / "report.json").read_text())):
        assert contradictions(doc) == []


def test_the_arena_limit_is_said_and_reached(service):
    tmp, _ = service
    printed = json.loads((tmp / "printed.json").read_text())["before"]
    cpus = os.cpu_count()
    assert f"limit {8 * cpus} (the default: 8 x {cpus} CPU" in printed
    assert ("reached" in printed) == (WORKERS + 1 >= 8 * cpus)
    assert "RSS" in printed and "free in RAM" in printed and "the page map the capture recorded" in printed


def test_diff_of_the_two_captures_shows_the_rss_given_back(service, tmp_path):
    tmp, (_, rss_before, rss_after, _) = service
    out = tmp_path / "diff.json"
    text = _heapwalk("diff", tmp / "before", tmp / "after", "--json", out)
    d = json.loads(out.read_text())
    counts = d["arena_counts"]
    assert counts[0] == counts[1] and not d["restarted"]
    assert text.splitlines()[0] == f"arenas: {counts[0]} -> {counts[1]}"
    assert "RSS MiB" in text.splitlines()[1]
    assert "RSS of the arenas: " in text
    assert abs(-d["growth"]["rss"] - (rss_before - rss_after)) <= MiB // 5
    assert all(e["rss_growth"] <= 0 for e in d["arenas"]) and d["grew"] == []
    assert d["process_rss"][0] - d["process_rss"][1] >= 0.9 * (rss_before - rss_after)
    assert "RSS of the process (capture.json): " in text


def test_a_core_read_partly_into_memory_held_for_it_is_the_same_core(tmp_path):
    """The capture reads the process into memory made ready before the stop, and what does not fit into the
    file while the process is stopped: the core is the same byte for byte whichever way each part went."""
    with running(tmp_path, "service", "4") as (proc, _):
        with ptrace.stop(proc.pid) as stopped:
            direct = write_core(stopped, tmp_path / "direct", {"cpus_online": 1})
            held = write_core(stopped, tmp_path / "held", {"cpus_online": 1}, mmap.mmap(-1, 8 * MiB))
            assert held.held and len(held.held) < held.segments    # some held, some written at once
        assert direct.finish() == held.finish()
    assert (tmp_path / "direct").read_bytes() == (tmp_path / "held").read_bytes()
