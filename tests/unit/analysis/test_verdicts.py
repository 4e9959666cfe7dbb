"""No verdict contradicts itself or its report (tests/tools/verdicts.py says which pairs of claims are checked): the
checker on documents made to contradict (the reproducers' reports: test_verdicts_cores.py; the captures'
verdicts where the services' tests take them: test_service, test_restart, test_redis)."""

from __future__ import annotations

import pytest

from verdicts import contradictions


def _doc(verdict: list[str], allocator: str = "glibc", residency: str | None = None, **more) -> dict:
    report = {"verdict": verdict, "residency": residency, "arenas": [{}] * 3, "totals": {"trim": 0}}
    return {"allocator": allocator, "report": report, **more}


@pytest.mark.parametrize("verdict,allocator,residency,more,found", [
    (["Fragmentation, not a leak: 3 MiB of the 4 MiB of malloc's arenas in RAM (75%) is free."], "glibc", None, {},
     "in RAM or not, on a target that does not say"),
    (["Free memory, but not in RAM: 3 MiB is no longer resident."], "glibc", None, {}, "does not say"),
    (["Whether this free memory costs RAM a plain core does not say."], "glibc", "the page map", {},
     "on a target that says"),
    (["A leak, not fragmentation: 2 MiB.", "The leak scan ...: nothing leaked."], "glibc", None, {},
     "'nothing leaked' beside 'a leak'"),
    (["decay advances only while threads of the arena call the allocator (background_thread is off; "
      "background_thread:true purges them on time)"], "jemalloc", None, {"jemalloc": {"background_thread": True}},
     "background threads run"),
    (["jemalloc's background threads purge them on time."], "jemalloc", None, {"jemalloc": {"background_thread": False}},
     "do not run"),
    (["jemalloc's background threads purge them on time", "so the pages stay until one does."], "jemalloc", None,
     {"jemalloc": {}}, "'purge them on time' beside"),
    (["Fewer arenas or an allocator that returns small-object pages (jemalloc, tcmalloc) would shrink it."],
     "jemalloc", None, {"jemalloc": {}}, "jemalloc offered as a remedy"),
    (["MALLOC_ARENA_MAX=4 caps the arena count."], "glibc", None, {}, "offered to a process with 3 arenas"),
    (["malloc_trim(0) would give back 8 MiB now."], "glibc", None, {}, "the report's trim figure is 0 B"),
    (["5 MiB of the 4 MiB (125%) is free."], "glibc", None, {}, "a share above 100%"),
])
def test_the_checker_finds_each_kind_of_contradiction(verdict, allocator, residency, more, found):
    said = contradictions(_doc(verdict, allocator, residency, **more))
    assert said and all(found in x for x in said), said


def test_the_checker_passes_a_verdict_that_agrees_with_itself():
    verdict = ["Fragmentation, not a leak: 3 MiB of the 4 MiB malloc holds in its arenas (75%) is free.",
               "Whether this free memory costs RAM a plain core does not say: ... says which pages are in RAM.",
               "The leak scan reached every chunk in use from the program's roots: nothing leaked.",
               "malloc_trim(0) would give back 0 B now."]
    assert contradictions(_doc(verdict)) == []
    beside = _doc(["jemalloc's background threads purge them on time."], "jemalloc",
                  jemalloc={"background_thread": True}, glibc_malloc=_doc(verdict))
    assert contradictions(beside) == []
