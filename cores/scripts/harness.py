"""Builds reproducers, runs them to their snapshot point and takes their cores.

A reproducer writes malloc_info.xml and ledger.json into the directory given
as its first argument, then stops itself with SIGSTOP.  The harness waits for
that stop, takes a core with gdb's ``gcore`` (no core_pattern or ulimit
needed), punches holes in the core where gcore wrote zeros (thread-arena
reservations, untouched pages), and kills the process, or keeps it stopped for
live-attach tests.

With a `sysroots.Sysroot` the reproducer runs under that glibc, through the
sysroot's own ld.so with ``--library-path``; the core's program is then that
ld.so, which is what gdb must be given (meta.json records it as "gdb_exe").

gdb 13's gcore writes a whole mapping as zeros when one page of it cannot be
read; glibc 2.42+ on Linux 6.13+ puts thread-stack guard pages inside the
stack mapping (MADV_GUARD_INSTALL), so the stacks, and the TLS on them, come
out blank.  `repair_core` re-reads such segments page by page from the stopped
process and writes back what it finds.

Command line: ``python3 cores/scripts/harness.py OUTDIR [NAME ...] [--glibc SUITE]``
captures the named reproducers (all by default) into OUTDIR/NAME/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import fresh
import jebuilds
import sysroots

#: the reproducers' tree: a folder per allocator, `common` for what they share, `scripts` for this one
CORES_DIR = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent
COMMON = CORES_DIR / "common"
REPRODUCERS = ("bins", "thread_arenas", "small_vectors", "mmapped", "second_heap", "many_arenas", "large_tcache",
               "leak", "main_regions", "tuned", "reach")
#: reproducers that run on Debian's libjemalloc2 (LD_PRELOAD), with no hw.c: they write stats.json
#: (malloc_stats_print "J") and ledger.json themselves
JEMALLOC_REPRODUCERS = ("je_dns", "je_both", "je_hold", "je_leak", "je_dlopen")
#: every program built on jemalloc's entry points (je_common.h): the reproducers and `make bench`'s je_bench
JEMALLOC_PROGRAMS = (*JEMALLOC_REPRODUCERS, "je_bench")
#: their environment: je_dns builds four zones per worker 150 ms apart with a 100 ms decay time, so that the
#: arenas whose threads hold a decay ticker purge in the run (and, on 5.2.1, those whose threads began with
#: free() do not); eight arenas whatever the CPU count, so that each thread has its own
JEMALLOC_ENV = {"je_dns": {"MALLOC_CONF": "narenas:8,dirty_decay_ms:100", "JE_DNS_ROUNDS": "4",
                           "JE_DNS_PAUSE_MS": "150"}}
#: tuned.c's variants, each moving mp_ away from glibc's defaults by one parameter (its own run moves the
#: dynamic threshold and makes glibc 2.43's mmapped_mem drift): variant -> environment
TUNED_VARIANTS = {
    "tunable-mmap_threshold": {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1048576"},
    "tunable-trim_threshold": {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=4194304"},
    "tunable-top_pad": {"GLIBC_TUNABLES": "glibc.malloc.top_pad=1048576"},
    "tunable-mmap_max": {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"},
    "tunable-arena_max": {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
    "tunable-arena_test": {"GLIBC_TUNABLES": "glibc.malloc.arena_test=1"},
    "tunable-tcache_count": {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=3", "HW_TCACHE_FILL": "3"},
    "tunable-tcache_max": {"GLIBC_TUNABLES": "glibc.malloc.tcache_max=600"},
    "tunable-hugetlb": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    "mallopt-mmap_threshold": {"HW_MALLOPT": "mmap_threshold=262144"},
    "mallopt-trim_threshold": {"HW_MALLOPT": "trim_threshold=-1"},
    "mallopt-top_pad": {"HW_MALLOPT": "top_pad=2097152"},
    "mallopt-mmap_max": {"HW_MALLOPT": "mmap_max=1"},
    "mallopt-arena_max": {"HW_MALLOPT": "arena_max=3"},
    "mallopt-arena_test": {"HW_MALLOPT": "arena_test=2"},
}
#: environment a reproducer needs to show its situation
REPRODUCER_ENV = {"large_tcache": {"GLIBC_TUNABLES": "glibc.malloc.tcache_max=2097152"},
                  "main_regions": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2"}}
#: corrupt.c's modes that stop with the damage in place, and those that run on until glibc aborts
CORRUPTIONS = ("fd_bk", "prev_size", "fastbin_size", "tcache_misaligned", "tcache_count", "double_free",
               "overlaps_top", "list_cycle", "unmapped", "free_unlisted", "chunk_size", "nextsize", "mutex",
               "size_zero", "size_into_next", "heap_page_zeroed", "arena_ring",
               "main_arena_next", "tcache_to_stack", "fastbin_to_stack", "top_shrunk", "tcache_in_free",
               "mmapped_grown", "mp_tcache_bins", "spirit_inside")
#: corrupt.c's modes that leave a heap glibc accepts as sound, in a shape of its own: no finding may name them
LEGITIMATE = ("foreign_sbrk", "morecore_failure")
CRASHES = ("abort_double_free", "abort_unaligned_tcache", "abort_tcache_double_free", "abort_fasttop", "abort_out",
           "abort_invalid_pointer", "abort_invalid_size", "abort_munmap", "abort_top_size", "abort_size_vs_prev_size",
           "abort_unsorted", "abort_smallbin", "abort_free_unsorted", "abort_consolidate", "abort_realloc_next_size")
CFLAGS = ("-O1", "-g", "-pthread", "-Wall", "-Wextra", "-Wno-unused-but-set-variable")


class HarnessError(RuntimeError):
    """A reproducer could not be built, did not reach its snapshot, or gcore failed."""


@dataclass
class Capture:
    """One reproducer at its snapshot point: the directory holding its outputs."""

    name: str
    directory: Path
    exe: Path
    pid: int
    process: subprocess.Popen | None = None

    @property
    def core(self) -> Path:
        return self.directory / "core"

    @property
    def malloc_info(self) -> Path:
        return self.directory / "malloc_info.xml"

    @property
    def ledger(self) -> Path:
        return self.directory / "ledger.json"

    @property
    def trim(self) -> Path:
        return self.directory / "trim.json"

    def kill(self) -> None:
        """Ends a kept process (SIGKILL works on a stopped process)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@fresh.exclusive
