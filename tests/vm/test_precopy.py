"""The capture's pre-copy on a kernel that tracks soft-dirty pages: Debian bookworm's, in qemu (cores/scripts/vm.py),
whatever this machine's kernel is.  A process keeps writing to its heap (cores/glibc/scribble.c) while the capture
copies it; the pre-copied core must be, page for page, the stop-the-world core taken in the same final stop
(tests/tools/precopy_driver.py), idle and busy; `heapwalk capture` must say what its stop read and what came
from the copies, and record the rounds in capture.json; a capture killed at any moment of it must leave
the process running; and the pre-copy must map or allocate nothing in the process it reads (cores/glibc/untouched.c,
as tests/live/test_untouched.py holds it on this machine's kernel, where a capture does not pre-copy).  The pauses
are measured in `make bench`, not here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "cores" / "scripts"))
import vm  # noqa: E402
from services import build_service  # noqa: E402
from untouched_figures import assert_unchanged  # noqa: E402

pytestmark = pytest.mark.vm

MIB = 64
RATES = {"idle": 0, "busy": 2}          # MiB a second the process writes while it is copied
#: when a capture is killed (with SIGKILL), by what the machine shows of it (a timer would kill it while
#: Python starts under emulation): its copies begun, the process in its stop, its record written at the end
KILLED_AT = {"copying": '[ -e /dev/shm/killed/core.precopy ]',
             "stopped": 'read -r S < /proc/$PID/stat; case "${S##*) }" in t*) true;; *) false;; esac',
             "released": '[ -e /dev/shm/killed/capture.json ]'}


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """The machine's run: (its shared folder, its console)."""
    out = tmp_path_factory.mktemp("precopy")
    subprocess.run(["gcc", "-O2", "-pthread", str(ROOT / "cores" / "glibc" / "scribble.c"), "-o", str(out / "scribble")],
                   check=True)
    python, heapwalk = sys.executable, Path(sys.executable).parent / "heapwalk"
    untouched = build_service("untouched")
    drivers = "".join(
        f"{python} tests/tools/precopy_driver.py /dev/shm/{name} /run/scribble {MIB} 4 {rate} > /run/{name}.log 2>&1\n"
        f"cp /dev/shm/{name}/result.json /run/{name}.json; rm -rf /dev/shm/{name}\n" for name, rate in RATES.items())
    kills = "".join(
        f"setsid {heapwalk} capture $PID --out /dev/shm/killed --no-leaks > /dev/null 2>&1 &\nC=$!; R=no\n"
        f"while kill -0 $C 2> /dev/null; do if {test}; then R=yes; break; fi; sleep 0.02; done\n"
        f"kill -9 $C; wait $C; sleep 0.5\n"
        f"echo \"{name} $R $(cut -d' ' -f3 /proc/$PID/stat)\" >> /run/killed.txt\n"
        f"kill -9 -- -$C 2> /dev/null; rm -rf /dev/shm/killed\n" for name, test in KILLED_AT.items())
    script = f"""cd {ROOT}
export PYTHONDONTWRITEBYTECODE=1
{drivers}mkdir -p /run/cli && /run/scribble /run/cli 32 2 2 &
while [ ! -e /run/cli/ready ]; do sleep 0.2; done
PID=$!
{heapwalk} capture $PID --out /dev/shm/cap --no-leaks > /run/capture.txt 2>&1; echo "status $?" >> /run/capture.txt
cp /dev/shm/cap/capture.json /run/capture.json
{kills}kill $PID
echo never > /sys/kernel/mm/transparent_hugepage/enabled 2> /dev/null
{python} tests/tools/untouched_driver.py {untouched} /dev/shm/untouched /dev/shm/untouched-data.bin {heapwalk} /run/ucap \
  /run/untouched.json > /run/untouched.log 2>&1
"""
    return out, vm.run(out, script, memory_mib=2048, timeout=1200)


def _result(machine, name: str) -> dict:
    out, console = machine
    path = out / f"{name}.json"
    assert path.exists(), f"the driver wrote no result: {(out / f'{name}.log').read_text()[-3000:]}\n{console[-2000:]}"
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", RATES)
def test_the_precopied_core_is_the_stop_the_world_core_of_the_same_instant(machine, name):
    result = _result(machine, name)
    assert result["tracked"], f"kernel {result['kernel']} shows no soft-dirty bits"
    differences = result["differences"]
    assert differences["segments"] is None, differences
    assert differences["different_pages"] == 0, differences
    assert differences["compared"] >= MIB << 20


def test_the_copies_of_an_idle_process_make_its_core(machine):
    result = _result(machine, "idle")
    first = result["rounds"][0]
    # it writes nothing: all but what the kernel itself moved meanwhile (a huge page made of small ones, say)
    # comes from the copies of the first read
    assert result["from_copies"] >= first["stored"] * 9 // 10 and first["stored"] >= MIB << 20


def test_what_a_busy_process_wrote_meanwhile_was_read_again(machine):
    result = _result(machine, "busy")
    again = sum(r["read"] for r in result["rounds"][1:]) + result["written_meanwhile"]
    # the process wrote while it was copied: the proof above held for pages read again, not only for copies
    assert again > 0 and result["from_copies"] > 0


def test_capture_says_what_its_stop_read_and_records_the_rounds(machine):
    out, console = machine
    text = (out / "capture.txt").read_text()
    assert text.rstrip().endswith("status 0"), text[-3000:]
    first = text.splitlines()[0]
    assert first.startswith("heapwalk: process ") and ", what it wrote while heapwalk copied its memory as it ran (" \
        in first and "of the core from those copies" in first, first
    assert "glibc's malloc: arenas (3)" in text
    record = json.loads((out / "capture.json").read_text())
    assert record["precopy"]["rounds"][0]["read"] >= 32 << 20 and record["precopy"]["from_copies"] > 0


def test_a_capture_killed_at_any_moment_leaves_the_process_running(machine):
    out, console = machine
    killed = {name: (reached, state) for name, reached, state in
              (line.split() for line in (out / "killed.txt").read_text().splitlines())}
    assert set(killed) == set(KILLED_AT), console[-2000:]
    # each capture killed where it was meant to be: copying, holding the process stopped, at its end
    assert all(reached == "yes" for reached, _ in killed.values()), killed
    # sleeping or running, never left stopped ("t", "T") by a capture that died holding it
    assert all(state in "SR" for _, state in killed.values()), killed


def test_a_precopied_capture_maps_and_allocates_nothing_in_the_process(machine):
    """cores/glibc/untouched.c captured in the machine, through the pre-copy (soft-dirty bits cleared, the running
    process read, then read again in its stop; the capture stopped once it has written its record, before the
    report it prints from the core): its RSS, RssShmem, the machine's Shmem and the pages present in
    each mapping it barely touched (shared memory, a memfd, private memory, a file never written, mmapped
    chunks' tails) are as they were (transparent huge pages off in the machine, so that the kernel's own
    collapsing moves nothing meanwhile)."""
    out, console = machine
    path = out / "untouched.json"
    log = out / "untouched.log"
    assert path.exists(), (log.read_text()[-3000:] if log.exists() else "") + console[-2000:]
    result = json.loads(path.read_text())
    assert result["record"] and result["running"], result["output"]
    assert result["precopy"] and result["precopy"]["rounds"][0]["read"] > 0, result["output"]
    assert_unchanged(result["before"], result["after"])
