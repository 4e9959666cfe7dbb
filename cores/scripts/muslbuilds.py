"""The reproducers built on musl's C library (and so on its malloc, mallocng): Debian's musl 1.2.3 (musl-tools'
musl-gcc), each program linked statically (musl inside it, its symbol table kept), statically and stripped (no
symbol: mallocng found by its shape), and dynamically (musl's dynamic linker and libc, ld-musl-x86_64.so.1, which
gives malloc the unused ends of the program's and its own data at start).

    python cores/scripts/muslbuilds.py BINDIR      builds every program of every linkage
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fresh  # noqa: E402

__all__ = ["MuslBuild", "MUSL_BUILDS", "build", "MUSL_DIR", "missing"]

MUSL_DIR = Path(__file__).resolve().parent.parent / "musl"
CFLAGS = ("-O1", "-g", "-pthread", "-Wall", "-Wextra")


@dataclass(frozen=True)
class MuslBuild:
    """How a program is linked with musl: statically or not, stripped or not."""

    name: str
    static: bool
    stripped: bool = False

    @property
    def symbols(self) -> bool:
        """Does the program's symbol table name mallocng's context?"""
        return self.static and not self.stripped


MUSL_BUILDS = {b.name: b for b in (MuslBuild("static", True), MuslBuild("stripped", True, True),
                                   MuslBuild("dynamic", False))}


def missing() -> str:
    """What this machine lacks to build them ("" when nothing): musl-gcc comes with Debian's musl-tools."""
    return "" if shutil.which("musl-gcc") else "musl-gcc (Debian's musl-tools)"


@fresh.exclusive
def build(name: str, bindir: Path, linkage: str) -> Path:
    """Program NAME (cores/musl/NAME.c) linked as LINKAGE into BINDIR/musl-LINKAGE/NAME, made again only when its
    source, this script or musl changed."""
    how = MUSL_BUILDS[linkage]
    source = MUSL_DIR / f"{name}.c"
    exe = bindir / f"musl-{linkage}" / name
    gcc = shutil.which("musl-gcc")
    if gcc is None:
        raise RuntimeError(f"building {name} on musl needs {missing()}")
    inputs = fresh.digest([source, Path(__file__), Path(gcc)], linkage, CFLAGS)
    if fresh.marked(exe, inputs):
        return exe
    exe.parent.mkdir(parents=True, exist_ok=True)
    cmd = [gcc, *CFLAGS, *(["-static"] if how.static else []), str(source), "-o", str(exe)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building {name} on musl ({linkage}) failed:\n{done.stderr}")
    if how.stripped:
        subprocess.run(["strip", "--strip-all", str(exe)], check=True)
    fresh.mark(exe, inputs)
    return exe


def main(argv: list[str]) -> int:
    for linkage in MUSL_BUILDS:
        print(build("musl_hold", Path(argv[1]), linkage))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
