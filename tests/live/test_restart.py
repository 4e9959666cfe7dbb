"""`heapwalk diff` across a restart, as an operator runs the usual experiment on cores/glibc/service.c (workers that
name themselves, each with an arena of its own): captured on glibc's malloc, restarted and captured again, then
restarted on jemalloc (LD_PRELOAD, Debian's libjemalloc2) and captured.  Arenas of the two glibc runs are
matched by their threads' names, whatever numbers the restart gave them; glibc's run against jemalloc's is two
allocators side by side, never an arena matched to an arena."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from browser import Browser, cut_off
from figures import diff_page_disagreements
from conftest import SYSROOTS
from harness import prepare_jemalloc
from services import running
from verdicts import contradictions

pytestmark = pytest.mark.live

HEAPWALK = Path(sys.executable).parent / "heapwalk"
WORKERS = 4


def _heapwalk(*args) -> str:
    result = subprocess.run([str(HEAPWALK), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Captures of three runs of the service: glibc, glibc again, jemalloc (folder of each)."""
    tmp = tmp_path_factory.mktemp("restart")
    library = prepare_jemalloc(SYSROOTS, "bookworm").library
    for name, env in (("glibc", None), ("again", None), ("jemalloc", {**os.environ, "LD_PRELOAD": str(library)})):
        run = tmp / f"run-{name}"
        run.mkdir()
        with running(run, "service", str(WORKERS), env=env) as (proc, _):
            _heapwalk("capture", proc.pid, "--out", tmp / name)
    return tmp


def test_no_run_s_verdict_contradicts_itself(runs):
    for name in ("glibc", "again", "jemalloc"):
        assert contradictions(json.loads((runs / name / "report.json").read_text())) == [], name


def _arenas(folder: Path) -> list[dict]:
    return json.loads((folder / "report.json").read_text())["report"]["arenas"]


def test_a_restart_on_the_same_allocator_matches_arenas_by_their_threads(runs, tmp_path):
    text = _heapwalk("diff", runs / "glibc", runs / "again", "--json", tmp_path / "d.json")
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["restarted"] and d["unmatched"] == [0, 0] and d["arena_counts"] == [WORKERS + 1] * 2
    names = [{a["number"]: tuple(a["thread_names"]) for a in _arenas(runs / run)} for run in ("glibc", "again")]
    by_name = {v: k for k, v in names[0].items()}
    assert sorted(n for v in names[1].values() for n in v) == sorted(
        ["service"] + [f"worker-{i}" for i in range(WORKERS)])
    # each arena of the second run is compared with the first run's arena of the same thread: the same figures
    # (the workers allocate the same), whichever number it had
    system = {a["number"]: a["system"] for a in _arenas(runs / "glibc")}
    for entry in d["arenas"]:
        assert entry["status"] == "both"
        assert entry["system"][0] == system[by_name[names[1][entry["number"]]]]
    assert "matched by the names of the threads that use them" in text
    assert "grew: arena" not in text or all(abs(e["system_growth"]) < 1 << 20 for e in d["arenas"])


def test_a_restart_on_jemalloc_is_two_allocators_side_by_side(runs, tmp_path):
    text = _heapwalk("diff", runs / "glibc", runs / "jemalloc", "--json", tmp_path / "d.json", "--html",
                     tmp_path / "d.html")
    d = json.loads((tmp_path / "d.json").read_text())
    lines = text.splitlines()
    assert lines[0].startswith("two allocators: the first snapshot's is glibc's malloc, the second's jemalloc")
    assert "grew: arena" not in text and "matched by" not in text and "arena 0" not in text
    assert d["arenas"] == [] and d["across"]["titles"] == ["glibc's malloc", "jemalloc"]
    rows = {r["figure"]: (r["a"], r["b"]) for r in d["across"]["rows"]}
    glibc, jemalloc = (json.loads((runs / run / "report.json").read_text())["report"]["totals"]
                       for run in ("glibc", "jemalloc"))
    assert rows["system"] == (glibc["system"], jemalloc["system"]) and rows["rss"] == (glibc["rss"], jemalloc["rss"])
    assert rows["free: dirty"][0] is None and rows["top"][1] is None and rows["free: unsorted"][1] is None
    owners = {o["kind"]: (o["before"], o["after"]) for o in d["rss_by_owner"]}
    assert owners["total"] == tuple(d["process_rss"])        # the RSS by owner adds up to the process's
    with Browser() as browser:
        browser.open(tmp_path / "d.html", 1280)
        body = browser.evaluate("document.body.textContent")
        assert "A is glibc's malloc, B is jemalloc" in body and "mapped (B)" in body and "Grew:" not in body
        assert browser.evaluate("document.querySelectorAll('#owners tbody tr').length") == len(d["rss_by_owner"])
        for width in (1280, 1400):
            assert cut_off(browser, width) == {"cut": [], "hidden": []}, width


def test_the_jemalloc_page_of_a_capture_shows_the_decay_clock_and_tickers(runs):
    """The capture records the process's clock: its page gives each arena's decay clock against it, and each
    thread's decay ticker, as the JSON has them."""
    doc = json.loads((runs / "jemalloc" / "report.json").read_text())
    html = (runs / "jemalloc" / "report.html").read_text()
    clock = doc["jemalloc"]["clock_ns"]
    assert clock
    for a in doc["jemalloc"]["arenas"]:
        ago = (clock - a["decay_clock"]["dirty_epoch_ns"]) / 1e9
        assert f"<td>{ago:.3g} s ago</td>" in html
    tickers = sum(1 for t in doc["jemalloc"]["threads"] if t["decay_ticker"] is True)
    assert f"{tickers} of the {len(doc['jemalloc']['threads'])} threads hold a ticker" in html
    assert html.count("<td>yes</td>") >= tickers


def test_the_diff_page_of_a_restart_reads_at_1280_pixels(runs, tmp_path):
    _heapwalk("diff", runs / "glibc", runs / "again", "--html", tmp_path / "d.html", "--json", tmp_path / "d.json")
    assert diff_page_disagreements((tmp_path / "d.html").read_text(),
                                   json.loads((tmp_path / "d.json").read_text())) == []
    with Browser() as browser:
        browser.open(tmp_path / "d.html", 1280)
        for width in (1280, 1400):
            assert cut_off(browser, width) == {"cut": [], "hidden": []}, width
        assert cut_off(browser, 380)["cut"] == []
        assert browser.evaluate("document.querySelectorAll('#diff-arenas tbody tr').length") == 3 * (WORKERS + 1)
        assert browser.evaluate("document.querySelectorAll('#owners tbody tr').length") >= 3
