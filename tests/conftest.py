"""Shared fixtures: the glibc matrix, reproducer cores (captured once), and gdb runs.

A *glibc* here is "system" (the machine's own libc, with libc6-dbg) or a
Debian suite from `sysroots.SUITES`, unpacked under build/sysroots by
``make sysroots``.  Every reproducer is captured under every glibc into
build/cores/GLIBC/NAME, and heapwalk's JSON for each core is computed with
debug symbols and with them hidden.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "cores" / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "tools"))
sys.path.insert(0, str(ROOT / "tests"))

import foreign  # noqa: E402
import fresh  # noqa: E402
import harness  # noqa: E402
import jebuilds  # noqa: E402
import mibuilds  # noqa: E402
import muslbuilds  # noqa: E402
import sysroots  # noqa: E402
import tcbuilds  # noqa: E402

BUILD = (ROOT / "build").resolve()   # the Makefile links build/ into the cache: captures outlive a clone
CORES = Path(os.environ.get("HEAPWALK_CORES", BUILD / "cores"))
SYSROOTS = BUILD / "sysroots"
BINDIR = BUILD / "bin"
GDBINIT = ROOT / "gdbinit"
#: the glibcs built by hand from release tags (docs/platforms.md): every glibc test runs under them when
#: $HEAPWALK_GLIBC_BUILDS names them; found in the cache, they run the reproducer subset of `HAND_REPRODUCERS`
HAND_BUILT = {s.suite: s for s in sysroots.hand_builds()}
HAND_FULL = bool(os.environ.get(sysroots.BUILDS_VARIABLE))
HAND_SUBSET = () if HAND_FULL else tuple(HAND_BUILT)
HAND_REPRODUCERS = ("bins", "thread_arenas", "mmapped", "many_arenas", "small_vectors")
GLIBCS = ("system", *sysroots.SUITES, *(HAND_BUILT if HAND_FULL else ()))
#: HEAPWALK_FULL_MATRIX=1 runs each costly per-glibc matrix whole; by default (make test, CI) such a matrix runs
#: on a fixed subset (`rotating`), every case still under the system glibc and one other
FULL_MATRIX = bool(os.environ.get("HEAPWALK_FULL_MATRIX"))


def rotating(index: int, glibcs: tuple[str, ...] | list[str] = GLIBCS) -> tuple[str, ...]:
    """The glibcs case INDEX of a costly matrix runs under: every one of GLIBCS with FULL_MATRIX; else the
    system glibc (when it is among them) and one other, the others taking the cases in turn."""
    if FULL_MATRIX:
        return tuple(glibcs)
    others = [g for g in glibcs if g != "system"]
    return tuple([g for g in glibcs if g == "system"] + ([others[index % len(others)]] if others else []))

#: (glibc, variant) of tuned.c's captures the tests use, a fixed subset of the matrix: every variant on the
#: system glibc and on one Debian suite, the suites in turn, and the dynamic one ("") on every glibc
TUNED_CASES = tuple([(g, "") for g in GLIBCS]
                    + [(g, v) for i, v in enumerate(harness.TUNED_VARIANTS)
                       for g in ("system", list(sysroots.SUITES)[i % len(sysroots.SUITES)])])


def _hand_built_line() -> str:
    if not HAND_BUILT:
        return "glibcs built by hand: none (docs/platforms.md)"
    versions = ", ".join(s.version for s in HAND_BUILT.values())
    scope = "every glibc test" if HAND_FULL else "the reproducers " + ", ".join(HAND_REPRODUCERS)
    return f"glibcs built by hand: {versions} from {sysroots.hand_builds_folder()} ({scope})"


def pytest_sessionstart(session):
    """Says which hand-built glibcs join the matrix, also under -q (make test), where the header is not shown."""
    reporter = session.config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(_hand_built_line())
NO_SYMBOLS = "set debug-file-directory /nonexistent"


@dataclass(frozen=True)
class Glibc:
    """One glibc of the matrix: the system's, or a Debian sysroot."""

    name: str
    sysroot: sysroots.Sysroot | None

    @property
    def version(self) -> str:
        return self.sysroot.version if self.sysroot is not None else _system_version()

    def gdb_settings(self, symbols: bool) -> list[str]:
        """gdb -iex settings that open this glibc's cores, with or without its debug symbols."""
        out = [] if symbols else [NO_SYMBOLS]
        if self.sysroot is not None:
            libdir = self.sysroot.libdir
            if symbols:
                out.append(f"set debug-file-directory {self.sysroot.debug_dir}")
            out += [f"set solib-search-path {libdir}", f"set libthread-db-search-path {libdir}",
                    "set auto-load safe-path /"]
        return out


