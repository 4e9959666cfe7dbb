"""heapwalk on an arm64 kernel: Debian bookworm's arm64 system booted in qemu-system-aarch64
(cores/scripts/armvm.py), running the reproducers built for arm64 (cores/scripts/foreign.py) as processes of its
own.  There `heapwalk capture` stops a process with ptrace, writes its core (arm64's register sets, its thread
pointers in NT_ARM_TLS) and reports on it with arm64's own gdb and Python; gdb attached to the live process
runs heapwalk; gdb's gcore writes the same instant's core.  Checked here: the captured core, read by
gdb-multiarch on this machine, gives malloc_info's XML to the byte and every thread's tcache the ledger's, as
gcore's core does; the live attach gives the same; jemalloc (Debian's arm64 build, 64 KiB pages) attached
live gives every figure malloc_stats_print printed; the process stays stopped through all of it and then
runs to its end; CPython (Debian's python3.11) attached live gives what sys._debugmallocstats printed; the
capture and heapwalk's commands in gdb change nothing in a process (tests/tools/untouched_driver.py);
gperftools' tcmalloc and mimalloc attached live give every figure they printed.  One boot runs it all (a few
minutes of emulation).  With HEAPWALK_FULL_MATRIX=1 a second boots trixie's kernel built for 16 KiB pages,
where glibc grows and trims in 16 KiB pages: the capture (its page maps of 16 KiB pages) and the live attach
give malloc_info's XML and trim whole 16 KiB pages."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import BINDIR, FULL_MATRIX, SYSROOTS, capture_foreign, run_gdb
from mimalloc_oracle import check as mimalloc_check
from oracle import jemalloc_arena_view, jemalloc_printed_view
from tcmalloc_oracle import check as tcmalloc_check
from untouched_figures import assert_unchanged
from cpython_oracle import matches as cpython_matches

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "cores" / "scripts"))
import armvm  # noqa: E402
import foreign  # noqa: E402
import muslbuilds  # noqa: E402

pytestmark = pytest.mark.vm

#: heapwalk's command line, run by the machine's Python from the project's folder
_CLI = 'python3 -c "import sys; from heapwalk.cli.main import main; sys.argv[0] = \\"heapwalk\\"; sys.exit(main())"'
#: the shell lines that wait until process $PID has stopped itself for its snapshot, then note its state
_WAIT = """n=0; while [ "$(cut -d' ' -f3 /proc/$PID/stat)" != T ] && [ $n -lt 900 ]; do sleep 0.2; n=$((n+1)); done
"""


def _script(bindir: Path) -> str:
    """The machine's command: thread_arenas captured, gcore'd and attached live; cores/glibc/untouched.c captured
    and attached, measured before and after each (tests/tools/untouched_driver.py); then je_dns, CPython
    (cores/cpython/pyobjects.py), musl_hold (static on bookworm's arm64 musl, stripped), tc_hold and mi_hold (on
    Debian's arm64 tcmalloc and mimalloc) run to their snapshots side by side and attached live in turn by one
    gdb, as a script attaching to one process after another would (each gdb and heapwalk's start is half a minute
    of emulation)."""
    gdbinit, exe = f"/host{ROOT}/gdbinit", f"/host{bindir.resolve()}/arm64"   # the guest sees this machine's /
    musl = muslbuilds.build("musl_hold", bindir.resolve(), muslbuilds.prepare_musl(SYSROOTS, "bookworm", "arm64"),
                            "stripped")
    conf = " ".join(f"{k}={v}" for k, v in foreign.harness.JEMALLOC_ENV["je_dns"].items())
    libraries = "/usr/lib/aarch64-linux-gnu"
    held = {"je": (f"env {conf} LD_PRELOAD={libraries}/libjemalloc.so.2 {exe}/je_dns", "report"),
            "py": (f"python3 /host{ROOT}/cores/cpython/pyobjects.py", "report --no-leaks"),
            "musl": (f"/host{musl}", "report --no-leaks"),
            "tc_hold": (f"LD_PRELOAD={libraries}/libtcmalloc_minimal.so.4 {exe}/tc_hold", "report --no-leaks"),
            "mi_hold": (f"LD_PRELOAD={libraries}/libmimalloc.so.2 {exe}/mi_hold", "report --no-leaks")}
    started = "".join(f"mkdir -p /run/{name} && cd /run/{name} && {command} /run/{name} > /run/{name}.log 2>&1 &\n"
                      f"P_{name}=$!\n" for name, (command, _) in held.items())
    waited = "".join(_WAIT.replace("$PID", f"$P_{name}") for name in held)
    attached = " ".join(f'-ex "set logging file /run/{name}-live.txt" -ex "set logging enabled on" '
                        f'-ex "attach $P_{name}" -ex "heapwalk {report} --json /run/{name}-live.json" '
                        f'-ex "heapwalk check" -ex "detach" -ex "set logging enabled off"'
                        for name, (_, report) in held.items())
    resumed = "".join(f"kill -CONT $P_{name}; wait $P_{name}\n" for name in held)
    return f"""export PYTHONDONTWRITEBYTECODE=1 HEAPWALK_VENV=/nonexistent PYTHONPATH=/host{ROOT}
mkdir -p /run/ta
cd /run/ta && {exe}/thread_arenas /run/ta > /run/ta.log 2>&1 &
PID=$!
{_WAIT}echo "before $(cut -d' ' -f3 /proc/$PID/stat)" > /run/states.txt
{_CLI} capture $PID --out /run/cap --no-leaks > /run/capture.txt 2>&1; echo "status $?" >> /run/capture.txt
echo "captured $(cut -d' ' -f3 /proc/$PID/stat)" >> /run/states.txt
gdb -p $PID -batch -ex "gcore /run/gcore.core" > /run/gcore.txt 2>&1
gdb -p $PID -batch -x {gdbinit} -ex "heapwalk report --xml /run/live.xml --json /run/live.json" \\
  -ex "heapwalk check" > /run/live.txt 2>&1
echo "attached $(cut -d' ' -f3 /proc/$PID/stat)" >> /run/states.txt
kill -CONT $PID; wait $PID; echo "exit $?" >> /run/states.txt
echo never > /sys/kernel/mm/transparent_hugepage/enabled 2> /dev/null
printf '#!/bin/sh\\nexec %s "$@"\\n' '{_CLI}' > /run/heapwalk && chmod +x /run/heapwalk
cd /tmp && python3 /host{ROOT}/tests/tools/untouched_driver.py {exe}/untouched /tmp/untouched \\
  /tmp/untouched-data.bin /run/heapwalk /run/ucap /run/untouched.json {gdbinit} > /run/untouched.log 2>&1
{started}{waited}cd /run && gdb -batch -x {gdbinit} -ex "set logging overwrite on" \\
  {attached} > /run/attached.txt 2>&1
{resumed}"""


def _script_16k(bindir: Path) -> str:
    """The 16 KiB-page machine's command: thread_arenas captured and attached live."""
    exe = f"/host{bindir.resolve()}/arm64"
    return f"""export PYTHONDONTWRITEBYTECODE=1 HEAPWALK_VENV=/nonexistent PYTHONPATH=/host{ROOT}
python3 -c "import os; print(os.sysconf('SC_PAGE_SIZE'))" > /run/pagesize.txt
mkdir -p /run/ta && cd /run/ta && {exe}/thread_arenas /run/ta > /run/ta.log 2>&1 &
PID=$!
{_WAIT}{_CLI} capture $PID --out /run/cap --no-leaks > /run/capture.txt 2>&1; echo "status $?" >> /run/capture.txt
gdb -p $PID -batch -x /host{ROOT}/gdbinit -ex "heapwalk report --xml /run/live.xml --json /run/live.json" \\
  -ex "heapwalk check" > /run/live.txt 2>&1
kill -CONT $PID; wait $PID
"""


@pytest.fixture(scope="module")
def machine16k(tmp_path_factory):
    """The 16 KiB-page machine's shared folder after its run."""
    for name in ("thread_arenas",):
        capture_foreign(name)
    out = tmp_path_factory.mktemp("arm64vm16k")
    console = armvm.run(out, _script_16k(BINDIR), flavour="16k")
    assert "heapwalk-vm: status 0" in console, console[-3000:]
    return out


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """The machine's shared folder after its run (the reproducers built for arm64 first)."""
    for name in ("thread_arenas", "je_dns", "tc_hold", "mi_hold"):
        capture_foreign(name)                      # builds them for arm64 (and checks them under qemu-user)
    foreign.build("untouched", BINDIR)
    out = tmp_path_factory.mktemp("arm64vm")
    # the five processes read live run side by side, mimalloc's and tcmalloc's holding hundreds of MiB each: with
    # 2 GiB, gdb's report was refused on mimalloc's for want of memory (367 MiB available, 311 expected)
    console = armvm.run(out, _script(BINDIR), memory_mib=4096)
    assert "heapwalk-vm: status 0" in console, console[-3000:]
    return out


def _host_gdb(core: Path, commands: list[str]):
    """gdb-multiarch on this machine, on CORE of thread_arenas, with the machine's root as the sysroot."""
    result = run_gdb([str(BINDIR / "arm64" / "thread_arenas"), str(core)], commands, gdb="gdb-multiarch",
                     iex=[f"set sysroot {armvm.folder() / 'root'}", "set debug-file-directory /nonexistent"],
                     timeout=900)
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return result


def _tcaches_are_the_ledgers(doc: dict, ledger: dict) -> None:
    threads = {t["lwp"]: t for t in doc["threads"]}
    for lt in ledger["threads"]:
        t = threads[lt["tid"]]
        want = {b["chunk_size"]: b["entries"] for b in lt["tcache"]}
        have = {b["chunk_size"]: b["entries"] for b in t["tcache"]["bins"] if b["index"] < 64} if t["tcache"] else {}
        assert have == want, f"thread {lt['tid']} ({lt['label']})"


@pytest.mark.parametrize("core", ["cap/core", "gcore.core"])
def test_the_capture_reads_as_gcores_core_does(machine, core, tmp_path):
    """The core `heapwalk capture` wrote on arm64, and gdb's gcore of the same stop: each gives malloc_info's
    XML and every thread's tcache (its thread pointer from NT_ARM_TLS), and the heap is sound."""
    xml, doc = tmp_path / "report.xml", tmp_path / "arenas.json"
    result = _host_gdb(machine / core, [f"heapwalk report --xml {xml}", f"heapwalk arenas --json {doc}",
                                        "heapwalk check"])
    assert xml.read_text() == (machine / "ta" / "malloc_info.xml").read_text()
    _tcaches_are_the_ledgers(json.loads(doc.read_text()), json.loads((machine / "ta" / "ledger.json").read_text()))
    assert "heap consistent: no violations" in result.stdout and "9 tcaches" in result.stdout
    if core == "cap/core":
        said = (machine / "capture.txt").read_text()
        assert said.rstrip().endswith("status 0") and "heapwalk: written to /run/cap" in said, said


def test_arm64s_own_gdb_attached_live_gives_malloc_info(machine):
    assert (machine / "live.xml").read_text() == (machine / "ta" / "malloc_info.xml").read_text()
    _tcaches_are_the_ledgers(json.loads((machine / "live.json").read_text()),
                             json.loads((machine / "ta" / "ledger.json").read_text()))
    said = (machine / "live.txt").read_text()
    assert "heap consistent: no violations" in said and "Traceback" not in said, said[-3000:]


def test_the_process_stays_stopped_and_runs_on_to_its_end(machine):
    """Stopped for its snapshot, it is still stopped after the capture and after gdb, and runs to exit 0."""
    assert (machine / "states.txt").read_text().split("\n")[:4] == ["before T", "captured T", "attached T",
                                                                     "exit 0"]


def test_jemalloc_attached_live_on_arm64_is_what_it_printed(machine):
    """Debian's arm64 jemalloc (64 KiB pages) in a process of the arm64 kernel, whose mappings lie near the top
    of its 48-bit address space: every arena and bin malloc_stats_print printed, and the check sound."""
    doc = json.loads((machine / "je-live.json").read_text())
    stats = json.loads((machine / "je" / "stats.json").read_text())["jemalloc"]
    ledger = json.loads((machine / "je" / "ledger.json").read_text())
    sizes = [b["size"] for b in stats["arenas"]["bin"]]
    compared = 0
    for arena in doc["jemalloc"]["arenas"]:
        if arena["index"] != ledger["stats_arena"]:
            printed = stats["stats.arenas"][str(arena["index"])]
            assert jemalloc_arena_view(arena, printed) == jemalloc_printed_view(printed, arena["index"], ledger,
                                                                                sizes)
            compared += 1
    assert compared == 7 and doc["jemalloc"]["page"] == 65536
    assert any(a["address"] >= 1 << 47 for a in doc["jemalloc"]["arenas"])     # above x86-64's user space
    said = (machine / "je-live.txt").read_text()
    assert "jemalloc consistent: no violations" in said, said[-3000:]


def test_cpython_attached_live_on_arm64_is_what_it_printed(machine):
    """Debian's arm64 python3.11 in a process of the arm64 kernel, its arenas near the top of its 48-bit address
    space, symbols absent: every total and every class's row sys._debugmallocstats() printed."""
    said = (machine / "py-live.txt").read_text()
    assert (machine / "py-live.json").exists(), said[-3000:]
    doc = json.loads((machine / "py-live.json").read_text())
    cpython_matches(doc, machine / "py" / "stats.txt")
    assert "CPython 3.11" in " ".join(said.split())


def test_the_capture_and_the_live_commands_change_nothing_on_arm64(machine):
    """cores/glibc/untouched.c in the arm64 machine (transparent huge pages off): its RSS, RssShmem, the
    machine's Shmem and the pages present in each mapping it barely touched are as they were after `heapwalk
    capture` (stopped once it has written its record) and again after heapwalk's commands in gdb attached
    to it (but the vDSO gdb reads when it attaches); the process runs on."""
    path, log = machine / "untouched.json", machine / "untouched.log"
    assert path.exists(), log.read_text()[-3000:] if log.exists() else "no log"
    result = json.loads(path.read_text())
    assert result["record"] and result["running"], result["output"]
    assert_unchanged(result["before"], result["after"])
    said = result["live_output"]
    assert "mmapped chunks: 2, 11 MiB" in said and "nothing leaked" in said and "Traceback" not in said, said
    assert_unchanged(result["after"], result["live"], gdb_attached=True)


if FULL_MATRIX:      # a second boot, of trixie's 16 KiB-page kernel: HEAPWALK_FULL_MATRIX=1 (make test's time)
    def test_on_a_16k_page_kernel_the_capture_and_the_live_attach_trim_whole_pages(machine16k, tmp_path):
        """glibc on trixie's 16 KiB-page kernel (AT_PAGESZ 16384): the live attach and the captured core (read
        here) give malloc_info's XML and every tcache, say the page, and what trim gives back is whole 16 KiB
        pages."""
        assert (machine16k / "pagesize.txt").read_text().strip() == "16384"
        mi = (machine16k / "ta" / "malloc_info.xml").read_text()
        ledger = json.loads((machine16k / "ta" / "ledger.json").read_text())
        live = json.loads((machine16k / "live.json").read_text())
        assert (machine16k / "live.xml").read_text() == mi and live["glibc"]["page_size"] == 16384
        _tcaches_are_the_ledgers(live, ledger)
        xml, doc = tmp_path / "report.xml", tmp_path / "report.json"
        _host_gdb(machine16k / "cap" / "core", [f"heapwalk report --xml {xml} --json {doc}"])
        captured = json.loads(doc.read_text())
        assert xml.read_text() == mi and captured["glibc"]["page_size"] == 16384
        _tcaches_are_the_ledgers(captured, ledger)
        for a in captured["arenas"] + live["arenas"]:
            assert a["trim"]["total"] % 16384 == 0 and a["trim"]["systrim"] % 16384 == 0
        assert sum(a["trim"]["total"] for a in captured["arenas"]) > 0
        assert "heap consistent: no violations" in (machine16k / "live.txt").read_text()
        assert (machine16k / "capture.txt").read_text().rstrip().endswith("status 0")


def test_musl_attached_live_on_arm64_is_the_programs_ledger(machine):
    """musl's malloc (a static program on bookworm's arm64 musl, stripped) in a process of the arm64 kernel: the
    context found by its shape, every allocation of the ledger in use with its bytes, the check sound."""
    said = " ".join((machine / "musl-live.txt").read_text().split())
    assert (machine / "musl-live.json").exists(), said[-3000:]
    doc = json.loads((machine / "musl-live.json").read_text())
    ledger = {a: s for a, s in json.loads((machine / "musl" / "ledger.json").read_text())["live"]}
    assert doc["musl"]["in_use"] == {"allocations": len(ledger), "requested": sum(ledger.values())}
    assert "its shape in" in doc["musl"]["found_by"] and "musl's malloc consistent" in said, said[-3000:]
    assert any(a >= 1 << 47 for a in ledger)          # above x86-64's user space


def test_tcmalloc_and_mimalloc_attached_live_on_arm64_are_what_they_printed(machine):
    """gperftools' tcmalloc and mimalloc in processes of the arm64 kernel, their memory near the top of its 48-bit
    address space: every figure each printed, and the check sound."""
    tcmalloc_check(json.loads((machine / "tc_hold-live.json").read_text()),
                   json.loads((machine / "tc_hold" / "stats.json").read_text()), "2.10")
    assert "tcmalloc consistent" in " ".join((machine / "tc_hold-live.txt").read_text().split())
    mimalloc_check(json.loads((machine / "mi_hold-live.json").read_text()), machine / "mi_hold", "2.0.9")
    assert "mimalloc consistent" in " ".join((machine / "mi_hold-live.txt").read_text().split())
