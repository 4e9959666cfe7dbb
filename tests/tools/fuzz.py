"""Mutation fuzzing of heapwalk on reproducer cores: `make fuzz`, and a bounded share of it in `make test`.

Two levels, on cores of glibc reproducers and of processes on jemalloc (tests/tools/je_fuzz_driver.py), on
gperftools' tcmalloc (tests/tools/tc_fuzz_driver.py), on Google's tcmalloc (tests/tools/gtc_fuzz_driver.py), on
mimalloc (tests/tools/mi_fuzz_driver.py) and on musl (tests/tools/musl_fuzz_driver.py):
- engine: gdb loads a core once and tests/tools/fuzz_driver.py runs every command's work on hundreds of mutants
  of its memory (patched malloc metadata, hidden tails as in a truncated core);
- files: mutated copies of the core file (the same fields patched in the file) and truncated copies, each
  opened by a real gdb running every heapwalk command.

A mutant fails when heapwalk raises anything but its one-line refusal, prints a Python traceback or an
"internal error", exceeds the time bound, or shows an impossible figure; an aimed damage (a size of 0, a size
into the next chunk, a zeroed heap page, a broken arena ring, a core cut short) also fails when `check` calls
it clean or an arena is lost.  The run ends with, per damage kind, how many were detected and how many were
named at the exact address.  Every engine mutant that ever failed is kept in
tests/fuzz_regressions.json (by where it lands, so it replays on a fresh capture) and replayed first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "cores" / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "tools"))
sys.path.insert(0, str(ROOT / "tests"))

import harness  # noqa: E402

#: the values the driver overwrites an arena's next with: NULL, junk, an arena further on (skipping one),
#: main_arena (closing the ring early), itself, and the middle of the next arena
RING_LINKS = ("null", "junk", "skip", "main", "self", "interior")

REGRESSIONS = ROOT / "tests" / "fuzz_regressions.json"
DRIVER = ROOT / "tests" / "tools" / "fuzz_driver.py"
JE_DRIVER = ROOT / "tests" / "tools" / "je_fuzz_driver.py"
TC_DRIVER = ROOT / "tests" / "tools" / "tc_fuzz_driver.py"
MI_DRIVER = ROOT / "tests" / "tools" / "mi_fuzz_driver.py"
MUSL_DRIVER = ROOT / "tests" / "tools" / "musl_fuzz_driver.py"
GTC_DRIVER = ROOT / "tests" / "tools" / "gtc_fuzz_driver.py"
COMMANDS = ("heapwalk check", "heapwalk report", "heapwalk arenas", "heapwalk bins", "heapwalk tcache",
            "heapwalk threads", "heapwalk chunks --limit 3")
ALLOCATORS = ("glibc", "jemalloc", "tcmalloc", "gtcmalloc", "mimalloc", "musl")
#: seconds one engine mutant may take (the cores fuzzed are small: a sound one decodes in well under this)
BOUND = 20.0


def regressions(core_key: str) -> list[dict]:
    if not REGRESSIONS.exists():
        return []
    return [r["mutant"] for r in json.loads(REGRESSIONS.read_text()) if r["core"] == core_key]


def remember(core_key: str, failed: list[dict]) -> None:
    """Adds FAILED mutants to the regression file (once each)."""
    known = json.loads(REGRESSIONS.read_text()) if REGRESSIONS.exists() else []
    for m in failed:
        entry = {"core": core_key, "mutant": m}
        if entry not in known:
            known.append(entry)
    REGRESSIONS.write_text(json.dumps(known, indent=1) + "\n")


def engine_fuzz(exe: Path, core: Path, iex: list[str], count: int, seed: int, workdir: Path,
                replay: list[dict] = (), timeout: float = 1800, driver: Path = DRIVER) -> dict:
    """Runs COUNT mutants (after REPLAY) of CORE in one gdb with DRIVER (glibc's, or JE_DRIVER for a core of
    a process on jemalloc); returns the driver's results document."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec = workdir / "spec.json"
    out = workdir / "results.json"
    out.unlink(missing_ok=True)
    spec.write_text(json.dumps({"count": count, "seed": seed, "bound": BOUND, "out": str(out),
                                "replay": list(replay)}))
    cmd = ["gdb", "-nx", "-batch", "-q"]
    for c in iex:
        cmd += ["-iex", c]
    cmd += ["-x", str(ROOT / "gdbinit"), "-x", str(driver), str(exe), str(core)]
    env = {**os.environ, "HEAPWALK_FUZZ_SPEC": str(spec)}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if not out.exists():
        raise RuntimeError(f"the fuzz driver wrote no results:\n{result.stdout}\n{result.stderr}")
    return json.loads(out.read_text())


