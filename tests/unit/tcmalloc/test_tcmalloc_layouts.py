"""Which of gperftools' layouts heapwalk tries for a version, what it says when a version is newer than any it
measured, and the capture's cap on segments for a program run through the dynamic linker (pure Python)."""

from __future__ import annotations

from heapwalk.capture.corewriter import _LD_SO
from heapwalk.tcmalloc.discovery import _candidates, _unmeasured
from heapwalk.tcmalloc.layout import LAYOUTS


def test_a_version_s_own_layout_is_tried_first_then_the_others_newest_first():
    assert [lay.versions for lay in _candidates("2.8.1")] == ["2.8-2.10", "2.16-2.18", "2.11-2.15"]
    assert [lay.versions for lay in _candidates("2.13")] == ["2.11-2.15", "2.16-2.18", "2.8-2.10"]
    assert [lay.versions for lay in _candidates("2.18.1")] == ["2.16-2.18", "2.11-2.15", "2.8-2.10"]
    assert [lay.versions for lay in _candidates("")] == ["2.16-2.18", "2.11-2.15", "2.8-2.10"]
    assert [lay.versions for lay in _candidates("2.7")] == ["2.16-2.18", "2.11-2.15", "2.8-2.10"]


def test_a_version_newer_than_any_measured_is_said():
    assert _unmeasured("2.10", LAYOUTS[0]) == "" and _unmeasured("2.18.1", LAYOUTS[-1]) == ""
    assert "gperftools 2.19 is newer than any heapwalk measured, 2.18" in _unmeasured("2.19", LAYOUTS[-1])
    assert "does not say its version" in _unmeasured("", LAYOUTS[-1])


def test_the_dynamic_linker_is_told_by_its_name():
    for name in ("/lib64/ld-linux-x86-64.so.2", "/sysroot/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
                 "/lib/ld-linux.so.2", "/lib/ld-2.31.so", "/usr/lib/ld.so"):
        assert _LD_SO.search(name), name
    for name in ("/usr/bin/ld", "/usr/bin/gold", "/opt/old-ld.so.2", "/usr/bin/python3"):
        assert not _LD_SO.search(name), name
