"""Pairs of claims one report cannot make together: its verdict's sentences against each other, and against
the figures and states the same document holds.  `contradictions(doc)` lists them for a 'heapwalk report
--json' document of any allocator (and each allocator beside it); the tests run it on every reproducer's
report, plain cores and captures alike.

What is checked:
- resident or not: a target that does not say which pages are in RAM (a plain core) gets no figure said to be
  in RAM, still resident or no longer resident; one that does (a capture, a live process) is not told that a
  plain core does not say;
- leaked or not: "nothing leaked" beside "a leak";
- on or off: jemalloc's background threads said to be off, or their remedy offered, while they run; said to
  purge while they do not; "purge them on time" beside "the pages stay until one does";
- a remedy already in place: another allocator (jemalloc, tcmalloc) offered to a process on it; a cap on the
  arenas at or above the arenas there are; malloc_trim(0) giving back what the report's trim figure is not;
- shares: no percentage above 100.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["contradictions"]

_FIGURE = r"\d[\d,.]* ?(?:B|KiB|MiB|GiB|TiB)"
#: a figure claimed in RAM, or claimed gone from it
_IN_RAM = re.compile(rf"{_FIGURE}(?: of [\w' ]+)? in RAM|still resident|no longer resident|is not in RAM")
_PLAIN = re.compile(r"plain core does not say|this core does not say which pages")


def _human(n: int) -> str:
    from heapwalk.analysis.report import human
    return human(n)


def _parts(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each allocator's document in DOC: the program's, then those beside it."""
    beside = [(v["allocator"], v) for v in doc.values() if isinstance(v, dict) and "allocator" in v]
    return [(doc.get("allocator") or "", doc), *beside]


def contradictions(doc: dict[str, Any]) -> list[str]:
    """Every pair of claims of DOC's verdicts (each allocator's) that cannot both be true, as sentences."""
    out: list[str] = []
    for name, part in _parts(doc):
        out += [f"{name}: {x}" for x in _one(name, part)]
    return out


def _one(name: str, doc: dict[str, Any]) -> list[str]:
    rep = doc.get("report") or {}
    verdict: list[str] = list(rep.get("verdict") or [])
    text = " ".join(verdict)
    out = []
    known = bool(rep.get("residency"))
    for s in verdict:
        if not known and _IN_RAM.search(s) and not _PLAIN.search(s):
            out.append(f"a figure said to be in RAM or not, on a target that does not say: {s!r}")
        if known and _PLAIN.search(s):
            out.append(f"'a plain core does not say' on a target that says which pages are in RAM: {s!r}")
        for pct in re.findall(r"\((\d+)%\)", s):
            if int(pct) > 100:
                out.append(f"a share above 100%: {s!r}")
    if "nothing leaked" in text and any(s.startswith("A leak") or re.search(r"\band a leak\b", s) for s in verdict):
        out.append("'nothing leaked' beside 'a leak'")
    background = (doc.get("jemalloc") or {}).get("background_thread") if name == "jemalloc" else None
    if background is True:
        for claim in ("background_thread is off", "background_thread:true purges", "no background thread purged"):
            if claim in text:
                out.append(f"jemalloc's background threads run, and the verdict says {claim!r}")
    if background is False and ("background threads purge them on time" in text or "had not stepped it" in text):
        out.append("jemalloc's background threads do not run, and the verdict says they purge")
    if "purge them on time" in text and "the pages stay until one does" in text:
        out.append("'purge them on time' beside 'the pages stay until one does'")
    for other in ("jemalloc", "tcmalloc"):
        if name == other and re.search(rf"LD_PRELOAD=lib{other}|\({other}, |, {other}\)", text):
            out.append(f"{other} offered as a remedy to a process on {other}")
    arenas = rep.get("arenas") or []
    for cap in re.findall(r"MALLOC_ARENA_MAX=(\d+)", text):
        if name == "glibc" and len(arenas) <= int(cap) and "caps the arena count" in text:
            out.append(f"MALLOC_ARENA_MAX={cap} offered to a process with {len(arenas)} arenas")
    trim = (rep.get("totals") or {}).get("trim")
    said = re.search(rf"malloc_trim\(0\) would give back ({_FIGURE}) now", text)
    if name == "glibc" and said and isinstance(trim, int) and said.group(1) != _human(trim):
        out.append(f"malloc_trim(0) said to give back {said.group(1)}, the report's trim figure is {_human(trim)}")
    return out