def tally(documents: list[dict]) -> dict[str, list[int]]:
    """Per aimed damage kind: [mutants, detected (check not clean, or refused), refused with the one line
    (a truncation that takes libc's memory), named at the exact address] over DOCUMENTS' results."""
    out: dict[str, list[int]] = {}
    for document in documents:
        for r in document["results"]:
            if "detected" not in r:
                continue
            row = out.setdefault(r["mutant"]["op"], [0, 0, 0, 0])
            row[0] += 1
            row[1] += r["detected"]
            row[2] += r.get("refused", False)
            row[3] += r["exact"]
    return out


def tally_lines(counts: dict[str, list[int]]) -> list[str]:
    """One line per damage kind: how many mutants were detected, and how many at the exact address."""
    return [f"  {kind:15} {n:5} mutants  {found:5} detected ({refused} refused)  {exact:5} at the exact address"
            for kind, (n, found, refused, exact) in sorted(counts.items())]


def failures(document: dict) -> list[dict]:
    return [r for r in document["results"] if r["outcome"].startswith("FAILED")]


def file_mutants(core: Path, fields: list[tuple[str, int]], count: int, seed: int, workdir: Path
                 ) -> list[tuple[str, Path]]:
    """COUNT damaged copies of CORE: most with one metadata field overwritten in the file, some truncated."""
    rng = random.Random(seed)
    segments = harness._load_segments(core)
    size = core.stat().st_size
    out = []
    for i in range(count):
        path = workdir / f"mutant-{i}.core"
        shutil.copyfile(core, path)
        if i % 3 == 2:
            cut = rng.randrange(size // 8, size)
            os.truncate(path, cut)
            out.append((f"truncated at {cut} of {size} bytes", path))
            continue
        name, address = rng.choice(fields)
        value = rng.choice((0, 0xFFFFFFFFFFFFFFFF, 0x4141414141414141, address + 8, address ^ 0x1000))
        for vaddr, offset, filesz, _ in segments:
            if vaddr <= address < vaddr + filesz - 8:
                with path.open("r+b") as fh:
                    fh.seek(offset + address - vaddr)
                    fh.write(value.to_bytes(8, "little"))
                break
        out.append((f"{name} ({address:#x}) := {value:#x}", path))
    return out


def run_commands(exe: Path, core: Path, iex: list[str], timeout: float = 120) -> tuple[bool, str]:
    """Every heapwalk command on CORE in one gdb: (finished cleanly, output)."""
    cmd = ["gdb", "-nx", "-batch", "-q"]
    for c in iex:
        cmd += ["-iex", c]
    cmd += ["-x", str(ROOT / "gdbinit")]
    for c in COMMANDS:
        cmd += ["-ex", c]
    cmd += [str(exe), str(core)]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"gdb did not finish within {timeout} s"
    output = result.stdout + result.stderr
    clean = result.returncode in (0, 1) and "Traceback" not in output and "internal error" not in output
    return clean, output


def _report(key: str, doc: dict, documents: list[dict]) -> int:
    """Prints the engine run DOC of core KEY, keeps its failed mutants, adds it to DOCUMENTS; its failures."""
    documents.append(doc)
    bad = failures(doc)
    if bad:
        remember(key, [r["mutant"] for r in bad])
    print(f"{key}: {len(doc['results'])} mutants, {len(bad)} failed")
    for r in bad:
        print(f"  {json.dumps(r['mutant'])}\n    {r['outcome'].splitlines()[-1]}")
    return len(bad)


def _file_mutant(exe: Path, path: Path, desc: str, iex: list[str]) -> int:
    """Every command on the damaged core file PATH: 1 when it failed (and is kept), 0 when not (removed)."""
    ok, output = run_commands(exe, path, iex)
    if not ok:
        print(f"  core file mutant FAILED: {desc}\n{output[-2000:]}")
        return 1
    path.unlink()
    return 0


def _fuzz_core(cap, key: str, iex: list[str], args, seed: int, workdir: Path, documents: list[dict],
               driver: Path | None = None) -> int:
    """The engine mutants and the mutated core files of capture CAP (core KEY) with DRIVER (glibc's when None);
    their failures (kept, and printed), the engine run's document added to DOCUMENTS."""
    extra = {} if driver is None else {"driver": driver}
    seed ^= zlib.crc32(key.encode())  # each core its own draws: the same seed would aim the same kinds at all
    doc = engine_fuzz(cap.exe, cap.core, iex, args.count, seed, workdir, regressions(key), **extra)
    failed = _report(key, doc, documents)
    for desc, path in file_mutants(cap.core, [tuple(f) for f in doc["fields"]], args.files, seed, workdir):
        failed += _file_mutant(cap.exe, path, desc, iex)
    return failed


def jemalloc_cores():
    """Each jemalloc reproducer's capture on each of the tests' jemallocs, as (capture, key): those that run on that
    jemalloc as it is (`harness.jemalloc_reproducers`), and je_dlopen, which loads its jemalloc itself."""
    from conftest import DLOPENED, JEMALLOCS, SYSROOTS, capture_dlopen, capture_jemalloc
    for suite in JEMALLOCS:
        for name in harness.jemalloc_reproducers(harness.prepare_jemalloc(SYSROOTS, suite)):
            yield capture_jemalloc(suite, name), f"jemalloc-{suite}/{name}"
    yield capture_dlopen(), f"jemalloc-{DLOPENED}-dlopen/je_dlopen"


def main() -> int:
    from conftest import (GLIBCS, GTC_MODES, NO_SYMBOLS, TC_CORES, capture, capture_gtcmalloc,  # the tests'
                          capture_mimalloc, capture_musl, capture_tcmalloc, glibc)             # captures

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300, help="engine mutants per core (default 300)")
    parser.add_argument("--files", type=int, default=6, help="mutated core files per core (default 6)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workdir", type=Path, default=ROOT / "build" / "fuzz")
    parser.add_argument("--allocator", action="append", choices=ALLOCATORS,
                        help="fuzz only this allocator's cores (repeatable; default: all)")
    args = parser.parse_args()
    only = set(args.allocator or ALLOCATORS)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"seed {seed}")
    failed_total = 0
    documents = []
    for g in GLIBCS if "glibc" in only else ():
        for name in harness.REPRODUCERS:
            if name in ("small_vectors", "main_regions"):
                continue  # large or special: the smaller cores cover the same structures faster
            cap = capture(g, name)
            key = f"{g}/{name}"
            iex = glibc(g).gdb_settings(symbols=(g == "system"))
            failed_total += _fuzz_core(cap, key, iex, args, seed, args.workdir / g / name, documents)
    for cap, key in jemalloc_cores() if "jemalloc" in only else ():
        failed_total += _fuzz_core(cap, key, [NO_SYMBOLS], args, seed, args.workdir / key, documents, JE_DRIVER)
    for name in TC_CORES if "tcmalloc" in only else ():
        cap, key = capture_tcmalloc(name), f"tcmalloc-{name}/tc_hold"
        failed_total += _fuzz_core(cap, key, [NO_SYMBOLS], args, seed, args.workdir / key, documents, TC_DRIVER)
    for mode in GTC_MODES if "gtcmalloc" in only else ():
        cap, key = capture_gtcmalloc(mode), f"gtcmalloc-{mode}/rust_gtc"
        failed_total += _fuzz_core(cap, key, [NO_SYMBOLS], args, seed, args.workdir / key, documents, GTC_DRIVER)
    # mimalloc 2.0.9's segments, 3.0.1's pages and arenas, 3.3.2's theaps and page infos apart, 2.3.2's segments
    # live by their arenas' blocks in use, 3.6.0's page tables at the start of each aligned area
    for suite in ("bookworm", "trixie", "3.3.2", "2.3.2", "sid") if "mimalloc" in only else ():
        cap, key = capture_mimalloc(suite), f"mimalloc-{suite}/mi_hold"
        failed_total += _fuzz_core(cap, key, [NO_SYMBOLS], args, seed, args.workdir / key, documents, MI_DRIVER)
    for suite, linkage in (("bullseye", "dynamic"), ("bookworm", "stripped"), ("trixie", "dynamic")) \
            if "musl" in only else ():
        cap, key = capture_musl(suite, linkage), f"musl-{suite}-{linkage}/musl_hold"
        failed_total += _fuzz_core(cap, key, [NO_SYMBOLS], args, seed, args.workdir / key, documents, MUSL_DRIVER)
    print("aimed damage, every core:")
    print("\n".join(tally_lines(tally(documents))))
    print("fuzz: " + ("all mutants handled" if not failed_total else f"{failed_total} failures"))
    return 1 if failed_total else 0


if __name__ == "__main__":
    sys.exit(main())
