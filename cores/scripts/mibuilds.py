"""Debian's mimalloc of each suite, unpacked beside the sysroots, for cores/mimalloc/mi_hold.c to run on
(tests/cores/mimalloc/test_mimalloc.py):

    bookworm   2.0.9   libmimalloc2.0   shared, LD_PRELOAD
    trixie     3.0.1   libmimalloc3     shared, LD_PRELOAD (mimalloc 3: pages in arenas, no segments)
    sid        3.6.0   libmimalloc3     shared, LD_PRELOAD (each slice's mi_page_t in a table at the start of
                                        its 256 MiB area; a theap for mimalloc's own data)

each fetched once with apt's ``download`` through cores/scripts/sysroots.py's private lists (cached) and unpacked into
DEST/mimalloc-NAME with a VERSION file; and releases other distributions and the Rust crates ship, built from
the sources a registry package bundles (`MI_SOURCES`: crates that bundle mimalloc's C sources, PyPI's
cmeel-mimalloc sdists; cores/scripts/sources.py fetches them) with cmake as a distribution builds them (Release),
stripped to their exported symbols, into DEST/mimalloc-VERSION:

    2.0.6  2.0.7  2.1.2 (Ubuntu 24.04's: segments taken from arenas)  2.3.2 (the Rust crate's v2)
    3.3.2 (the Rust crate's: a heap per thread is a theap)  3.4.3 (the newest 3.4)  3.6.0 (sid's)
    2.1.4  2.1.7  2.1.9  2.2.4  2.3.1 (one of each layout between; read live only, no core kept)
    3.1.5  3.2.8  3.3.0 (the same for the other mimalloc 3 layouts)

and releases linked into the program (as the Rust crate links it: mimalloc's object in the executable, which
then exports none of its entry points and says no version; its thread-local default heap reached without a GOT
slot), the program stripped:

    2.1.2-linked  2.3.2-linked (the Rust crate's v2)  3.1.5-linked (the crate's v3 in libmimalloc-sys 0.1.44:
    a mimalloc 3 before theaps)  3.3.2-linked (the Rust crate's default)

and a Rust service on the ``mimalloc`` crate itself (cores/mimalloc/rust_mi, its crates fetched by name the first time,
the versions its Cargo.lock pins): the crate's build script compiles mimalloc's sources into the program, which
is stripped; it runs instead of mi_hold and writes the same files:

    rust (mimalloc 3.3.2, the crate's default)  rust-v2 (2.3.2, its ``v2`` feature)

Releases no registry package carries (2.0.5, 2.2.7, 3.0.1 as an object, 3.1.6, 3.4.0) keep their layouts,
measured at development time (docs/platforms.md); the tests build none of them.

Command line: ``python3 cores/scripts/mibuilds.py DEST [NAME ...]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import fresh
import jebuilds
import sources
import sysroots

__all__ = ["MiBuild", "Mimalloc", "MI_BUILDS", "MI_BUILT", "MI_LIVE", "MI_LIVE3", "MI_LINKED", "MI_RUST", "drift_delay",
           "prepare_mimalloc", "build_hold", "MI_HOLD"]

LIBDIR = Path("usr/lib") / sysroots.MULTIARCH


@dataclass(frozen=True)
class MiBuild:
    """Where one mimalloc comes from: PACKAGE of SUITE and the shared library in it the program runs on."""

    suite: str
    package: str
    file: str


MI_BUILDS = {
    "bookworm": MiBuild("bookworm", "libmimalloc2.0", "libmimalloc.so.2.0"),
    "trixie": MiBuild("trixie", "libmimalloc3", "libmimalloc.so.3"),
    "sid": MiBuild("sid", "libmimalloc3", "libmimalloc.so.3"),
}
#: where each release built here comes from: the registry package that bundles its sources, and the folder of
#: them in it (each checked file by file against the release's own sources: docs/platforms.md)
MI_SOURCES = {
    "2.0.6": sources.Crate("libmimalloc-sys", "0.1.26", "c_src/mimalloc"),
    "2.0.7": sources.Crate("libmimalloc-sys", "0.1.28", "c_src/mimalloc"),
    "2.1.2": sources.Crate("libmimalloc-sys", "0.1.35", "c_src/mimalloc"),
    "2.1.4": sources.Crate("libmimalloc-sys", "0.1.37", "c_src/mimalloc"),
    "2.1.7": sources.Crate("libmimalloc-sys", "0.1.39", "c_src/mimalloc"),
    "2.1.9": sources.Crate("libmimalloc-sys2", "0.1.40", "c_src/mimalloc"),
    "2.2.4": sources.Crate("libmimalloc-sys", "0.1.44", "c_src/mimalloc/v2"),
    "2.3.1": sources.Crate("libmimalloc-sys", "0.1.47", "c_src/mimalloc/v2"),
    "2.3.2": sources.Crate("libmimalloc-sys", "0.1.49", "c_src/mimalloc/v2"),
    "3.1.5": sources.Crate("libmimalloc-sys", "0.1.44", "c_src/mimalloc/v3"),
    "3.2.8": sources.Sdist("cmeel-mimalloc", "3.2.8", "mimalloc"),
    "3.3.0": sources.Crate("libmimalloc-sys2", "0.1.53", "c_src/mimalloc3"),
    "3.3.2": sources.Crate("libmimalloc-sys", "0.1.49", "c_src/mimalloc/v3"),
    "3.4.3": sources.Sdist("cmeel-mimalloc", "3.4.3", "mimalloc"),
    "3.6.0": sources.Crate("libmimalloc-sys2", "0.1.64", "c_src/mimalloc3"),
}
#: releases built from their sources whose cores the tests keep
MI_BUILT = ("2.0.6", "2.0.7", "2.1.2", "2.3.2", "3.3.2", "3.4.3", "3.6.0")
#: releases built from their sources whose process the tests read live only (no core kept): one of each layout
#: measured between 2.1.2 and 2.3.2
MI_LIVE = ("2.1.4", "2.1.7", "2.1.9", "2.2.4", "2.3.1")
#: the same for mimalloc 3: one release of each layout measured besides 3.0.1, 3.3.2, 3.4.3 and 3.6.0 (3.1.5 is
#: the mimalloc crate's v3 in libmimalloc-sys 0.1.44)
MI_LIVE3 = ("3.1.5", "3.2.8", "3.3.0")
#: releases built from their sources as an object the reproducer links: name -> release
MI_LINKED = {"2.1.2-linked": "2.1.2", "2.3.2-linked": "2.3.2", "3.1.5-linked": "3.1.5", "3.3.2-linked": "3.3.2"}
#: the Rust reproducer on the mimalloc crate: name -> (the release the crate compiles in, the crate's features)
MI_RUST = {"rust": ("3.3.2", ()), "rust-v2": ("2.3.2", ("v2",))}
RUST_MI = Path(__file__).resolve().parents[1] / "mimalloc" / "rust_mi"
#: the purge delay (ms) 2.1.4 to 2.3.1 run with (their committed statistic drifts: `Mimalloc.environment`)
DRIFT_DELAY = 3600000


@dataclass(frozen=True)
class Mimalloc:
    """One mimalloc unpacked at ROOT, ready to run a program on."""

    name: str
    root: Path

    @property
    def linked(self) -> bool:
        """Whether the program links it (its object, or the Rust crate's), rather than loading it."""
        return self.name in MI_LINKED or self.name in MI_RUST

    @property
    def library(self) -> Path:
        """The shared library, the object the program links, or the Rust program that holds it."""
        if self.name in MI_RUST:
            return self.root / "rust_mi"
        if self.linked:
            return self.root / "mimalloc.o"
        if self.name in MI_BUILT or self.name in MI_LIVE or self.name in MI_LIVE3:
            return self.root / f"libmimalloc.so.{self.name.split('.')[0]}"
        return self.root / LIBDIR / MI_BUILDS[self.name].file

    @property
    def version(self) -> str:
        return (self.root / "VERSION").read_text().strip()

    def environment(self) -> dict[str, str]:
        """What puts it under a program (nothing: the program links it); and for 2.1.2 to 2.3.1, whose committed
        statistic a purge makes drift on Linux, a purge delay long enough that nothing is purged before the
        snapshot, so that the statistic is comparable there: an hour from 2.1.4 (their mi_collect(true) purges
        regardless), a few seconds for 2.1.2 (whose collect purges only what waited past its delay: the tests
        let it pass first)."""
        env = {} if self.linked else {"LD_PRELOAD": str(self.library)}
        delay = drift_delay(self.version)
        if delay:
            env["MIMALLOC_PURGE_DELAY"] = str(delay)
        return env


def drift_delay(version: str) -> int:
    """The purge delay (ms) release VERSION runs with in the tests (0: its own; `Mimalloc.environment`)."""
    v = tuple(map(int, version.split(".")))
    return DRIFT_DELAY if (2, 1, 4) <= v <= (2, 3, 1) else 5000 if v == (2, 1, 2) else 0


def prepare_mimalloc(dest: Path, name: str, cache: Path | None = None) -> Mimalloc:
    """Fetches (or reuses) mimalloc NAME (`MI_BUILDS`) and unpacks it into DEST/mimalloc-NAME, or builds release
    NAME (`MI_BUILT`, `MI_LIVE`, `MI_LIVE3`) there, or the Rust program on the crate (`MI_RUST`)."""
    if name in MI_RUST:
        return _rust(dest, name)
    if name in MI_BUILT or name in MI_LIVE or name in MI_LIVE3 or name in MI_LINKED:
        return _built(dest, name)
    cache = cache or sysroots.cache_dir()
    build = MI_BUILDS[name]
    mi = Mimalloc(name, dest / f"mimalloc-{name}")
    if (mi.root / "VERSION").exists():
        return mi
    deb = sysroots.fetch_deb(cache, build.package, build.suite)
    if mi.root.exists():
        shutil.rmtree(mi.root)
    mi.root.mkdir(parents=True)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(mi.root)], check=True)
    version = re.search(re.escape(build.package) + r"_(\d+\.\d+\.\d+)", deb.name)
    if not version or not mi.library.exists():
        raise sysroots.SysrootError(f"{deb.name} holds no {build.file} of a known version")
    (mi.root / "VERSION").write_text(version.group(1) + "\n")
    return mi