@functools.cache
def _system_version() -> str:
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    libc.gnu_get_libc_version.restype = ctypes.c_char_p
    return libc.gnu_get_libc_version().decode()


def collection_version(name: str) -> str:
    """GLIBC NAME's version, or for a Debian suite whose packages are not fetched yet the oldest it can hold:
    what deciding which tests apply may use, since collecting tests must not reach the network."""
    if name in HAND_BUILT:
        return HAND_BUILT[name].version
    if name == "system":
        return _system_version()
    stamp = SYSROOTS / name / "VERSION"
    return stamp.read_text().strip() if stamp.exists() else sysroots.SUITE_FLOOR[name]


@functools.cache
def glibc(name: str) -> Glibc:
    if name == "system":
        return Glibc(name, None)
    if name in HAND_BUILT:
        return Glibc(name, HAND_BUILT[name])
    return Glibc(name, sysroots.prepare(SYSROOTS, name))


#: the jemallocs of the matrix: Debian suite -> jemalloc version (sysroots.JEMALLOC_SUITES)
JEMALLOCS = tuple(sysroots.JEMALLOC_SUITES)
#: the same with each linked into the program (stripped), sid's (5.3.1, on sid's glibc), and the builds from
#: source heapwalk decodes: what je_dns runs on
JEMALLOC_BUILDS = (*JEMALLOCS, *sysroots.JEMALLOC_LINKED, *sysroots.JEMALLOC_GLIBC, "5.3.0-je", "redis-5.2.1", "5.3.0-noietls", "5.3.0-q8",
                   "5.3.0-vaddr57", "redis-5.2.1-vaddr57", "5.1.0", "5.3.0-debug", "5.3.0-debug-O0", "5.2.1-debug",
                   "5.3.0-q8-debug", "5.3.1", "5.1.0-debug")
#: the builds without statistics, which heapwalk decodes by counting what their extents hold (je_dns's tests
#: compare with the statistics printed, so these run je_hold's, against its ledger, instead)
JEMALLOC_COUNTED = ("5.3.0-nostats",)
#: the builds from source heapwalk names and does not decode yet
JEMALLOC_REFUSED = tuple(name for name in jebuilds.BUILDS if name not in JEMALLOC_BUILDS + JEMALLOC_COUNTED)
#: each of them -> its jemalloc version
JEMALLOC_VERSIONS = {**sysroots.JEMALLOC_SUITES, **sysroots.JEMALLOC_LINKED, **sysroots.JEMALLOC_GLIBC,
                     **{name: b.version for name, b in jebuilds.BUILDS.items()}}


#: variants of a jemalloc capture: the reproducer's MALLOC_CONF (under the build's prefix), or its environment
#: (JE_BACKGROUND: background threads turned on at run time before the snapshot, je_common.h)
JE_VARIANTS = {"": None, "prof": {"MALLOC_CONF": "prof:true,lg_prof_sample:10"},
               "binshards": {"MALLOC_CONF": "bin_shards:1-160:4"}, "background": {"JE_BACKGROUND": "1"}}


@functools.cache
@fresh.exclusive
def capture_jemalloc(suite: str, name: str, variant: str = "") -> harness.Capture:
    """jemalloc reproducer NAME's capture on SUITE's libjemalloc2 (taken now unless a fresh one exists), with
    VARIANT's options."""
    jemalloc = harness.prepare_jemalloc(SYSROOTS, suite)
    outdir = CORES / (f"jemalloc-{suite}" + (f"-{variant}" if variant else ""))
    env = JE_VARIANTS[variant]
    if env:
        env = {jemalloc.conf_variable if k == "MALLOC_CONF" else k: v for k, v in env.items()}
    if not harness.is_fresh_jemalloc(name, outdir, jemalloc, env):
        harness.capture_jemalloc(name, outdir, BINDIR, jemalloc, env)
    meta = json.loads((outdir / name / "meta.json").read_text())
    return harness.Capture(name=name, directory=outdir / name, exe=Path(meta["exe"]), pid=meta["pid"])