def build(name: str, bindir: Path, sysroot: sysroots.Sysroot | None = None, static: bool = False,
          jemalloc: sysroots.Jemalloc | None = None) -> Path:
    """Compiles cores/NAME.c with the support library into BINDIR/NAME (against SYSROOT's glibc if it must).

    STATIC links the system glibc into the program and strips it (BINDIR/static/NAME), as
    production static binaries come.  JEMALLOC, when it is an archive, is linked into the program, which is
    stripped (BINDIR/jemalloc-SUITE/NAME), as programs that bring their own jemalloc come.
    """
    linked = jemalloc is not None and jemalloc.archive is not None
    if sysroot is not None and sysroot.needs_own_headers:
        bindir = bindir / sysroot.suite
    if static:
        bindir = bindir / "static"
    if linked:
        bindir = bindir / f"jemalloc-{jemalloc.suite}"
    bindir.mkdir(parents=True, exist_ok=True)
    exe = bindir / name
    sources = [source(f"{name}.c")] + ([] if name in JEMALLOC_PROGRAMS else [COMMON / "hw.c"])
    if name in JEMALLOC_PROGRAMS:
        _build_plugin(name, bindir)
    extra = sysroot.compile_flags() if sysroot is not None else []
    if static:
        extra = [*extra, "-static", "-s"]
    if linked:
        extra = [*extra, "-DJE_LINKED", f"-DJE_PREFIX={jemalloc.prefix}", "-s"]
    libraries = [str(jemalloc.archive), "-lm", "-ldl"] if linked else []
    cmd = ["gcc", *CFLAGS, *extra, f"-I{COMMON}", f"-I{sources[0].parent}", *map(str, sources), *libraries, "-o", str(exe)]
    inputs = fresh.digest(sources + headers(name) + ([jemalloc.archive] if linked else []), CFLAGS,
                          extra)   # where the clone is does not count
    if fresh.marked(exe, inputs):
        return exe
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise HarnessError(f"building {name} failed:\n{result.stderr}")
    fresh.mark(exe, inputs)
    return exe


def headers(name: str) -> list[Path]:
    """The headers and libraries reproducer NAME is built with, beside its own source."""
    own = source(f"{name}.c")
    text = own.read_text()
    shared = [COMMON / f for f in re.findall(r'^#include "(\w+\.h)"', text, re.M)
              if f not in ("hw.h", "je_common.h") and (COMMON / f).exists()]       # bench_shape.h
    if name not in JEMALLOC_PROGRAMS:
        return [COMMON / "hw.h", *shared]
    plugin = own.with_name(f"{name}_plugin.c")
    included = re.findall(r'^#include "(\w+\.c)"', text, re.M)
    return [own.with_name("je_common.h")] + ([plugin] if plugin.exists() else []) \
        + [source(f) for f in included] + shared


