"""A new allocator is its folder and one line in the registry: a toy allocator, written here in a few lines and
added to the registry from a file gdb sources after heapwalk, is found in a real core and shows in the report
(text, JSON, page), the arenas, the check, the heap map and 'heapwalk diff', with nothing outside this test
edited.  It claims each anonymous writable region of a MiB or more as an arena, half in use."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import ROOT, capture, run_gdb

pytestmark = pytest.mark.cores

TOY = '''
from collections import Counter

import numpy as np

from heapwalk import registry
from heapwalk.face import Allocator, Decoded, NotUsed
from heapwalk.common.mapkinds import FREE, MAP_KINDS, MapKind, add_map_kind
from heapwalk.common.view import ArenaView, HeapStrip, HeapView

SPARE = add_map_kind(MapKind("toy_spare", "spare (toy)", "#abcdef", "s", use=FREE))


class ToyHeap(Decoded):
    name = title = "toy"

    def __init__(self, target, regions):
        self.target, self.regions = target.description, regions

    def view(self):
        arenas = [ArenaView(n, start, "toy", 1, 1, end - start, (end - start) // 2, {"spare": (end - start) // 4}, 0,
                            (end - start) - (end - start) // 2 - (end - start) // 4, 0, True)
                  for n, (start, end) in enumerate(self.regions)]
        return HeapView("toy", tuple(arenas), {n: Counter({a.free["spare"]: 1}) for n, a in enumerate(arenas)}, ())

    def strips(self, reserved=False, leaked=None):
        kinds = np.array([MAP_KINDS.index("in_use"), SPARE], np.uint8)
        return [HeapStrip(n, f"toy heap {n}", start, end, np.array([start, (start + end) // 2], np.uint64),
                          np.array([(start + end) // 2, end], np.uint64), kinds)
                for n, (start, end) in enumerate(self.regions)]


class Toy(Allocator):
    name = title = "toy"

    def load(self, context):
        space = context.target.space
        regions = [(start, end) for start, end in space.writable or space.regions
                   if end - start >= 1 << 20 and not any(m.start <= start < m.end for m in space.mappings)]
        if not regions:
            raise NotUsed("no anonymous memory")
        return ToyHeap(context.target, regions)


registry.add(Toy())
'''


def _toy_run(tmp_path, name: str, commands: list[str]) -> tuple[str, int]:
    """gdb on the system glibc's capture NAME, heapwalk and the toy allocator loaded, running COMMANDS."""
    toy = tmp_path / "toy_allocator.py"
    toy.write_text(TOY)
    cap = capture("system", name)
    result = run_gdb([str(cap.exe), str(cap.core)], [f"source {toy}", *commands])
    assert "Traceback" not in result.stdout + result.stderr and "internal error" not in result.stderr, result.stderr
    return result.stdout, result.returncode


def test_a_toy_allocator_shows_in_every_command(tmp_path):
    out, status = _toy_run(tmp_path, "bins", [
        f"heapwalk report --json {tmp_path}/r.json --html {tmp_path}/r.html", "heapwalk arenas", "heapwalk check",
        f"heapwalk map --svg {tmp_path}/m.svg", "heapwalk threads"])
    assert status == 0, out
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["allocator"] == "toy" and doc["allocators"] == ["toy", "glibc"]
    toy = doc["report"]["arenas"][0]
    assert toy["kind"] == "toy" and toy["in_use"] == toy["system"] // 2 and toy["free"] == {"spare": toy["system"] // 4}
    assert doc["glibc_malloc"]["report"]["arenas"], "glibc's heap is decoded beside the toy"
    text = " ".join(out.split())
    assert "This process allocates with both: toy holds" in text and "glibc's malloc, in use beside toy:" in text
    assert "spare" in text and "toy heap 0" in text and "toy: no findings" in text
    page = (tmp_path / "r.html").read_text()
    assert "toy heap" in page and 'id="glibc-arenas"' in page and "toy comes first, then glibc" in page
    svg = (tmp_path / "m.svg").read_text()
    assert "toy heap" in svg and 'data-kind="toy_spare"' in svg and "spare (toy)" in svg and "#abcdef" in svg


def test_a_toy_allocator_is_diffed(tmp_path):
    for name in ("bins", "thread_arenas"):
        _toy_run(tmp_path, name, [f"heapwalk report --no-leaks --json {tmp_path}/{name}.json"])
    result = subprocess.run([str(ROOT / ".venv" / "bin" / "heapwalk"), "diff", str(tmp_path / "bins.json"),
                             str(tmp_path / "thread_arenas.json")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    before, after = (len(json.loads((tmp_path / f"{n}.json").read_text())["report"]["arenas"])
                     for n in ("bins", "thread_arenas"))
    assert before < after and f"arenas: {before} -> {after}" in result.stdout, result.stdout
    # two programs: the main arena matched to the main arena, the thread arenas of the second not matched
    assert f"0 of the first's and {after - before} of the second's are not matched" in result.stdout, result.stdout


def test_an_allocator_that_cannot_be_decoded_beside_the_toy_is_its_finding(tmp_path):
    """The toy decodes; glibc's malloc, told to decode as a glibc that has no layout, fails beside it: that is
    one of the toy's findings, said in one line, and the command goes on; a check then ends saying that not
    everything was checked (gdb -batch exits 1), never with a bare all-clear."""
    out, status = _toy_run(tmp_path, "bins", ["set heapwalk glibc-version 2.50", "heapwalk check"])
    assert status == 1, out
    assert ("warning: glibc's malloc: glibc's malloc is in this process, but heapwalk could not decode it: no malloc "
            "layout for glibc 2.50") in " ".join(out.split()), out


BROKEN = '''
from heapwalk import registry
from heapwalk.face import Allocator
from heapwalk.common.errors import CannotDecode


class Broken(Allocator):
    name = title = "broken"

    def load(self, context):
        raise CannotDecode("broken 1.0 built with --enable-odd: not decoded yet")


registry.add(Broken())
'''


def test_an_allocator_looked_for_first_that_cannot_be_decoded_is_the_decoded_one_s_finding(tmp_path):
    """An allocator looked for before glibc's (a program's own) is there but cannot be decoded: glibc's heap is
    still decoded, and its report and check say, with the reason, that the other was not (never dropped); the
    verdict says it first, so that glibc's all-clear is never read as the process's."""
    broken = tmp_path / "broken_allocator.py"
    broken.write_text(BROKEN)
    cap = capture("system", "bins")
    result = run_gdb([str(cap.exe), str(cap.core)], [f"source {broken}", "heapwalk check",
                                                     f"heapwalk report --json {tmp_path}/r.json"])
    out = " ".join(result.stdout.split())
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    # the report's last line, an error, so that gdb -batch exits with 1
    assert result.returncode == 1 and "heapwalk report: the report is partial: broken is in this process" in \
        " ".join(result.stderr.split()), result.stderr
    said = "broken is in this process, but heapwalk could not decode it: broken 1.0 built with --enable-odd: not " \
        "decoded yet"
    assert f"warning: broken: {said}" in out, out
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["report"]["verdict"][0].startswith(said) and "glibc's malloc's alone" in doc["report"]["verdict"][0]
    assert out.index("verdict: - broken is in this process") < out.index("neither fragmentation nor a leak")
