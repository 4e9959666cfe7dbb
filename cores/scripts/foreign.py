"""Reproducers of another architecture: built with Debian's cross compiler, run under qemu-user on that
architecture's Debian packages, their cores completed as its kernel writes them.

`prepare_root` unpacks a Debian suite's libc6 and libc6-dbg of the architecture (fetched by apt with a
private source list, package lists and cache, as `sysroots` fetches other suites) into a folder laid out as
that system's `/`: the program runs on it under ``qemu-ARCH -L ROOT``, and gdb opens its cores with ``set
sysroot ROOT``.  `capture` builds a reproducer (cores/glibc/NAME.c with cores/common/hw.c, or a jemalloc one) and
runs it to its snapshot with cores/common/qemusnap.c preloaded: where the program would stop itself for
gcore, the shim writes process.txt (each thread's thread pointer, the mappings) and aborts; qemu writes the
program's core, which `qemucore.complete` turns into what the kernel would have written.

Command line: ``python3 cores/scripts/foreign.py OUTDIR [NAME...] [--arch arm64]`` prepares the root, and
captures reproducer NAME into OUTDIR/NAME.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import fresh
import harness
import qemucore
import sysroots

__all__ = ["ARCHES", "Foreign", "ForeignError", "prepare_root", "build", "capture", "tools_missing"]


class ForeignError(RuntimeError):
    """A root, a build or a run of another architecture failed."""


@dataclass(frozen=True)
class Foreign:
    """One architecture the reproducers run on under qemu-user: Debian's name for it, its multiarch triplet,
    the suite whose packages it runs on."""

    arch: str
    triplet: str
    suite: str

    @property
    def compiler(self) -> str:
        return f"{self.triplet}-gcc"

    @property
    def qemu(self) -> str:
        return f"qemu-{self.triplet.split('-')[0]}"


ARCHES = {"arm64": Foreign("arm64", "aarch64-linux-gnu", "bookworm")}
#: the Debian packages a test machine needs for them (the cross compiler brings the target's libc headers)
TOOLS = {"arm64": ("gcc-aarch64-linux-gnu", "qemu-user", "gdb-multiarch")}


def tools_missing(arch: str = "arm64") -> list[str]:
    """The programs ARCH's reproducers need that this machine lacks."""
    f = ARCHES[arch]
    return [p for p in (f.compiler, f.qemu, "gdb-multiarch") if shutil.which(p) is None]


def _fetch(arch: Foreign, packages: list[str], cache_name: str = "") -> list[Path]:
    """PACKAGES of ARCH's suite, from the cache (CACHE_NAME in the apt cache, the architecture's by default) or
    downloaded into it."""
    cache = sysroots.cache_dir() / (cache_name or arch.arch)
    folder = cache / "debs" / arch.suite
    folder.mkdir(parents=True, exist_ok=True)
    options = [*sysroots._apt_options(cache), "-o", f"APT::Architecture={arch.arch}",
               "-o", f"APT::Architectures={arch.arch}"]
    missing = [p for p in packages if not list(folder.glob(f"{p}_*_{arch.arch}.deb"))]
    if missing:
        for d in ("lists/partial", "cache/archives/partial"):
            (cache / d).mkdir(parents=True, exist_ok=True)
        (cache / "sources.list").write_text(
            f"deb [signed-by={sysroots.KEYRING}] {sysroots._mirror()} {arch.suite} main\n")
        sysroots._run(["apt-get", *options, "update"])
        sysroots._run(["apt-get", *options, "download", *(f"{p}/{arch.suite}" for p in missing)], cwd=folder)
    out = []
    for p in packages:
        found = sorted(folder.glob(f"{p}_*_{arch.arch}.deb"))
        if not found:
            raise ForeignError(f"apt-get download {p}/{arch.suite} ({arch.arch}) wrote no .deb")
        out.append(found[-1])
    return out


def prepare_root(dest: Path, arch: str = "arm64") -> Path:
    """DEST/ARCH-SUITE: the suite's libc6 and libc6-dbg of ARCH unpacked as that system's `/` (made once)."""
    f = ARCHES[arch]
    root = dest / f"{f.arch}-{f.suite}"
    if (root / "VERSION").exists():
        return root
    debs = _fetch(f, ["libc6", "libc6-dbg"])
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for deb in debs:
        sysroots._run(["dpkg-deb", "-x", str(deb), str(root)])
    version = re.search(r"libc6_(\d+\.\d+)", debs[0].name)
    if not version:
        raise ForeignError(f"cannot read the glibc version from {debs[0].name}")
    (root / "VERSION").write_text(version.group(1) + "\n")
    return root


