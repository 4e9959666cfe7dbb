"""musl's malloc on arm64 (Alpine on Graviton): cores/musl/musl_hold.c built on Debian bookworm's arm64 musl (1.2.3),
linked statically with the snapshot shim (cores/common/qemusnap.c: a shim preloaded into a dynamic program makes
musl's dynamic linker allocate), with its symbol table and stripped, run under qemu-user, its core completed as an
arm64 kernel writes it (cores/scripts/foreign.py), read here by gdb-multiarch through the command line: the
ledger's allocations and bytes, the groups balanced, the check sound, the context found by its symbol where the
program has one, by its shape where not."""

from __future__ import annotations

import json

import pytest

from conftest import SYSROOTS, capture_musl_arm64, heapwalk
from muslbuilds import prepare_musl

pytestmark = pytest.mark.cores


@pytest.mark.parametrize("stripped", [False, True], ids=["static", "stripped"])
def test_an_arm64_core_gives_the_ledger(stripped, tmp_path):
    cap = capture_musl_arm64(stripped)
    out = tmp_path / "report.json"
    root = prepare_musl(SYSROOTS, "bookworm", "arm64").root
    result = heapwalk("report", str(cap.core), str(cap.exe), "--sysroot", str(root), "--no-symbols", "--check",
                      "--json", str(out))
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0 and "Traceback" not in said, said
    doc = json.loads(out.read_text())
    ledger = {a: s for a, s in json.loads(cap.ledger.read_text())["live"]}
    assert doc["musl"]["in_use"] == {"allocations": len(ledger), "requested": sum(ledger.values())}
    assert doc["report"]["arenas"][0]["balanced"]
    assert ("its shape in" if stripped else "symbol __malloc_context, its shape confirmed") in doc["musl"]["found_by"]
    assert "musl's malloc consistent" in said and "glibc" not in said