@functools.cache
@fresh.exclusive
def capture_rust() -> harness.Capture:
    """The Rust reproducer's capture (cores/jemalloc/rust_hold, on tikv-jemallocator: jemalloc 5.3.0 in the stripped
    program, no statistics), taken now unless a fresh one exists."""
    program = jebuilds.prepare_rust(SYSROOTS)
    directory = CORES / "rust-hold" / "rust_hold"
    inputs = fresh.digest([program], "rust_hold")
    if not fresh.fresh(directory, inputs, ("core", "held.json", "meta.json")):
        (directory / "held.json").unlink(missing_ok=True)
        (directory / fresh.STAMP).unlink(missing_ok=True)
        proc = harness.run_to_snapshot(program, directory)
        cap = harness.Capture(name="rust_hold", directory=directory, exe=program, pid=proc.pid, process=proc)
        try:
            harness.take_core(proc.pid, cap.core)
            (directory / "meta.json").write_text(json.dumps({"name": "rust_hold", "exe": str(program),
                                                             "pid": proc.pid}, indent=2) + "\n")
        finally:
            cap.kill()
        fresh.mark(directory, inputs)
    meta = json.loads((directory / "meta.json").read_text())
    return harness.Capture(name="rust_hold", directory=directory, exe=Path(meta["exe"]), pid=meta["pid"])


#: the tcmalloc builds whose cores are kept (their programs run without a launcher, so gdb opens their cores
#: with the program itself)
TC_CORES = ("bullseye", "bookworm", "bookworm-linked")


def _hold_core(name: str, directory: Path, inputs: str, outputs: tuple[str, ...], build, env: dict[str, str],
               stale: str = "") -> harness.Capture:
    """Reproducer NAME's gcore core in DIRECTORY, taken now unless one made from INPUTS with its OUTPUTS is there:
    BUILD() builds the program, run with ENV to its snapshot; files matching STALE are removed first."""
    if not fresh.fresh(directory, inputs, ("core", "meta.json", *outputs)):
        (directory / fresh.STAMP).unlink(missing_ok=True)
        for old in directory.glob(stale) if stale else ():
            old.unlink()
        exe = build()
        proc = harness.run_to_snapshot(exe, directory, env=env)
        cap = harness.Capture(name=name, directory=directory, exe=exe, pid=proc.pid, process=proc)
        try:
            harness.take_core(proc.pid, cap.core)
            (directory / "meta.json").write_text(json.dumps({"name": name, "exe": str(exe), "pid": proc.pid},
                                                            indent=2) + "\n")
        finally:
            cap.kill()
        fresh.mark(directory, inputs)
    meta = json.loads((directory / "meta.json").read_text())
    return harness.Capture(name=name, directory=directory, exe=Path(meta["exe"]), pid=meta["pid"])


@functools.cache
@fresh.exclusive
def capture_tcmalloc(name: str) -> harness.Capture:
    """cores/tcmalloc/tc_hold.c's gcore core on tcmalloc build NAME (one of TC_CORES), taken now unless a fresh one
    exists; its statistics in stats.json beside it."""
    tc = tcbuilds.prepare_tcmalloc(SYSROOTS, name)
    directory = CORES / f"tcmalloc-{name}" / "tc_hold"
    inputs = fresh.digest([tcbuilds.TC_HOLD, Path(harness.__file__), tc.library], name)
    return _hold_core("tc_hold", directory, inputs, ("stats.json",),
                      lambda: tcbuilds.build_hold(tc, directory.parent / "bin"), tc.environment())


@functools.cache
def foreign_root(arch: str = "arm64") -> Path:
    """ARCH's Debian glibc (libc6, libc6-dbg), unpacked as that system's / (cores/scripts/foreign.py)."""
    return foreign.prepare_root(SYSROOTS, arch)


