"""The one pass (`heapwalk.glibc.bulk.onepass`) against the careful walkers: on every reproducer's core and every
corruption's, under every glibc of the matrix, decoding through the one pass must give exactly what the
careful walkers give (every list, account, trim estimate and finding), and on the sound cores the one pass
must have vouched for every arena (else it would only be the slow path again).  The leak scan `report` runs
on the chunks in use the one pass kept (keeping only the rows of blocks not reached when read) must find what
the scan that keeps every row finds, and leave some rows out on every sound core."""

from __future__ import annotations

import json
import os

import pytest

from conftest import GLIBCS, ROOT, capture, corruption, glibc, run_gdb, version_tuple

import bench
import harness

pytestmark = pytest.mark.cores


def _lines(glibc_name: str, captures, pure: bool = False, damage: bool = False, ahead: bool = False
           ) -> dict[str, dict]:
    pairs = [[str(c.exe), str(c.core)] for c in captures]
    env = {"HEAPWALK_ONEPASS_CORES": json.dumps(pairs)}
    if ahead:
        env["HEAPWALK_ONEPASS_AHEAD"] = "1"
    if pure:
        env["HEAPWALK_PURE"] = "1"
    if damage:
        env["HEAPWALK_ONEPASS_DAMAGE"] = "1"
    result = run_gdb([], ["source " + str(ROOT / "tests" / "tools" / "onepass_driver.py")],
                     iex=glibc(glibc_name).gdb_settings(symbols=False), timeout=900, env=env)
    lines = [json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines()
             if line.startswith("heapwalk-onepass ")]
    assert len(lines) == len(pairs), result.stdout[-3000:] + result.stderr[-3000:]
    return {os.path.basename(os.path.dirname(line["core"])): line for line in lines}


@pytest.mark.parametrize("glibc_name", GLIBCS)
def test_one_pass_gives_what_the_careful_walkers_give(glibc_name):
    sound = [capture(glibc_name, name) for name in harness.REPRODUCERS]
    version = version_tuple(glibc(glibc_name).version)
    damaged = [corruption(glibc_name, mode) for mode in harness.CORRUPTIONS + harness.CRASHES
               if harness.corruption_applies(mode, version)]
    lines = _lines(glibc_name, sound + damaged)
    wrong = {name: line for name, line in lines.items() if line.get("error") or line["differences"]}
    assert not wrong, json.dumps(wrong, indent=1)
    unvouched = {c.name: lines[c.name] for c in sound
                 if c.name != "main_regions" and not (lines[c.name]["vouched"] == lines[c.name]["arenas"]
                                                      == lines[c.name]["chunks_swept"]
                                                      and lines[c.name]["rows_deferred"] > 0)}
    assert not unvouched, json.dumps(unvouched, indent=1)
    assert sum(line["vouched"] for line in lines.values()) > len(sound)
    assert all(line["native"] for line in lines.values()) or os.environ.get("HEAPWALK_PURE")


def test_one_pass_swept_ahead_gives_what_the_careful_walkers_give():
    """The same with every arena swept ahead on a thread of heapwalk's own (as those of 16 MiB and more are), by
    the decode and by `heapwalk chunks`, on the system glibc's sound and damaged cores."""
    sound = [capture(GLIBCS[0], name) for name in harness.REPRODUCERS]
    version = version_tuple(glibc(GLIBCS[0]).version)
    damaged = [corruption(GLIBCS[0], mode) for mode in harness.CORRUPTIONS + harness.CRASHES
               if harness.corruption_applies(mode, version)]
    lines = _lines(GLIBCS[0], sound + damaged, ahead=True)
    wrong = {name: line for name, line in lines.items() if line.get("error") or line["differences"]}
    assert not wrong, json.dumps(wrong, indent=1)
    assert sum(line["vouched"] for line in lines.values()) > len(sound)


def test_one_pass_in_pure_python_gives_what_the_careful_walkers_give():
    """The same with the C library turned off, as where it was not built (the system glibc's sound cores)."""
    sound = [capture(GLIBCS[0], name) for name in harness.REPRODUCERS]
    lines = _lines(GLIBCS[0], sound, pure=True)
    wrong = {name: line for name, line in lines.items() if line.get("error") or line["differences"]}
    assert not wrong, json.dumps(wrong, indent=1)
    assert not any(line["native"] for line in lines.values())
    assert sum(line["vouched"] for line in lines.values()) >= len(sound)


@pytest.mark.parametrize("shape,ahead", [("ordered", False), ("random", False), ("random", True)],
                         ids=["ordered", "random", "random-swept-ahead"])
def test_one_pass_gives_what_the_careful_walkers_give_on_the_bench_core(shape, ahead):
    """The same on the bench's small core of each shape (9 arenas, some 240,000 chunks; in the random shape
    every list links its chunks in no order): the one pass of `heapwalk report` against the reads of the
    careful walkers, and its leak scan against the one that keeps every row.  Then with one thread arena's heap damaged: the careful walkers
    take that arena alone, and the eight the one pass vouches for give what the careful walkers give (the leak
    scan taking their chunks in use from the pass and the damaged arena's from the careful walk); and with
    one of its bins linked into a chunk another arena holds in use: the careful walkers take both arenas (the
    other's careful walk sees that chunk listed), the one pass vouches for the seven left.  AHEAD: every arena
    swept ahead on a thread of heapwalk's own, as those of 16 MiB and more are."""
    line = _lines(GLIBCS[0], [bench.capture("small", bench.BUILD / "bin", shape)], damage=True, ahead=ahead)["bench"]
    assert not line.get("error") and not line["differences"], json.dumps(line, indent=1)
    assert line["vouched"] == line["arenas"] == 9 and line["chunks_swept"] == 9 and line["rows_deferred"] > 0
    assert line["native"]
    assert line["damaged_arenas"] == 9 and line["damaged_vouched"] == 8, json.dumps(line, indent=1)
    assert not line["damaged_differences"] and line["damaged_found"], json.dumps(line, indent=1)
    assert line["damaged_used_kept"] == 8 and line["damaged_rows_deferred"] > 0, \
        json.dumps(line, indent=1)
    assert line["crossed_arenas"] == 9 and line["crossed_vouched"] == line["crossed_used_kept"] == 7, \
        json.dumps(line, indent=1)
    assert not line["crossed_differences"] and line["crossed_found"] and line["crossed_rows_deferred"] > 0, \
        json.dumps(line, indent=1)
