"""A program or a capture is made again when what it is made from changed, by content: a fresh clone (all of
whose files are new) finds the ones in the cache still fresh (cores/scripts/fresh.py)."""

from __future__ import annotations

import json
import os

import fresh


def test_a_digest_follows_the_content_and_the_settings_not_the_file_times(tmp_path):
    source = tmp_path / "a.c"
    source.write_text("int main(void) { return 0; }\n")
    before = fresh.digest([source], "system", {"X": "1"})
    os.utime(source, (1, 1))
    assert fresh.digest([source], "system", {"X": "1"}) == before
    assert fresh.digest([source], "system", {"X": "2"}) != before
    source.write_text("int main(void) { return 1; }\n")
    assert fresh.digest([source], "system", {"X": "1"}) != before
    assert fresh.digest([tmp_path / "gone.c"]) != fresh.digest([source])


def test_a_capture_is_fresh_while_its_inputs_and_its_program_are_those_it_was_made_from(tmp_path):
    exe, capture = tmp_path / "prog", tmp_path / "cap"
    exe.write_bytes(b"\x7fELF")
    capture.mkdir()
    for name in ("core", "meta.json"):
        (capture / name).write_text(json.dumps({"exe": str(exe)}))
    os.utime(exe, (100, 100))
    assert not fresh.fresh(capture, "inputs", ("core",))          # never marked: taken by no one
    fresh.mark(capture, "inputs")
    assert fresh.fresh(capture, "inputs", ("core", "meta.json"))
    assert not fresh.fresh(capture, "other inputs", ("core",))
    assert not fresh.fresh(capture, "inputs", ("core", "trim.json"))
    os.utime(exe)                                                    # the program built again since
    assert not fresh.fresh(capture, "inputs", ("core",))


def test_a_program_is_marked_beside_itself(tmp_path):
    exe = tmp_path / "prog"
    assert not fresh.marked(exe, "x")
    exe.write_bytes(b"")
    fresh.mark(exe, "x")
    assert (tmp_path / "prog.sha").read_text().strip() == "x" and fresh.marked(exe, "x")
    assert not fresh.marked(exe, "y")