def source(name: str) -> Path:
    """Reproducer file NAME (`bins.c`, `hw.h`, `rust_hold`...), in whichever folder of cores/ holds it."""
    found = sorted(CORES_DIR.glob(f"*/{name}"))
    if len(found) != 1:
        raise HarnessError(f"cores/ holds {len(found)} files named {name}")
    return found[0]


@fresh.exclusive
def _build_plugin(name: str, bindir: Path) -> None:
    """Compiles cores/NAME_plugin.c, when there is one, into BINDIR/libNAME_plugin.so (NAME loads it)."""
    code, lib = CORES_DIR / "jemalloc" / f"{name}_plugin.c", bindir / f"lib{name}_plugin.so"
    cmd = ["gcc", *CFLAGS, "-shared", "-fPIC", str(code), "-o", str(lib)]
    if not code.exists() or fresh.marked(lib, fresh.digest([code], CFLAGS)):
        return
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise HarnessError(f"building lib{name}_plugin.so failed:\n{result.stderr}")
    fresh.mark(lib, fresh.digest([code], CFLAGS))


@fresh.exclusive
def build_32bit(bindir: Path) -> Path:
    """Assembles cores/common/stop32.S into BINDIR/stop32, a static i386 program that stops itself."""
    bindir.mkdir(parents=True, exist_ok=True)
    code, exe = COMMON / "stop32.S", bindir / "stop32"
    if fresh.marked(exe, fresh.digest([code])):
        return exe
    obj = bindir / "stop32.o"
    for cmd in (["as", "--32", "-o", str(obj), str(code)], ["ld", "-m", "elf_i386", "-o", str(exe), str(obj)]):
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise HarnessError(f"building stop32 failed ({' '.join(cmd)}):\n{result.stderr}")
    fresh.mark(exe, fresh.digest([code]))
    return exe