#: how every release is configured: as a distribution builds it
_CMAKE = ("-DCMAKE_BUILD_TYPE=Release", "-DMI_BUILD_TESTS=OFF", "-DMI_BUILD_STATIC=OFF")
#: the build's time, as reproducible builds fix it (from 2.2 mimalloc keeps its build's __DATE__ and __TIME__)
_BUILD_TIME = {"SOURCE_DATE_EPOCH": "1700000000"}


def _built(dest: Path, name: str) -> Mimalloc:
    """Release NAME (or the release of linked build NAME) built from the sources its registry package bundles
    (`MI_SOURCES`) into DEST/mimalloc-NAME (once: again only when where it comes from or how it is built
    changed): a stripped shared library, or the object a program links."""
    version = MI_LINKED.get(name, name)
    mi = Mimalloc(name, (dest / f"mimalloc-{name}").resolve())
    origin = MI_SOURCES[version]
    inputs = fresh.digest([], repr(origin), _CMAKE, _BUILD_TIME, "object" if mi.linked else "release, stripped")
    if fresh.marked(mi.library, inputs) and (mi.root / "VERSION").exists():
        return mi
    try:
        source = sources.unpacked(origin)
    except sources.SourceError as exc:
        raise sysroots.SysrootError(f"mimalloc {version}: {exc}") from None
    found = _release_of(source)
    if found != version:
        raise sysroots.SysrootError(f"mimalloc {version}: {origin.describe()} holds mimalloc {found}")
    if mi.root.exists():
        shutil.rmtree(mi.root)
    work = mi.root / "build"
    shutil.copytree(source, work / "source", symlinks=True)
    _complete_cmake(work / "source", version)
    out = work / "out"
    out.mkdir()
    log = work / "build.log"
    with open(log, "w") as fh:
        kind = ["-DMI_BUILD_SHARED=OFF", "-DMI_BUILD_OBJECT=ON"] if mi.linked else ["-DMI_BUILD_OBJECT=OFF"]
        for cmd in (["cmake", *_CMAKE, *kind, str(work / "source")], ["make", "-j2"]):
            if subprocess.run(cmd, cwd=out, stdout=fh, stderr=subprocess.STDOUT,
                              env={**os.environ, **_BUILD_TIME}).returncode != 0:
                raise sysroots.SysrootError(f"mimalloc {version}: {' '.join(cmd)} failed (its output: {log})")
    if mi.linked:
        shutil.copy(out / "mimalloc.o", mi.library)
    else:
        subprocess.run(["strip", "--strip-unneeded", "-o", str(mi.library), str((out / "libmimalloc.so").resolve())],
                       check=True)
    (mi.root / "VERSION").write_text(version + "\n")
    fresh.mark(mi.library, inputs)
    shutil.rmtree(work)
    return mi