@functools.cache
def capture_foreign(name: str, arch: str = "arm64", page: int = 4096) -> harness.Capture:
    """Reproducer NAME's core on ARCH, run under qemu-user on ARCH's Debian packages, on a kernel of PAGE-byte
    pages (taken now unless a fresh one exists)."""
    folder = arch if page == 4096 else f"{arch}-{page >> 10}k"
    return foreign.capture(name, CORES / folder / name, BINDIR, foreign_root(arch), arch, page)


def foreign_settings(symbols: bool, arch: str = "arm64") -> list[str]:
    """gdb -iex settings that open ARCH's cores (gdb-multiarch, its root as the sysroot), with or without its
    glibc's debug symbols."""
    root = foreign_root(arch)
    return [f"set sysroot {root}", "set auto-load safe-path /",
            f"set debug-file-directory {root / 'usr/lib/debug'}" if symbols else NO_SYMBOLS]


@functools.cache
@fresh.exclusive
def capture_mimalloc(name: str) -> harness.Capture:
    """cores/mimalloc/mi_hold.c's gcore core on mimalloc build NAME (`mibuilds.MI_BUILDS`), taken now unless a fresh one
    exists; mimalloc's statistics in stats.json and the threads' ledgers beside it."""
    mi = mibuilds.prepare_mimalloc(SYSROOTS, name)
    directory = CORES / f"mimalloc-{name}" / "mi_hold"
    inputs = fresh.digest([mibuilds.MI_HOLD, Path(harness.__file__), mi.library], name, mi.environment())
    return _hold_core("mi_hold", directory, inputs, ("stats.json", "ledger-main.txt"),
                      lambda: mibuilds.build_hold(directory.parent / "bin", mi), mi.environment(), "ledger-*.txt")