@fresh.exclusive
def build(name: str, bindir: Path, arch: str = "arm64") -> Path:
    """Reproducer NAME compiled for ARCH into BINDIR/ARCH/NAME (made again only when its inputs changed)."""
    f = ARCHES[arch]
    out = bindir / f.arch
    out.mkdir(parents=True, exist_ok=True)
    exe = out / name
    sources = [harness.source(f"{name}.c")] + ([] if name in ALLOCATORS else [harness.COMMON / "hw.c"])
    cmd = [f.compiler, *harness.CFLAGS, f"-I{harness.COMMON}", f"-I{sources[0].parent}", *map(str, sources),
           "-o", str(exe), "-ldl"]
    headers = harness.headers(name) if name in harness.JEMALLOC_REPRODUCERS or name not in ALLOCATORS else []
    inputs = fresh.digest(sources + headers, harness.CFLAGS, f.arch)
    if fresh.marked(exe, inputs):
        return exe
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ForeignError(f"building {name} for {f.arch} failed:\n{result.stderr}")
    fresh.mark(exe, inputs)
    return exe


@dataclass(frozen=True)
class Allocator:
    """The allocator a reproducer runs on, preloaded from the suite's packages (None: glibc's malloc)."""

    packages: tuple[str, ...]
    library: str                # its file name in the system's library folder
    writes: tuple[str, ...]     # what the reproducer writes at its snapshot


_STATS = ("stats.json",)
#: the reproducers that run on another allocator than glibc's malloc, and which
ALLOCATORS = {**{name: Allocator(("libjemalloc2", "libstdc++6", "libgcc-s1"), "libjemalloc.so.2",
                                 ("stats.json", "ledger.json")) for name in harness.JEMALLOC_REPRODUCERS},
              "tc_hold": Allocator(("libtcmalloc-minimal4", "libstdc++6", "libgcc-s1"), "libtcmalloc_minimal.so.4",
                                   _STATS),
              "mi_hold": Allocator(("libmimalloc2.0",), "libmimalloc.so.2", _STATS)}


def add_package(root: Path, package: str, arch: str = "arm64") -> None:
    """PACKAGE of ARCH's suite unpacked into ROOT too (once)."""
    stamp = root / f".{package}"
    if not stamp.exists():
        for deb in _fetch(ARCHES[arch], [package]):
            sysroots._run(["dpkg-deb", "-x", str(deb), str(root)])
        stamp.write_text(package + "\n")


def _unlimited_cores() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