def _wait_for_stop(proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        pid, status = os.waitpid(proc.pid, os.WUNTRACED | os.WNOHANG)
        if pid == proc.pid:
            if os.WIFSTOPPED(status):
                return
            proc.returncode = os.waitstatus_to_exitcode(status)
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise HarnessError(f"reproducer exited before its snapshot (status {proc.returncode}): {err.strip()}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise HarnessError(f"reproducer did not reach its snapshot within {timeout:.0f} s")
        time.sleep(0.02)


def run_to_snapshot(exe: Path, directory: Path, env: dict[str, str] | None = None,
                    timeout: float = 120.0, launcher: list[str] | None = None) -> subprocess.Popen:
    """Starts EXE with DIRECTORY as its output folder and waits until it has stopped itself."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in ("malloc_info.xml", "ledger.json", "core", "trim.json", "expected.json", "stats.json"):
        (directory / stale).unlink(missing_ok=True)
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.Popen([*(launcher or []), str(exe), str(directory)], env=full_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_for_stop(proc, timeout)
    return proc


def _run_provable(exe: Path, directory: Path, env: dict[str, str], launcher: list[str] | None,
                  attempts: int = 3) -> subprocess.Popen:
    """run_to_snapshot, run again when the reproducer aborted because it could not prove its ledger.

    hw.c aborts rather than write a ledger it cannot prove (for example when another thread's exit put
    chunks where the proving thread's mallocs find them first); a new run is a new, independent heap.
    """
    for attempt in range(attempts):
        try:
            return run_to_snapshot(exe, directory, env=env, launcher=launcher)
        except HarnessError as exc:
            if attempt == attempts - 1 or "exited before its snapshot (status -6)" not in str(exc):
                raise
    raise AssertionError("unreachable")


def snapshot_core(exe: Path, directory: Path, core: Path, env: dict[str, str] | None = None) -> None:
    """Runs EXE to its snapshot with DIRECTORY as its output folder, writes its core to CORE with gcore, and
    ends it."""
    proc = run_to_snapshot(exe, directory, env=env)
    try:
        take_core(proc.pid, core)
    finally:
        proc.kill()
        proc.wait()


def take_core(pid: int, core: Path, keep_raw: bool = False) -> None:
    """Writes a core of the stopped process PID to CORE with gcore, then makes it sparse.

    With KEEP_RAW, gcore's own output, before `repair_core`, is kept beside it as CORE.raw.
    """
    prefix = core.with_name(core.name + ".gcore")
    for stale in core.parent.glob(f"{prefix.name}.*"):   # left by a capture that was interrupted
        stale.unlink()
    result = subprocess.run(["gcore", "-o", str(prefix), str(pid)], capture_output=True, text=True, timeout=600)
    written = Path(f"{prefix}.{pid}")
    if result.returncode != 0 or not written.exists():
        raise HarnessError(f"gcore failed for pid {pid}: {result.stderr.strip() or result.stdout.strip()}")
    written.rename(core)
    if keep_raw:
        raw = core.with_name(core.name + ".raw")
        subprocess.run(["cp", "--sparse=always", str(core), str(raw)], check=True)
    repair_core(core, pid)
    if shutil.which("fallocate"):
        subprocess.run(["fallocate", "--dig-holes", str(core)], capture_output=True)


_PT_LOAD, _PF_R = 1, 4
_PAGE = 4096


def _load_segments(core: Path) -> list[tuple[int, int, int, int]]:
    """(vaddr, file offset, file size, flags) of every PT_LOAD in the ELF64 core."""
    with core.open("rb") as f:
        ehdr = f.read(64)
        if ehdr[:4] != b"\x7fELF" or ehdr[4] != 2:
            raise HarnessError(f"{core} is not an ELF64 core")
        phoff, = struct.unpack_from("<Q", ehdr, 32)
        phentsize, phnum = struct.unpack_from("<HH", ehdr, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    out = []
    for i in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if p_type == _PT_LOAD and p_filesz:
            out.append((p_vaddr, p_offset, p_filesz, p_flags))
    return out


_PT_NOTE, _NT_PRSTATUS = 4, 1
#: offsets in the x86-64 NT_PRSTATUS note: pr_pid, then pr_reg (user_regs_struct: rsp is word 19, fs_base 21)
_PR_PID, _PR_REG = 32, 112


def core_threads(core: Path) -> list[tuple[int, int, int]]:
    """(lwp, rsp, fs_base) of every thread in the x86-64 core, from its NT_PRSTATUS notes."""
    out = []
    with core.open("rb") as f:
        ehdr = f.read(64)
        phoff, = struct.unpack_from("<Q", ehdr, 32)
        phentsize, phnum = struct.unpack_from("<HH", ehdr, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        for i in range(phnum):
            p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
            if p_type != _PT_NOTE:
                continue
            f.seek(p_offset)
            notes = f.read(p_filesz)
            at = 0
            while at + 12 <= len(notes):
                namesz, descsz, kind = struct.unpack_from("<III", notes, at)
                desc = at + 12 + (namesz + 3 & ~3)
                if kind == _NT_PRSTATUS:
                    lwp, = struct.unpack_from("<i", notes, desc + _PR_PID)
                    regs = struct.unpack_from("<27Q", notes, desc + _PR_REG)
                    out.append((lwp, regs[19], regs[21]))
                at = desc + (descsz + 3 & ~3)
    return out


def blank_thread_stacks(core: Path, pid: int, main_tls: bool = False) -> int:
    """Writes as zeros, in place, the segments of CORE that hold the stack (and so the TLS) of each thread
    but the main one PID, as gcore 13 does on Linux 6.13+ with glibc 2.42+; with MAIN_TLS also the one
    holding the main thread's TLS.  Segments already all zeros are left alone; returns how many were blanked."""
    threads = core_threads(core)
    marks = [sp for lwp, sp, _ in threads if lwp != pid]
    marks += [fs for lwp, _, fs in threads if lwp == pid and main_tls]
    blanked = 0
    with core.open("r+b") as f:
        for vaddr, offset, size, _ in _load_segments(core):
            if not any(vaddr <= mark < vaddr + size for mark in marks):
                continue
            f.seek(offset)
            if f.read(size).count(0) == size:
                continue
            f.seek(offset)
            f.write(bytes(size))
            blanked += 1
    return blanked


def overwrite(core: Path, vaddr: int, data: bytes) -> None:
    """Writes DATA, in place, over the bytes CORE holds for addresses VADDR.. (damage of one structure, such
    as a malloc_par cleared by a stray memset); the range must lie in one segment."""
    for start, offset, size, _ in _load_segments(core):
        if start <= vaddr and vaddr + len(data) <= start + size:
            with core.open("r+b") as f:
                f.seek(offset + vaddr - start)
                f.write(data)
            return
    raise HarnessError(f"{core} holds no segment with {vaddr:#x}..{vaddr + len(data):#x}")


def repair_core(core: Path, pid: int) -> int:
    """Refills readable segments that gcore wrote as all zeros from /proc/PID/mem; returns pages fixed.

    Pages that cannot be read (guard pages) stay zero, as a kernel core would
    leave them.  Only all-zero, readable segments are looked at, so a sound
    core costs one read of its zero segments.
    """
    with core.open("rb") as f:
        if f.read(5)[4:] != b"\x02":
            return 0  # a 32-bit core, taken only to be refused: nothing to repair
    fixed = 0
    zero = bytes(_PAGE)
    with core.open("r+b") as out, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for vaddr, offset, size, flags in _load_segments(core):
            if not flags & _PF_R or vaddr >= 1 << 63:  # the vsyscall page is not in /proc/PID/mem's range
                continue
            out.seek(offset)
            if out.read(size).count(0) != size:
                continue
            for page in range(0, size, _PAGE):
                try:
                    mem.seek(vaddr + page)
                    data = mem.read(min(_PAGE, size - page))
                except OSError:
                    continue
                if data and data != zero[:len(data)]:
                    out.seek(offset + page)
                    out.write(data)
                    fixed += 1
    return fixed


def arena_env() -> dict[str, str]:
    """Bounds the arena count on machines with many cores, so cores stay small.

    The arena limit is 8 x cores; gcore writes each thread arena's 64 MiB
    reservation, so above two cores the harness sets MALLOC_ARENA_MAX=16, the
    default of a two-core machine.
    """
    return {"MALLOC_ARENA_MAX": "16"} if (os.cpu_count() or 1) > 2 else {}


def capture(name: str, outdir: Path, bindir: Path, keep: bool = False, sysroot: sysroots.Sysroot | None = None,
            env: dict[str, str] | None = None, static: bool = False, keep_raw: bool = False) -> Capture:
    """Builds and runs reproducer NAME (under SYSROOT's glibc if given), takes its core into OUTDIR/NAME/core.

    With KEEP the process stays stopped (for live-attach tests); call kill().  With KEEP_RAW gcore's
    unrepaired core is kept too, as core.raw.
    """
    exe = build(name, bindir, sysroot, static)
    directory = outdir / name
    _unmark(directory)
    launcher = sysroot.launcher() if sysroot is not None else None
    full_env = _reproducer_env(name, env)
    proc = _run_provable(exe, directory, full_env, launcher)
    gdb_exe = sysroot.ld_so if sysroot is not None else exe
    cap = Capture(name=name, directory=directory, exe=gdb_exe, pid=proc.pid, process=proc)
    try:
        take_core(proc.pid, cap.core, keep_raw)
        meta = {"name": name, "exe": str(gdb_exe), "program": str(exe), "pid": proc.pid,
                "sysroot": str(sysroot.root) if sysroot is not None else None, "env": env or {}}
        (directory / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    except BaseException:
        cap.kill()
        raise
    if not keep:
        finish(cap)
    fresh.mark(directory, capture_inputs(name, sysroot, env, static))
    return cap


def _reproducer_env(name: str, env: dict[str, str] | None) -> dict[str, str]:
    """Reproducer NAME's environment with ENV added (glibc tunables combine: "a=1:b=2")."""
    full_env = {**arena_env(), **REPRODUCER_ENV.get(name, {})}
    for key, value in (env or {}).items():
        full_env[key] = f"{full_env[key]}:{value}" if key == "GLIBC_TUNABLES" and key in full_env else value
    return full_env


def _libc(sysroot: sysroots.Sysroot | None) -> Path:
    return sysroot.libdir / "libc.so.6" if sysroot is not None else fresh.SYSTEM_LIBC


def _unmark(directory: Path) -> None:
    """Makes DIRECTORY's capture stale while a new one is taken (an interrupted one is never fresh)."""
    if directory.is_dir():
        fresh.stamp_of(directory).unlink(missing_ok=True)


def capture_inputs(name: str, sysroot: sysroots.Sysroot | None = None, env: dict[str, str] | None = None,
                   static: bool = False) -> str:
    """The digest of what reproducer NAME's capture is made from: its sources, this harness, the C library
    it runs on (SYSROOT's or the system's), its environment (ENV added)."""
    return fresh.digest([source(f"{name}.c"), COMMON / "hw.c", *headers(name), Path(__file__), _libc(sysroot)],
                        name, sysroot.suite if sysroot else "system", _reproducer_env(name, env), static)


def is_fresh(name: str, outdir: Path, sysroot: sysroots.Sysroot | None = None, env: dict[str, str] | None = None,
             raw: bool = False) -> bool:
    """Whether OUTDIR/NAME holds a capture of reproducer NAME made from what it would be made from now (with
    RAW, gcore's own core too)."""
    files = ("core", "malloc_info.xml", "ledger.json", "meta.json", "trim.json") + (("core.raw",) if raw else ())
    return fresh.fresh(outdir / name, capture_inputs(name, sysroot, env), files)


def capture_jemalloc(name: str, outdir: Path, bindir: Path, jemalloc: sysroots.Jemalloc,
                     env: dict[str, str] | None = None) -> Capture:
    """Builds jemalloc reproducer NAME, runs it on JEMALLOC (LD_PRELOAD; under the newer glibc it needs, if
    any, through that glibc's ld.so, which is then the core's program for gdb) and takes its core into
    OUTDIR/NAME/core; the process is killed after (it has no trim measurement to make)."""
    exe = build(name, bindir, jemalloc=jemalloc)
    directory = outdir / name
    _unmark(directory)
    glibc = jemalloc.glibc()
    proc = run_to_snapshot(exe, directory, env={**jemalloc.environment(), **_options_named(jemalloc, name),
                                                **(env or {})}, launcher=glibc.launcher() if glibc else None)
    gdb_exe = glibc.ld_so if glibc else exe
    cap = Capture(name=name, directory=directory, exe=gdb_exe, pid=proc.pid, process=proc)
    try:
        take_core(proc.pid, cap.core)
        meta = {"name": name, "exe": str(gdb_exe), "program": str(exe), "pid": proc.pid,
                "sysroot": str(glibc.root) if glibc else None,
                "jemalloc": {"version": jemalloc.version, "library": str(jemalloc.library)}, "env": env or {}}
        (directory / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    finally:
        cap.kill()
    fresh.mark(directory, jemalloc_inputs(name, jemalloc, env))
    return cap


def prepare_jemalloc(dest: Path, name: str) -> sysroots.Jemalloc:
    """jemalloc NAME ready to run on: a Debian suite's (SUITE, SUITE-linked) or one built from source
    (jebuilds.BUILDS)."""
    if name in jebuilds.BUILDS:
        return jebuilds.prepare_build(dest, name)
    return sysroots.prepare_jemalloc(dest, name)


def _options_named(jemalloc: sysroots.Jemalloc, name: str) -> dict[str, str]:
    """Reproducer NAME's environment, its MALLOC_CONF named as JEMALLOC reads it (JE_MALLOC_CONF...)."""
    return {jemalloc.conf_variable if key == "MALLOC_CONF" else key: value
            for key, value in JEMALLOC_ENV.get(name, {}).items()}


def jemalloc_reproducers(jemalloc: sysroots.Jemalloc) -> tuple[str, ...]:
    """The reproducers that run on JEMALLOC as it is (preloaded, or linked in): all but je_dlopen, which loads
    its jemalloc itself (tests/conftest.py runs it), and je_both on a linked build (it is about a shared
    jemalloc beside glibc's malloc) or on one run under another glibc's ld.so (it finds its plugin beside
    /proc/self/exe, which is then that ld.so)."""
    alone = jemalloc.archive is not None or jemalloc.suite in sysroots.JEMALLOC_GLIBC
    return tuple(n for n in JEMALLOC_REPRODUCERS if n != "je_dlopen" and (not alone or n != "je_both"))


def jemalloc_inputs(name: str, jemalloc: sysroots.Jemalloc, env: dict[str, str] | None = None) -> str:
    """The digest of what jemalloc reproducer NAME's capture is made from: its sources, this harness, the
    jemalloc it runs on, its environment."""
    glibc = [Path(_libc(jemalloc.glibc()))] if jemalloc.suite in sysroots.JEMALLOC_GLIBC else []
    return fresh.digest([source(f"{name}.c"), *headers(name), Path(__file__), jemalloc.library, *glibc], name,
                        {**_options_named(jemalloc, name), **(env or {})})


def is_fresh_jemalloc(name: str, outdir: Path, jemalloc: sysroots.Jemalloc, env: dict[str, str] | None = None
                      ) -> bool:
    return fresh.fresh(outdir / name, jemalloc_inputs(name, jemalloc, env), ("core", "stats.json", "ledger.json",
                                                                             "meta.json"))


def corruption_applies(mode: str, version: tuple[int, int]) -> bool:
    """Can corrupt.c's MODE be shown under glibc VERSION? (2.43 has no fastbins; 2.31 has no tcache
    alignment check to abort on; before 2.29 free does not look for a tcache double free, nor malloc at the
    top chunk's size or at an unsorted chunk's links.)"""
    if mode in ("fastbin_size", "fastbin_to_stack", "abort_fasttop", "abort_consolidate"):
        return version < (2, 43)
    if mode == "abort_unaligned_tcache":
        return version >= (2, 32)
    if mode in ("abort_tcache_double_free", "abort_top_size", "abort_unsorted"):
        return version >= (2, 29)
    return True


def _core_pattern_in_cwd() -> None:
    """Makes the kernel write crash dumps as a file "core..." in the crashing process's directory, as
    Debian's default does; a pattern that pipes to a handler or names another directory is replaced (this
    needs root), since the harness must find the dump."""
    path = Path("/proc/sys/kernel/core_pattern")
    pattern = path.read_text().strip()
    if pattern.startswith("core") and "/" not in pattern:
        return
    try:
        path.write_text("core\n")
    except OSError as exc:
        raise HarnessError(f"the kernel writes crash dumps by the pattern {pattern!r}, and it cannot be set to "
                           f"'core' ({exc}): run as root, or set it by hand") from None


def _kernel_crash(cmd: list[str], directory: Path, env: dict[str, str]) -> Path:
    """Runs CMD in DIRECTORY until it dies of a signal and returns the kernel's crash dump of it."""
    _core_pattern_in_cwd()
    for stale in directory.glob("core*"):
        stale.unlink()

    def unlimited_core() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    result = subprocess.run(cmd, cwd=directory, env=env, capture_output=True, text=True, timeout=120,
                            preexec_fn=unlimited_core)
    dumps = list(directory.glob("core*"))
    if result.returncode >= 0 or len(dumps) != 1:
        raise HarnessError(f"{cmd[-2]} left no kernel crash dump in {directory} (status {result.returncode}, "
                           f"{len(dumps)} files): {result.stderr.strip()}")
    return dumps[0]


def capture_corruption(mode: str, outdir: Path, bindir: Path, sysroot: sysroots.Sysroot | None = None,
                       kernel: bool = False) -> Capture:
    """Runs corrupt.c in MODE (under SYSROOT's glibc) and takes its core into OUTDIR/corrupt-MODE/core.

    Corruption modes stop themselves with the damage in place; crash modes run until glibc aborts, under
    gdb, whose gcore takes the core at the abort, or with KERNEL on their own, and the kernel dumps the core
    (into OUTDIR/corrupt-MODE-kernel/core), as a crash in production would.
    """
    exe = build("corrupt", bindir, sysroot)
    directory = outdir / (f"corrupt-{mode}-kernel" if kernel else f"corrupt-{mode}")
    _unmark(directory)
    launcher = sysroot.launcher() if sysroot is not None else []
    gdb_exe = sysroot.ld_so if sysroot is not None else exe
    env = {**os.environ, **arena_env(), "HW_CORRUPT": mode}
    if kernel:
        if mode not in CRASHES:
            raise HarnessError(f"{mode} does not crash: only crash modes leave a kernel core")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "expected.json").unlink(missing_ok=True)
        _kernel_crash([*launcher, str(exe), str(directory)], directory, env).rename(directory / "core")
        cap = Capture(name=f"corrupt-{mode}-kernel", directory=directory, exe=gdb_exe, pid=0)
    elif mode in CRASHES:
        directory.mkdir(parents=True, exist_ok=True)
        for stale in ("core", "expected.json"):
            (directory / stale).unlink(missing_ok=True)
        core = directory / "core"
        repair = (f"python import sys, pathlib; sys.path.insert(0, {str(SCRIPTS)!r}); import harness; "
                  f"harness.repair_core(pathlib.Path({str(core)!r}), gdb.selected_inferior().pid)")
        cmd = ["gdb", "-nx", "-batch", "-ex", "set startup-with-shell off", "-ex", "run", "-ex", f"gcore {core}",
               "-ex", repair, "-ex", "kill", "--args", *launcher, str(exe), str(directory)]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        if not core.exists() or "SIGABRT" not in result.stdout:
            raise HarnessError(f"corrupt {mode} did not abort under gdb:\n{result.stdout}\n{result.stderr}")
        if shutil.which("fallocate"):
            subprocess.run(["fallocate", "--dig-holes", str(core)], capture_output=True)
        cap = Capture(name=f"corrupt-{mode}", directory=directory, exe=gdb_exe, pid=0)
    else:
        proc = run_to_snapshot(exe, directory, env={"HW_CORRUPT": mode, **arena_env()}, launcher=launcher)
        cap = Capture(name=f"corrupt-{mode}", directory=directory, exe=gdb_exe, pid=proc.pid, process=proc)
        try:
            take_core(proc.pid, cap.core)
        finally:
            cap.kill()
    meta = {"name": cap.name, "exe": str(gdb_exe), "program": str(exe), "pid": cap.pid,
            "sysroot": str(sysroot.root) if sysroot is not None else None, "env": {"HW_CORRUPT": mode}}
    (directory / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    fresh.mark(directory, corruption_inputs(mode, sysroot, kernel))
    return cap


def corruption_inputs(mode: str, sysroot: sysroots.Sysroot | None = None, kernel: bool = False) -> str:
    """The digest of what corrupt.c's capture in MODE is made from (its sources, this harness, the C library,
    who dumped the core)."""
    return fresh.digest([source("corrupt.c"), COMMON / "hw.c", COMMON / "hw.h", Path(__file__),
                         _libc(sysroot)], mode, sysroot.suite if sysroot else "system", kernel, arena_env())


def is_fresh_corruption(mode: str, outdir: Path, sysroot: sysroots.Sysroot | None = None, kernel: bool = False
                        ) -> bool:
    directory = outdir / (f"corrupt-{mode}-kernel" if kernel else f"corrupt-{mode}")
    return fresh.fresh(directory, corruption_inputs(mode, sysroot, kernel), ("core", "expected.json", "meta.json"))


def finish(cap: Capture, timeout: float = 60.0) -> None:
    """Resumes a captured reproducer, which measures malloc_trim(0) into trim.json and exits."""
    proc = cap.process
    if proc is None:
        return
    try:
        os.kill(proc.pid, signal.SIGCONT)
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        cap.kill()
        raise HarnessError(f"{cap.name} did not end after its trim measurement") from None
    cap.process = None
    if code != 0:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise HarnessError(f"{cap.name} failed after its snapshot (status {code}): {err.strip()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("names", nargs="*", default=list(REPRODUCERS))
    parser.add_argument("--bindir", type=Path, help="where to build (default OUTDIR/bin)")
    parser.add_argument("--glibc", metavar="SUITE", help="run under the Debian glibc of SUITE (see sysroots.py)")
    parser.add_argument("--jemalloc", metavar="SUITE", help="run the jemalloc reproducers on the Debian "
                        "libjemalloc2 of SUITE, or linked with its libjemalloc-dev for SUITE-linked (see sysroots.py), or "
                        "linked with a jemalloc built from source (see jebuilds.py)")
    parser.add_argument("--sysroots", type=Path, default=CORES_DIR.parent / "build" / "sysroots",
                        help="where sysroots are unpacked (default build/sysroots)")
    args = parser.parse_intermixed_args(argv)
    args.outdir, args.sysroots = args.outdir.resolve(), args.sysroots.resolve()
    bindir = (args.bindir or args.outdir / "bin").resolve()
    sysroot = sysroots.prepare(args.sysroots, args.glibc) if args.glibc else None
    jemalloc = prepare_jemalloc(args.sysroots, args.jemalloc) if args.jemalloc else None
    names = args.names if not jemalloc or args.names != list(REPRODUCERS) else list(jemalloc_reproducers(jemalloc))
    for name in names:
        start = time.monotonic()
        if is_fresh_jemalloc(name, args.outdir, jemalloc) if jemalloc else is_fresh(name, args.outdir, sysroot):
            print(f"{name}: {args.outdir / name / 'core'} is up to date")
            continue
        try:
            cap = capture_jemalloc(name, args.outdir, bindir, jemalloc) if jemalloc else \
                capture(name, args.outdir, bindir, sysroot=sysroot)
        except HarnessError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
        size = cap.core.stat().st_blocks * 512
        print(f"{name}: core {cap.core} ({size / 2**20:.1f} MiB on disk) in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(main())
