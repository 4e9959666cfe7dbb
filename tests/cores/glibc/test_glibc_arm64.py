"""glibc's malloc on arm64: the reproducers built with Debian's aarch64 cross compiler, run under qemu-user on
Debian bookworm's arm64 glibc (libc6 2.36, its debug symbols in libc6-dbg), their cores completed as an arm64
kernel writes them (cores/scripts/qemucore.py: each thread's NT_ARM_TLS, NT_FILE, the ELF header pages), read
on this x86-64 machine by gdb-multiarch with the arm64 root as its sysroot, symbols hidden and shown.

Every figure is the one glibc printed at the snapshot: `report --xml` is malloc_info's document byte for byte;
every thread's tcache (found through tpidr and TLS variant I, the offset from libc's own TLS block) holds the
ledger's chunks in the ledger's order; `check` finds the heap consistent; the leak scan finds the reach
ledger's leaks.  `tuned` is left out: its variants are the tunables' matrix, which the x86-64 cores run.
"""

from __future__ import annotations

import json

import pytest

from conftest import capture_foreign, foreign_root, foreign_settings, heapwalk, run_gdb
from harness import REPRODUCERS

pytestmark = pytest.mark.cores

NAMES = [n for n in REPRODUCERS if n != "tuned"]
SYMBOLS = [pytest.param(True, id="symbols"), pytest.param(False, id="nosymbols")]


def _run(name: str, symbols: bool, commands: list[str], page: int = 4096):
    cap = capture_foreign(name, page=page)
    result = run_gdb([str(cap.exe), str(cap.core)], commands, iex=foreign_settings(symbols), gdb="gdb-multiarch",
                     timeout=600)
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return cap, result


@pytest.mark.parametrize("symbols", SYMBOLS)
@pytest.mark.parametrize("name", NAMES)
def test_the_report_is_malloc_info_and_every_tcache_the_ledger(name, symbols, tmp_path):
    xml, doc = tmp_path / "report.xml", tmp_path / "arenas.json"
    cap, result = _run(name, symbols, [f"heapwalk report --xml {xml}", f"heapwalk arenas --json {doc}",
                                       "heapwalk check"])
    assert xml.read_text() == cap.malloc_info.read_text()
    found, ledger = json.loads(doc.read_text()), json.loads(cap.ledger.read_text())
    assert found["glibc"]["version"] == "2.36" and found["findings"] == []
    assert ("symbol main_arena" in result.stdout) == symbols
    threads = {t["lwp"]: t for t in found["threads"]}
    assert len(threads) == len(ledger["threads"])
    for lt in ledger["threads"]:
        t = threads[lt["tid"]]
        assert t["tls_intact"], lt["tid"]
        want = {b["chunk_size"]: b["entries"] for b in lt["tcache"]}
        have = {b["chunk_size"]: b["entries"] for b in t["tcache"]["bins"] if b["index"] < 64} if t["tcache"] else {}
        assert have == want, f"thread {lt['tid']} ({lt['label']})"
    assert "heap consistent: no violations" in result.stdout


#: the reproducers run on a kernel of 64 KiB pages (qemu-user's -p: the program's AT_PAGESZ is 65536); mmapped's
#: 160 KiB request is served from the main arena's top there (its top, grown in 64 KiB pages, holds it), so
#: that reproducer's premise (every request over the threshold mmapped) is one of 4 KiB pages
NAMES_64K = [n for n in NAMES if n != "mmapped"]


