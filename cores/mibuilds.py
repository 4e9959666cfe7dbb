"""Debian's mimalloc of each suite, unpacked beside the sysroots, for cores/mi_hold.c to run on
(tests/test_mimalloc.py):

    bookworm   2.0.9   libmimalloc2.0   shared, LD_PRELOAD
    trixie     3.0.1   libmimalloc3     shared, LD_PRELOAD (a layout heapwalk names and does not decode yet)

Each is fetched once with apt's ``download`` through cores/sysroots.py's private lists (cached), and unpacked
into DEST/mimalloc-NAME with a VERSION file.

Command line: ``python3 cores/mibuilds.py DEST [NAME ...]``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import sysroots

__all__ = ["MiBuild", "Mimalloc", "MI_BUILDS", "prepare_mimalloc", "build_hold", "MI_HOLD"]

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
}


@dataclass(frozen=True)
class Mimalloc:
    """One mimalloc unpacked at ROOT, ready to run a program on."""

    name: str
    root: Path

    @property
    def library(self) -> Path:
        return self.root / LIBDIR / MI_BUILDS[self.name].file

    @property
    def version(self) -> str:
        return (self.root / "VERSION").read_text().strip()

    def environment(self) -> dict[str, str]:
        """What puts it under a program."""
        return {"LD_PRELOAD": str(self.library)}


def prepare_mimalloc(dest: Path, name: str, cache: Path | None = None) -> Mimalloc:
    """Fetches (or reuses) mimalloc NAME (`MI_BUILDS`) and unpacks it into DEST/mimalloc-NAME."""
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


#: the reproducer every build runs
MI_HOLD = Path(__file__).resolve().parent / "mi_hold.c"


def build_hold(folder: Path) -> Path:
    """cores/mi_hold.c built into FOLDER/mi_hold (it finds mimalloc's entry points with dlsym)."""
    exe = folder / "mi_hold"
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-O1", "-Wall", "-pthread", "-o", str(exe), str(MI_HOLD), "-ldl"], check=True)
    return exe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("names", nargs="*", default=list(MI_BUILDS))
    args = parser.parse_args(argv)
    for name in args.names:
        mi = prepare_mimalloc(args.dest, name)
        print(f"{name}: mimalloc {mi.version} in {mi.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
