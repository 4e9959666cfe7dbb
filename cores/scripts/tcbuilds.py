"""Debian's gperftools tcmalloc of each suite, unpacked beside the sysroots, for the reproducers to run on
(tests/cores/tcmalloc/test_tcmalloc.py):

    bullseye         2.8.1   libtcmalloc-minimal4      shared, LD_PRELOAD
    bookworm         2.10    libtcmalloc-minimal4      shared, LD_PRELOAD
    trixie           2.16    libtcmalloc-minimal4t64   shared, LD_PRELOAD, under trixie's glibc and libstdc++
                                                       (it needs symbols of theirs this machine's lack)
    sid              2.18.1  libtcmalloc-minimal4t64   the same, under sid's
    bookworm-full    2.10    libgoogle-perftools4      the full build (heap profiler, libunwind), LD_PRELOAD
    bookworm-linked  2.10    libgoogle-perftools-dev   libtcmalloc_minimal.a linked into the program, stripped

Each is fetched once with apt's ``download`` through cores/scripts/sysroots.py's private lists (cached), and unpacked
into DEST/tcmalloc-NAME with a VERSION file.  The name ``google`` builds cores/tcmalloc/rust_gtc instead: a Rust program
on Google's tcmalloc (decoded by heapwalk.gtcmalloc), into DEST/rust-gtc.

Command line: ``python3 cores/scripts/tcbuilds.py DEST [NAME ...]``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jebuilds
import sysroots

__all__ = ["TcBuild", "Tcmalloc", "TC_BUILDS", "prepare_tcmalloc"]

LIBDIR = Path("usr/lib") / sysroots.MULTIARCH


@dataclass(frozen=True)
class TcBuild:
    """Where one tcmalloc comes from: PACKAGE of SUITE, the FILE in it the program runs on (a shared library
    or an archive), the packages it needs beside it, and whether it needs its suite's glibc."""

    suite: str
    package: str
    file: str
    beside: tuple[str, ...] = ()
    own_glibc: bool = False

    @property
    def linked(self) -> bool:
        return self.file.endswith(".a")


TC_BUILDS = {
    "bullseye": TcBuild("bullseye", "libtcmalloc-minimal4", "libtcmalloc_minimal.so.4"),
    "bookworm": TcBuild("bookworm", "libtcmalloc-minimal4", "libtcmalloc_minimal.so.4"),
    "trixie": TcBuild("trixie", "libtcmalloc-minimal4t64", "libtcmalloc_minimal.so.4", ("libstdc++6", "libgcc-s1"),
                      own_glibc=True),
    "sid": TcBuild("sid", "libtcmalloc-minimal4t64", "libtcmalloc_minimal.so.4", ("libstdc++6", "libgcc-s1"),
                   own_glibc=True),
    "bookworm-full": TcBuild("bookworm", "libgoogle-perftools4", "libtcmalloc.so.4", ("libunwind8",)),
    "bookworm-linked": TcBuild("bookworm", "libgoogle-perftools-dev", "libtcmalloc_minimal.a"),
}


@dataclass(frozen=True)
class Tcmalloc:
    """One tcmalloc unpacked at ROOT, ready to run a program on."""

    name: str
    root: Path

    @property
    def build(self) -> TcBuild:
        return TC_BUILDS[self.name]

    @property
    def library(self) -> Path:
        return self.root / LIBDIR / self.build.file

    @property
    def version(self) -> str:
        return (self.root / "VERSION").read_text().strip()

    def glibc(self) -> sysroots.Sysroot | None:
        """The suite's glibc it needs (fetched or reused beside it), or None when this machine's will do."""
        return sysroots.prepare(self.root.parent, self.build.suite) if self.build.own_glibc else None

    def launcher(self) -> list[str]:
        """The command prefix that runs a program on it: the suite's ld.so with its libraries, or nothing."""
        glibc = self.glibc()
        if glibc is None:
            return []
        return [str(glibc.ld_so), "--library-path", f"{glibc.libdir}:{self.root / LIBDIR}"]

    def environment(self) -> dict[str, str]:
        """What puts it under a program (nothing when it is linked in), with the libraries it needs."""
        if self.build.linked:
            return {}
        return {"LD_PRELOAD": str(self.library), "LD_LIBRARY_PATH": str(self.root / LIBDIR)}

    def link_flags(self) -> list[str]:
        """gcc's flags that link it into a program (nothing for a shared one)."""
        return [str(self.library), "-lstdc++", "-lm"] if self.build.linked else []


def prepare_tcmalloc(dest: Path, name: str, cache: Path | None = None) -> Tcmalloc:
    """Fetches (or reuses) tcmalloc NAME (`TC_BUILDS`) and unpacks it into DEST/tcmalloc-NAME."""
    cache = cache or sysroots.cache_dir()
    build = TC_BUILDS[name]
    tc = Tcmalloc(name, dest / f"tcmalloc-{name}")
    if (tc.root / "VERSION").exists():
        return tc
    debs = [sysroots.fetch_deb(cache, p, build.suite) for p in (build.package, *build.beside)]
    if tc.root.exists():
        shutil.rmtree(tc.root)
    tc.root.mkdir(parents=True)
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tc.root)], check=True)
    version = re.search(build.package + r"_(\d+\.\d+(?:\.\d+)?)", debs[0].name)
    if not version or not tc.library.exists():
        raise sysroots.SysrootError(f"{debs[0].name} holds no {build.file} of a known version")
    tc.glibc()
    (tc.root / "VERSION").write_text(version.group(1) + "\n")
    return tc


#: the reproducer every build runs
TC_HOLD = Path(__file__).resolve().parents[1] / "tcmalloc" / "tc_hold.c"


def build_hold(tc: Tcmalloc, folder: Path) -> Path:
    """cores/tcmalloc/tc_hold.c built for TC into FOLDER/tc_hold (linked with it, and stripped, when it is an archive)."""
    exe = folder / "tc_hold"
    folder.mkdir(parents=True, exist_ok=True)
    linked = ["-DTC_LINKED"] if tc.build.linked else []
    subprocess.run(["gcc", "-O1", "-Wall", "-pthread", *linked, "-o", str(exe), str(TC_HOLD), *tc.link_flags(),
                    "-ldl"], check=True)
    if tc.build.linked:
        subprocess.run(["strip", str(exe)], check=True)
    return exe


#: the Rust program on Google's tcmalloc (cores/tcmalloc/rust_gtc: the tcmalloc-better crate builds Google's sources into it)
RUST_GTC = Path(__file__).resolve().parents[1] / "tcmalloc" / "rust_gtc"


def prepare_google(dest: Path) -> Path:
    """Builds (or reuses) cores/tcmalloc/rust_gtc into DEST/rust-gtc/rust_gtc, stripped; cargo fetches its crates the first
    time (set-up), and compiles Google's tcmalloc and Abseil with them (some minutes on two cores)."""
    return jebuilds.cargo_program(RUST_GTC, dest / "rust-gtc", "rust_gtc", {}, "the program on Google's tcmalloc")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("names", nargs="*", default=[*TC_BUILDS, "google"],
                        help="gperftools builds (TC_BUILDS), and 'google': the Rust program on Google's tcmalloc")
    args = parser.parse_args(argv)
    for name in args.names:
        if name == "google":
            print(f"google: {prepare_google(args.dest)}")
            continue
        tc = prepare_tcmalloc(args.dest, name)
        print(f"{name}: tcmalloc {tc.version} in {tc.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
