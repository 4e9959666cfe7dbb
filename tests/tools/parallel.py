"""make test's runner: the suite's files in shards run side by side (one per core), then the files whose tests
time the machine itself, alone.

Each file goes whole to one shard, but a file longer than SPLIT seconds goes test function by test function
(its functions read from its source, so that none is missed; its shared fixtures are then set up in each
shard), unless it is one of WHOLE; the shards are balanced by each file's and function's time in the last run (kept in
build/test-times.json, summed over the shards' JUnit reports; tests/times.json before any run).  Programs and
captures the shards share are made once, under cores/scripts/fresh.py's lock.  Arguments are pytest's: given a test
path, or -k/--lf, pytest runs as asked, in one process.  The exit status is pytest's worst.

    python tests/tools/parallel.py [PYTEST_ARGS...]
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMES = ROOT / "build" / "test-times.json"
#: the times of a run on the developers' machine, for a machine that ran none yet
SEED = ROOT / "tests" / "times.json"
#: files whose tests measure time, signals or the machine's load, or move what every test reads (test_discovery
#: hides a sysroot for a moment), or the machine's shared memory (test_untouched: a browser in another shard
#: moves it by megabytes): run alone, after the shards.  (test_bench.py's smoke run times its commands but
#: asserts only what they count: it runs in a shard.)
ALONE = ("test_busy.py", "test_both.py", "test_discovery.py", "test_untouched.py")
#: files never shared out by test function, however long: their module fixture boots a machine (each shard
#: holding one of their tests would boot its own, side by side, and each boot then takes twice as long)
WHOLE = ("test_arm64_vm.py",)
#: a file never timed yet counts as this many seconds
UNTIMED = 10.0
#: a file that took longer than this is shared out by test function (it then sets up its shared fixtures in
#: each shard, which costs more than balancing gains below this)
SPLIT = 600.0
#: pytest's status when it collected no test
NO_TESTS = 5


def shards(files: list[Path], times: dict[str, float], count: int) -> list[list[str]]:
    """FILES (whole, or by test function when longer than SPLIT: `units`) in COUNT shards of about equal time,
    longest first into the shard with least so far; the emulated machines' files (tests/vm) before all others,
    so that no two of them run one after the other in a shard while another shard has none."""
    load = [[0.0, []] for _ in range(count)]
    for unit, seconds in sorted(units(files, times), key=lambda u: (not _machine(u[0]), -u[1])):
        least = min(load, key=lambda s: s[0])
        least[0] += seconds
        least[1].append(unit)
    return [sorted(chosen) for _, chosen in load if chosen]


def _machine(unit: str) -> bool:
    """Whether UNIT (a file, or a test function of one) boots an emulated machine: a file of tests/vm."""
    return Path(unit.split("::")[0]).parent.name == "vm"


def units(files: list[Path], times: dict[str, float]) -> list[tuple[str, float]]:
    """What the shards share out, with its seconds: each file, or each test function of a file that took longer
    than SPLIT (a pytest node id; a function never timed counts its share of its file's time)."""
    out = []
    for f in files:
        spent = times.get(f.name, UNTIMED)
        functions = _functions(f) if spent > SPLIT and f.name not in WHOLE else []
        if len(functions) < 2:
            out.append((str(f), spent))
            continue
        out += [(f"{f}::{name}", times.get(f"{f.name}::{name}", spent / len(functions))) for name in functions]
    return out


def _functions(path: Path) -> list[str]:
    """The test functions a test file defines at its top level."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return []
    return [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.startswith("test_")]


def file_times(report: Path) -> dict[str, float]:
    """Each test file's seconds in the JUnit REPORT (setup, call and teardown of all its tests), and each test
    function's ("FILE::FUNCTION", its parameters together)."""
    times: dict[str, float] = {}
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return times
    for case in root.iter("testcase"):
        module = case.get("classname", "").split(".")
        name = next((m for m in module if m.startswith("test_")), None)
        if name:
            seconds = float(case.get("time") or 0)
            function = f"{name}.py::{case.get('name', '').split('[')[0]}"
            for key in (name + ".py", function):
                times[key] = times.get(key, 0.0) + seconds
    return times


def counts(report: Path) -> tuple[int, int, int]:
    """Tests, failed (failures and errors) and skipped in the JUnit REPORT."""
    try:
        suite = next(ET.parse(report).getroot().iter("testsuite"))
    except (OSError, ET.ParseError, StopIteration):
        return 0, 0, 0
    n = lambda key: int(suite.get(key) or 0)  # noqa: E731
    return n("tests"), n("failures") + n("errors"), n("skipped")


def start(name: str, files: list, args: list[str], work: Path) -> tuple[subprocess.Popen, Path, Path]:
    """pytest on FILES (paths or node ids) with ARGS, its output to WORK/NAME.log, its JUnit report to
    WORK/NAME.xml."""
    log, report = work / f"{name}.log", work / f"{name}.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "", "-p", "no:cacheprovider", f"--basetemp={work / name}",
           f"--junitxml={report}", *args, *map(str, files)]
    out = open(log, "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out.close()
    return proc, log, report


def run(groups: list[list], args: list[str], work: Path, label: str) -> tuple[int, list[Path]]:
    """Each of GROUPS as one pytest, all at once; each one's output printed when it ends.  Returns the worst
    status and the JUnit reports."""
    running = [(f"{label}{i + 1}", *start(f"{label}{i + 1}", g, args, work)) for i, g in enumerate(groups)]
    worst, reports = 0, []
    for name, proc, log, report in running:
        status = proc.wait()
        print(f"==== {name}: {', '.join(Path(str(f)).name for f in groups[int(name[len(label):]) - 1])}",
              flush=True)
        sys.stdout.write(log.read_text(errors="replace"))
        sys.stdout.flush()
        if status != NO_TESTS:
            worst = max(worst, status)
        reports.append(report)
    return worst, reports


def main(argv: list[str]) -> int:
    asked = [a for a in argv if not a.startswith("-") and (ROOT / a.split("::")[0]).exists()]
    if asked or any(a in ("-k", "--lf", "--last-failed", "-x") for a in argv):
        return subprocess.call([sys.executable, "-m", "pytest", "-m", "", *argv], cwd=ROOT)
    jobs = max(1, min(int(os.environ.get("TEST_JOBS", os.cpu_count() or 1)), 4))
    times = json.loads((TIMES if TIMES.exists() else SEED).read_text())
    files = sorted((ROOT / "tests").rglob("test_*.py"))
    shared = [f for f in files if f.name not in ALONE]
    alone = [f for f in files if f.name in ALONE]
    work = Path(tempfile.gettempdir()) / f"heapwalk-tests-{os.getuid()}"
    work.mkdir(exist_ok=True)
    began = time.monotonic()
    worst, reports = run(shards(shared, times, jobs), argv, work, "shard")
    status, more = run([alone], argv, work, "alone")
    worst, reports = max(worst, status), reports + more
    spent: dict[str, float] = {}
    for report in reports:                  # a file shared out is in several reports: its times add up
        for key, seconds in file_times(report).items():
            spent[key] = spent.get(key, 0.0) + seconds
    times.update(spent)
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    TIMES.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")
    total = [sum(c) for c in zip(*(counts(r) for r in reports))]
    print(f"==== all: {total[0]} tests, {total[1]} failed, {total[2]} skipped, in {time.monotonic() - began:.0f} s "
          f"({jobs} shards side by side, then {', '.join(ALONE)} alone)", flush=True)
    return worst if worst else (1 if total[1] else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