#: the ways cores/tcmalloc/rust_gtc runs: Google's tcmalloc's per-CPU caches on (glibc leaves rseq to it), and off
GTC_MODES = {"per-cpu": {"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}, "thread-caches": {}}


@functools.cache
@fresh.exclusive
def capture_gtcmalloc(mode: str) -> harness.Capture:
    """cores/tcmalloc/rust_gtc's gcore core in MODE (`GTC_MODES`), taken now unless a fresh one exists; tcmalloc's
    numeric properties in stats.json beside it."""
    program = tcbuilds.prepare_google(SYSROOTS)
    directory = CORES / f"gtcmalloc-{mode}" / "rust_gtc"
    inputs = fresh.digest([program, Path(harness.__file__)], mode)
    return _hold_core("rust_gtc", directory, inputs, ("stats.json",), lambda: program, GTC_MODES[mode])


@functools.cache
@fresh.exclusive
def capture_musl(suite: str, linkage: str, name: str = "musl_hold") -> harness.Capture:
    """cores/musl/NAME.c's gcore core on SUITE's musl (`muslbuilds.MUSL_SUITES`), linked as LINKAGE
    (`muslbuilds.MUSL_BUILDS`), taken now unless a fresh one exists; its ledger beside it."""
    musl = muslbuilds.prepare_musl(SYSROOTS, suite)
    directory = CORES / f"musl-{suite}-{linkage}" / name
    inputs = fresh.digest([muslbuilds.MUSL_DIR / f"{name}.c", Path(muslbuilds.__file__), Path(harness.__file__),
                           musl.libc], suite, linkage)
    return _hold_core(name, directory, inputs, ("ledger.json",),
                      lambda: muslbuilds.build(name, BINDIR, musl, linkage), {})


@functools.cache
@fresh.exclusive
def capture_musl_arm64(stripped: bool, name: str = "musl_hold") -> harness.Capture:
    """cores/musl/NAME.c on bookworm's arm64 musl, linked statically with the snapshot shim (STRIPPED or not), run
    under qemu-user on that musl's folder, its core completed as an arm64 kernel writes it; its ledger beside it."""
    musl = muslbuilds.prepare_musl(SYSROOTS, "bookworm", "arm64")
    exe = muslbuilds.build_snapshotting(name, BINDIR, musl, stripped)
    directory = CORES / f"musl-{musl.name}-{'stripped' if stripped else 'static'}" / name
    inputs = fresh.digest([exe, Path(foreign.__file__), musl.libc], name)
    if not fresh.fresh(directory, inputs, ("core", "ledger.json", "meta.json")):
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        pid = foreign.run_to_core(exe, [str(directory)], directory, BINDIR, musl.root, linked=True)
        (directory / "meta.json").write_text(json.dumps({"name": name, "exe": str(exe), "pid": pid}))
        fresh.mark(directory, inputs)
    return harness.Capture(name=name, directory=directory, exe=exe, pid=json.loads((directory / "meta.json")
                                                                                    .read_text())["pid"])


#: the jemalloc je_dlopen loads with dlopen: one built with --disable-initial-exec-tls, as such a plugin's must be
DLOPENED = "5.3.0-noietls"


@functools.cache
@fresh.exclusive
def capture_dlopen() -> harness.Capture:
    """je_dlopen's capture (je_hold with jemalloc loaded by dlopen, RTLD_LOCAL, from DLOPENED's library), taken
    now unless a fresh one exists."""
    jemalloc = harness.prepare_jemalloc(SYSROOTS, DLOPENED)
    exe = harness.build("je_dlopen", BINDIR)
    directory = CORES / f"jemalloc-{DLOPENED}-dlopen" / "je_dlopen"
    env = {"JE_LIBRARY": str(jemalloc.library)}
    inputs = fresh.digest([exe, jemalloc.library, Path(harness.__file__)], "je_dlopen", env)
    if not fresh.fresh(directory, inputs, ("core", "held.json", "ledger.json", "meta.json")):
        (directory / fresh.STAMP).unlink(missing_ok=True)
        (directory / "held.json").unlink(missing_ok=True)
        proc = harness.run_to_snapshot(exe, directory, env=env)
        cap = harness.Capture(name="je_dlopen", directory=directory, exe=exe, pid=proc.pid, process=proc)
        try:
            harness.take_core(proc.pid, cap.core)
            (directory / "meta.json").write_text(json.dumps({"name": "je_dlopen", "exe": str(exe), "pid": proc.pid,
                                                             "env": env}, indent=2) + "\n")
        finally:
            cap.kill()
        fresh.mark(directory, inputs)
    meta = json.loads((directory / "meta.json").read_text())
    return harness.Capture(name="je_dlopen", directory=directory, exe=Path(meta["exe"]), pid=meta["pid"])


#: variants of a capture: extra environment for the reproducer
VARIANTS = {"": {}, "hugetlb": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2"}, **harness.TUNED_VARIANTS}


@functools.cache
@fresh.exclusive
def capture(glibc_name: str, name: str, variant: str = "") -> harness.Capture:
    """Reproducer NAME's capture under GLIBC_NAME (taken now unless a fresh one exists)."""
    g = glibc(glibc_name)
    outdir = CORES / (f"{glibc_name}-{variant}" if variant else glibc_name)
    if not harness.is_fresh(name, outdir, g.sysroot, VARIANTS[variant]):
        harness.capture(name, outdir, BINDIR, sysroot=g.sysroot, env=VARIANTS[variant])
    meta = json.loads((outdir / name / "meta.json").read_text())
    return harness.Capture(name=name, directory=outdir / name, exe=Path(meta["exe"]), pid=meta["pid"])


@functools.cache
@fresh.exclusive
def blank_stacks(glibc_name: str, main_tls: bool = False) -> tuple[harness.Capture, Path]:
    """thread_arenas under GLIBC_NAME and a core of the same instant whose threads' stacks, and so their
    TLS, are all zeros: gcore's own output before `harness.repair_core` (which is such a core with
    glibc 2.42+ on Linux 6.13+), with the stacks blanked where gcore did not (with MAIN_TLS the main
    thread's TLS too).  The capture's core is the same instant, intact."""
    g = glibc(glibc_name)
    outdir = CORES / f"{glibc_name}-raw"
    directory = outdir / "thread_arenas"
    if not harness.is_fresh("thread_arenas", outdir, g.sysroot, raw=True):
        harness.capture("thread_arenas", outdir, BINDIR, sysroot=g.sysroot, keep_raw=True)
    meta = json.loads((directory / "meta.json").read_text())
    blank = directory / ("core.blank-tls" if main_tls else "core.blank")
    subprocess.run(["cp", "--sparse=always", str(directory / "core.raw"), str(blank)], check=True)
    harness.blank_thread_stacks(blank, meta["pid"], main_tls)
    return harness.Capture(name="thread_arenas", directory=directory, exe=Path(meta["exe"]), pid=meta["pid"]), blank


def version_tuple(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


@functools.cache
@fresh.exclusive
def corruption(glibc_name: str, mode: str, kernel: bool = False) -> harness.Capture:
    """corrupt.c's core in MODE under GLIBC_NAME (taken now unless a fresh one exists); KERNEL: the kernel's
    crash dump of a crash mode instead of gcore's."""
    g = glibc(glibc_name)
    outdir = CORES / glibc_name
    directory = outdir / (f"corrupt-{mode}-kernel" if kernel else f"corrupt-{mode}")
    if not harness.is_fresh_corruption(mode, outdir, g.sysroot, kernel):
        harness.capture_corruption(mode, outdir, BINDIR, sysroot=g.sysroot, kernel=kernel)
    meta = json.loads((directory / "meta.json").read_text())
    return harness.Capture(name=directory.name, directory=directory, exe=Path(meta["exe"]), pid=meta["pid"])


def gdb_command(target_args: list[str], commands: list[str], iex: list[str] = (), gdbinit: Path = GDBINIT,
                gdb: str = "gdb") -> list[str]:
    """The command line of GDB -batch with heapwalk loaded (from GDBINIT) running COMMANDS on TARGET_ARGS."""
    cmd = [gdb, "-nx", "-batch", "-q"]
    for c in iex:
        cmd += ["-iex", c]
    cmd += ["-x", str(gdbinit)]
    for c in commands:
        cmd += ["-ex", c]
    return cmd + list(target_args)


def run_gdb(target_args: list[str], commands: list[str], iex: list[str] = (), timeout: float = 300,
            env: dict | None = None, gdbinit: Path = GDBINIT, gdb: str = "gdb") -> subprocess.CompletedProcess:
    """Runs GDB -batch with heapwalk loaded (from GDBINIT) and COMMANDS, on TARGET_ARGS (exe core, or -p PID)."""
    cmd = gdb_command(target_args, commands, iex, gdbinit, gdb)
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=full_env)


#: the command line `pip install` put beside this Python
HEAPWALK = Path(sys.executable).parent / "heapwalk"


def heapwalk(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs the installed command line with ARGS, from the project's folder."""
    return subprocess.run([str(HEAPWALK), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def heapwalk_json(target_args: list[str], tmp_path: Path, iex: list[str] = (), before: list[str] = ()) -> dict:
    """heapwalk's full JSON document for a target ('heapwalk arenas --json'), after the commands BEFORE."""
    out = tmp_path / f"heapwalk-{len(list(tmp_path.iterdir()))}.json"
    result = run_gdb(target_args, [*before, f"heapwalk arenas --json {out}"], iex=iex)
    assert out.exists(), f"heapwalk wrote no JSON:\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stdout + result.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="session")
def json_of(tmp_path_factory):
    """json_of(glibc, name, symbols) -> heapwalk's JSON for that core, computed once."""
    tmp = tmp_path_factory.mktemp("json")

    @functools.cache
    def compute(glibc_name: str, name: str, symbols: bool = True, variant: str = "") -> dict:
        c = capture(glibc_name, name, variant)
        return heapwalk_json([str(c.exe), str(c.core)], tmp, iex=glibc(glibc_name).gdb_settings(symbols))
    return compute


@pytest.fixture(scope="session")
def cores() -> dict[str, harness.Capture]:
    """The system glibc's capture of every reproducer."""
    return {name: capture("system", name) for name in harness.REPRODUCERS}


@pytest.fixture(scope="session")
def core_json(cores, json_of) -> dict[str, dict]:
    """heapwalk's JSON (with symbols) for every reproducer core of the system glibc."""
    return {name: json_of("system", name) for name in cores}