def _release_of(source: Path) -> str:
    """The release mimalloc's sources in SOURCE say they are: MI_MALLOC_VERSION's digits are the major, the minor
    and the patch, the patch in two digits from 3.1 on and the minor too from 2.3 and 3.3 on (215: 2.1.5; 3207:
    3.2.7; 30302: 3.3.2)."""
    text = (source / "include" / "mimalloc.h").read_text()
    match = re.search(r"#define\s+MI_MALLOC_VERSION\s+(\d+)", text)
    if not match:
        return "unknown"
    digits = match.group(1)
    minor = 2 if len(digits) == 5 else 1
    return f"{int(digits[0])}.{int(digits[1:1 + minor])}.{int(digits[1 + minor:])}"


def _complete_cmake(source: Path, version: str) -> None:
    """Writes the two cmake helpers mimalloc's CMakeLists.txt includes where the package left them out (the
    crates ship the CMakeLists.txt, not always its cmake folder): the version it builds, and the joining of
    install paths that only its pkg-config file uses."""
    folder = source / "cmake"
    folder.mkdir(exist_ok=True)
    major, minor, patch = version.split(".")
    helpers = {
        "mimalloc-config-version.cmake": f"set(mi_version_major {major})\nset(mi_version_minor {minor})\n"
                                         f"set(mi_version_patch {patch})\n"
                                         "set(mi_version ${mi_version_major}.${mi_version_minor})\n",
        "JoinPaths.cmake": "function(join_paths joined first second)\n"
                           "  set(${joined} \"${first}/${second}\" PARENT_SCOPE)\nendfunction()\n",
    }
    for file, text in helpers.items():
        if not (folder / file).exists():
            (folder / file).write_text(text)


