"""The gdb version heapwalk reads from `gdb.VERSION`, and which gdbs it refuses (pure; the refusal inside a
real gdb is in tests/cores/commands/test_gdbversions.py)."""

from __future__ import annotations

import pytest

from heapwalk.gdb.gdbversion import parse_gdb_version, unsupported_gdb


@pytest.mark.parametrize("text,version", [
    ("13.1", (13, 1)), ("10.1.90.20210103-git", (10, 1)), ("Fedora Linux 12.1-5.fc37", (12, 1)),
    ("Red Hat Enterprise Linux 8.2-19.el8", (8, 2)), ("18.1", (18, 1)), ("", None), ("unknown", None)])
def test_the_version_is_the_first_dotted_pair(text, version):
    assert parse_gdb_version(text) == version


def test_gdb_10_and_later_run_older_and_unknown_ones_are_refused():
    assert unsupported_gdb("10.1") is None and unsupported_gdb("18.1") is None and unsupported_gdb("19.0") is None
    assert unsupported_gdb("9.2").startswith("heapwalk: gdb 9.2 is older than gdb 10")
    assert unsupported_gdb("Red Hat Enterprise Linux 8.2-19.el8").startswith("heapwalk: gdb 8.2 is older")
    assert unsupported_gdb("") == "heapwalk: cannot tell this gdb's version (''); heapwalk needs gdb 10 or later"