@pytest.mark.parametrize("name", NAMES_64K)
def test_on_64k_pages_every_figure_is_glibcs_and_trim_gives_back_whole_pages(name, tmp_path):
    """A kernel of 64 KiB pages (AT_PAGESZ, read from the core's auxiliary vector): malloc_info's XML to the
    byte, every thread's tcache the ledger's, the heap consistent, and what trim gives back whole 64 KiB pages
    (the main arena's top in 64 KiB steps), every free byte either given back or kept."""
    xml, doc = tmp_path / "report.xml", tmp_path / "report.json"
    cap, result = _run(name, False, [f"heapwalk report --xml {xml} --json {doc}", "heapwalk check"], 65536)
    assert xml.read_text() == cap.malloc_info.read_text()
    found, ledger = json.loads(doc.read_text()), json.loads(cap.ledger.read_text())
    assert found["glibc"]["page_size"] == 65536 and "pages of 64 KiB (the kernel's AT_PAGESZ" in result.stdout
    threads = {t["lwp"]: t for t in found["threads"]}
    for lt in ledger["threads"]:
        want = {b["chunk_size"]: b["entries"] for b in lt["tcache"]}
        t = threads[lt["tid"]]
        assert {b["chunk_size"]: b["entries"] for b in t["tcache"]["bins"] if b["index"] < 64} == want if \
            t["tcache"] else not want, f"thread {lt['tid']} ({lt['label']})"
    for a in found["arenas"]:
        trim, acc = a["trim"], a["accounting"]
        assert trim["total"] % 65536 == 0 and trim["systrim"] % 65536 == 0 and trim["resident"] <= trim["total"]
        assert trim["total"] + trim["kept_free"] == acc["free"] + acc["bytes"]["top"] - acc["bytes"]["free_unlisted"]
    assert "heap consistent: no violations" in result.stdout


def test_tcache_is_found_through_the_thread_pointer_without_symbols(tmp_path):
    """No symbol names tcache: its TLS offset is a slot of libc's own TLS block above the thread control
    block (malloc's code reaches it from an anchor another variable shares), tried on every thread."""
    doc = tmp_path / "arenas.json"
    _run("thread_arenas", False, [f"heapwalk arenas --json {doc}"])
    facts = json.loads(doc.read_text())["discovery"]
    assert facts["tcache_tls_offset"]["value"] > 16, facts["tcache_tls_offset"]
    assert facts["tcache_tls_offset"]["found_by"].startswith("candidate TLS offsets tried on every thread (9")
    assert facts["thread_arena_tls_offset"]["value"] > 16


def test_the_leak_scan_finds_the_reach_ledgers_leaks(tmp_path):
    out = tmp_path / "leaks.json"
    cap, result = _run("reach", False, [f"heapwalk leaks --json {out}"])
    lines = [line.split() for line in (cap.directory / "reach.txt").read_text().splitlines()]
    leaked = {int(w[2], 16) - 16: w for w in lines if w[0] == "leaked"}
    reached = {int(w[2], 16) - 16 for w in lines if w[0] == "reached"}
    found = {b["address"]: b for b in json.loads(out.read_text())["leaked"]}
    assert set(found) == set(leaked) and not reached & set(found)
    assert {a for a, b in found.items() if b["unreferenced"]} == {a for a, w in leaked.items() if w[3] == "1"}
    assert f"leaked: {len(leaked)} chunks" in result.stdout


def test_the_command_line_opens_an_arm64_core_with_gdb_multiarch(tmp_path):
    """`heapwalk report CORE EXE --sysroot ROOT` on this x86-64 machine: the default gdb reads only its own
    architecture, so the command line runs gdb-multiarch; the XML is malloc_info's."""
    cap, root = capture_foreign("thread_arenas"), foreign_root()
    out = tmp_path / "report.xml"
    result = heapwalk("report", str(cap.core), str(cap.exe), "--sysroot", str(root), "--no-symbols", "--xml",
                      str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text() == cap.malloc_info.read_text()


def test_a_gdb_that_reads_only_its_own_architecture_is_refused_in_one_line():
    """This machine's plain gdb opens an arm64 core with no registers and calls it i386: heapwalk says whose
    core it is and which gdb reads it, never a reading of it as another architecture's."""
    cap = capture_foreign("bins")
    result = run_gdb([str(cap.exe), str(cap.core)], ["heapwalk report"], iex=foreign_settings(False))
    text = result.stdout + result.stderr
    assert "heapwalk: this is a core of an arm64 process, which this gdb reads as i386: open it with a gdb that " \
        "reads arm64 (gdb-multiarch)" in text
    assert "main_arena" not in text and "Traceback" not in text