def _rust(dest: Path, name: str) -> Mimalloc:
    """cores/mimalloc/rust_mi built with the mimalloc crate's build NAME into DEST/mimalloc-NAME (again only when its
    sources or lock changed)."""
    version, features = MI_RUST[name]
    mi = Mimalloc(name, (dest / f"mimalloc-{name}").resolve())
    jebuilds.cargo_program(RUST_MI, mi.root, "rust_mi", {}, f"the Rust reproducer on the mimalloc crate ({name})",
                           features)
    (mi.root / "VERSION").write_text(version + "\n")
    return mi


#: the reproducer every build runs
MI_HOLD = Path(__file__).resolve().parents[1] / "mimalloc" / "mi_hold.c"


def build_hold(folder: Path, mi: Mimalloc | None = None) -> Path:
    """cores/mimalloc/mi_hold.c built into FOLDER/mi_hold: it finds mimalloc's entry points with dlsym, or, for a linked
    build MI, links mimalloc's object and calls them (stripped then, as a release build ships).  The Rust
    crate's builds are their own program (cores/mimalloc/rust_mi)."""
    if mi is not None and mi.name in MI_RUST:
        return mi.library
    exe = folder / "mi_hold"
    folder.mkdir(parents=True, exist_ok=True)
    if mi is not None and mi.linked:
        theap = ["-DMI_THEAP"] if tuple(map(int, MI_LINKED[mi.name].split("."))) >= (3, 2, 0) else []
        subprocess.run(["gcc", "-O1", "-Wall", "-pthread", "-DMI_LINKED", *theap, "-o", str(exe), str(MI_HOLD),
                        str(mi.library)], check=True)
        subprocess.run(["strip", str(exe)], check=True)
    else:
        subprocess.run(["gcc", "-O1", "-Wall", "-pthread", "-o", str(exe), str(MI_HOLD), "-ldl"], check=True)
    return exe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("names", nargs="*", default=[*MI_BUILDS, *MI_BUILT, *MI_LIVE, *MI_LIVE3, *MI_LINKED, *MI_RUST])
    args = parser.parse_args(argv)
    for name in args.names:
        mi = prepare_mimalloc(args.dest, name)
        print(f"{name}: mimalloc {mi.version} in {mi.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
