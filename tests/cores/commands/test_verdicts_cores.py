"""No reproducer's verdict contradicts itself or its report (tests/tools/verdicts.py says which pairs of claims are
checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (GTC_MODES, JEMALLOCS, capture, capture_gtcmalloc, capture_jemalloc, capture_mimalloc,
                      capture_musl, capture_tcmalloc)
from harness import REPRODUCERS
from verdicts import contradictions

HEAPWALK = Path(sys.executable).parent / "heapwalk"


def _report(core: Path, exe: Path, out: Path) -> dict:
    result = subprocess.run([str(HEAPWALK), "report", "--no-symbols", "--json", str(out), str(core), str(exe)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr, result.stderr
    return json.loads(out.read_text())


#: every glibc reproducer on the system's glibc; jemalloc's on each Debian suite, with background threads too;
#: mimalloc 2 and 3 and tcmalloc as Debian ships them; musl's malloc, linked and stripped; Google's tcmalloc with its
#: per-CPU caches on and off
CASES = ([("glibc", name) for name in REPRODUCERS]
         + [("jemalloc", (suite, name, variant)) for suite in JEMALLOCS for name, variant in
            (("je_dns", ""), ("je_hold", ""), ("je_leak", ""), ("je_hold", "background"))]
         + [("mimalloc", build) for build in ("bookworm", "trixie")] + [("tcmalloc", "bookworm")]
         + [("musl", ("trixie", linkage)) for linkage in ("dynamic", "stripped")]
         + [("gtcmalloc", mode) for mode in GTC_MODES])


@pytest.mark.cores
@pytest.mark.parametrize("kind,what", CASES, ids=[f"{k}-{w if isinstance(w, str) else '-'.join(filter(None, w))}"
                                                   for k, w in CASES])
def test_no_reproducer_s_verdict_contradicts_itself(kind, what, tmp_path):
    cap = {"glibc": lambda: capture("system", what), "jemalloc": lambda: capture_jemalloc(*what),
           "mimalloc": lambda: capture_mimalloc(what), "tcmalloc": lambda: capture_tcmalloc(what),
           "musl": lambda: capture_musl(*what), "gtcmalloc": lambda: capture_gtcmalloc(what)}[kind]()
    doc = _report(cap.core, cap.exe, tmp_path / "report.json")
    assert doc["report"]["verdict"]
    assert contradictions(doc) == []