@fresh.exclusive
def shim(bindir: Path, arch: str = "arm64") -> Path:
    """cores/common/qemusnap.c built for ARCH into BINDIR/ARCH/libqemusnap.so (made again when it changed)."""
    f = ARCHES[arch]
    source, lib = harness.COMMON / "qemusnap.c", bindir / f.arch / "libqemusnap.so"
    lib.parent.mkdir(parents=True, exist_ok=True)
    if fresh.marked(lib, fresh.digest([source], f.arch)):
        return lib
    result = subprocess.run([f.compiler, "-O1", "-Wall", "-shared", "-fPIC", str(source), "-o", str(lib), "-ldl"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise ForeignError(f"building libqemusnap.so for {f.arch} failed:\n{result.stderr}")
    fresh.mark(lib, fresh.digest([source], f.arch))
    return lib


def run_to_core(exe: Path, args: list[str], directory: Path, bindir: Path, root: Path, preload: list[str] = (),
                arch: str = "arm64", env: dict[str, str] | None = None, page: int = 4096,
                linked: bool = False) -> int:
    """Runs EXE with ARGS under qemu-user on ROOT in DIRECTORY, with the shim and PRELOAD (paths on ARCH's
    system) preloaded (none when the shim is LINKED into the program, as into a static one) and ENV in its
    environment, on a kernel of PAGE-byte pages as far as the program sees (its AT_PAGESZ), to its snapshot;
    leaves the completed core there as `core`; its pid."""
    f = ARCHES[arch]
    libraries = "" if linked else ":".join([str(shim(bindir, arch)), *preload])
    # qemu hands its own environment to the program (its -E splits values at commas, which MALLOC_CONF has)
    preloads = ["-E", f"LD_PRELOAD={libraries}"] if libraries else []
    result = subprocess.run([f.qemu, "-L", str(root), "-p", str(page), *preloads, str(exe),
                             *args],
                            cwd=directory, capture_output=True, text=True, timeout=600, preexec_fn=_unlimited_cores,
                            env={**os.environ, **(env or {})})
    written = sorted(directory.glob(f"qemu_{exe.name}_*.core"))
    if not written:
        raise ForeignError(f"{exe.name} under {f.qemu} wrote no core (exit {result.returncode}):\n"
                           f"{result.stderr[-2000:]}")
    for host_core in [*directory.glob("core"), *directory.glob("core.[0-9]*")]:
        host_core.unlink()          # the kernel's core of qemu itself, when it kept one
    if not (directory / "process.txt").exists():
        raise ForeignError(f"{exe.name} under {f.qemu} aborted before its snapshot (exit {result.returncode}):\n"
                           f"{result.stderr[-2000:]}")
    qemucore.complete(written[-1], directory / "process.txt", directory / "core", str(root))
    written[-1].unlink()
    return int(written[-1].stem.rsplit("_", 1)[1])


#: the reproducers that are a script of a program of the system's packages: (its packages, the program, the script)
SCRIPTS = {"pyobjects": (("python3.11-minimal", "libpython3.11-minimal", "libexpat1", "zlib1g"), "usr/bin/python3.11",
                         "pyobjects.py")}


@fresh.exclusive
def capture_script(name: str, directory: Path, bindir: Path, root: Path, arch: str = "arm64") -> harness.Capture:
    """Script NAME (`SCRIPTS`) run by ARCH's program of the suite's packages, its core in DIRECTORY with what it
    writes (stats.txt) and meta.json, taken now unless a fresh one is there."""
    packages, program, script = SCRIPTS[name]
    for package in packages:
        add_package(root, package, arch)
    exe, code = root / program, harness.source(script)
    inputs = fresh.digest([code, shim(bindir, arch), Path(__file__), Path(qemucore.__file__), root / "VERSION"],
                          name, arch, packages)
    if not fresh.fresh(directory, inputs, ("core", "stats.txt")):
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        pid = run_to_core(exe, [str(code), str(directory)], directory, bindir, root, (), arch)
        (directory / "meta.json").write_text(json.dumps({"name": name, "exe": str(exe), "pid": pid, "arch": arch,
                                                         "root": str(root)}))
        fresh.mark(directory, inputs)
    meta = json.loads((directory / "meta.json").read_text())
    return harness.Capture(name=name, directory=directory, exe=Path(meta["exe"]), pid=meta["pid"])


@fresh.exclusive
def capture(name: str, directory: Path, bindir: Path, root: Path, arch: str = "arm64", page: int = 4096
            ) -> harness.Capture:
    """Reproducer NAME's core for ARCH in DIRECTORY (with what it writes: malloc_info.xml and ledger.json on
    glibc's malloc, its allocator's statistics on another (`ALLOCATORS`, preloaded from the suite's packages
    of ARCH); meta.json), on a kernel of PAGE-byte pages, taken now unless a fresh one is there."""
    if name in SCRIPTS:
        return capture_script(name, directory, bindir, root, arch)
    f = ARCHES[arch]
    exe = build(name, bindir, arch)
    runs_on = ALLOCATORS.get(name)
    for package in runs_on.packages if runs_on else ():
        add_package(root, package, arch)
    preload = [f"/usr/lib/{f.triplet}/{runs_on.library}"] if runs_on else []
    outputs = ("core", *(runs_on.writes if runs_on else ("malloc_info.xml", "ledger.json")))
    env = harness.JEMALLOC_ENV.get(name, {})
    inputs = fresh.digest([exe, shim(bindir, arch), Path(__file__), Path(qemucore.__file__), root / "VERSION"],
                          name, f.arch, env, page)
    if not fresh.fresh(directory, inputs, outputs):
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        pid = run_to_core(exe, [str(directory)], directory, bindir, root, preload, arch, env, page)
        (directory / "meta.json").write_text(json.dumps({"name": name, "exe": str(exe), "pid": pid,
                                                         "arch": f.arch, "root": str(root)}))
        fresh.mark(directory, inputs)
    meta = json.loads((directory / "meta.json").read_text())
    return harness.Capture(name=name, directory=directory, exe=Path(meta["exe"]), pid=meta["pid"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("names", nargs="*")
    parser.add_argument("--arch", default="arm64", choices=sorted(ARCHES))
    parser.add_argument("--bindir", type=Path, default=harness.CORES_DIR.parent / "build" / "bin")
    parser.add_argument("--roots", type=Path, default=harness.CORES_DIR.parent / "build" / "sysroots")
    args = parser.parse_args(argv)
    if tools_missing(args.arch):
        print(f"missing: {', '.join(tools_missing(args.arch))} (Debian: {' '.join(TOOLS[args.arch])})",
              file=sys.stderr)
        return 1
    root = prepare_root(args.roots, args.arch)
    print(f"{args.arch}: glibc {(root / 'VERSION').read_text().strip()} in {root}")
    for name in args.names:
        cap = capture(name, args.outdir / name, args.bindir, root, args.arch)
        print(f"{name}: {cap.core} ({args.arch}, glibc {(root / 'VERSION').read_text().strip()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
