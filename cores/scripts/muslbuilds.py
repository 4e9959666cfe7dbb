"""The reproducers built on musl's C library (and so on its malloc, mallocng): Debian's musl of bullseye (1.2.2),
bookworm (1.2.3, as Alpine 3.17 ships it) and trixie (1.2.5), its packages musl and musl-dev unpacked into a folder
of their own and used through musl-gcc's specs pointed there; each program linked statically (musl inside it,
its symbol table kept), statically and stripped (no symbol: mallocng found by its shape), and dynamically (with
that folder's musl libc.so as its dynamic linker, which gives malloc the unused ends of the program's and its own
data at start).

    python cores/scripts/muslbuilds.py SYSROOTS BINDIR      builds every program of every suite and linkage
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fresh  # noqa: E402
import sysroots  # noqa: E402

__all__ = ["MuslBuild", "MUSL_BUILDS", "MUSL_SUITES", "Musl", "prepare_musl", "build", "MUSL_DIR"]

#: Debian's suites whose musl the reproducers run on, and the version each has
MUSL_SUITES = {"bullseye": "1.2.2", "bookworm": "1.2.3", "trixie": "1.2.5"}
_TRIPLET = "x86_64-linux-musl"

MUSL_DIR = Path(__file__).resolve().parent.parent / "musl"
CFLAGS = ("-O1", "-g", "-pthread", "-Wall", "-Wextra")


@dataclass(frozen=True)
class MuslBuild:
    """How a program is linked with musl: statically or not, stripped or not; "alpine": dynamically, naming musl
    where Alpine has it (`ALPINE_INTERP`), to run in a container's root, not here."""

    name: str
    static: bool
    stripped: bool = False

    @property
    def symbols(self) -> bool:
        """Does the program's symbol table name mallocng's context?"""
        return self.static and not self.stripped


MUSL_BUILDS = {b.name: b for b in (MuslBuild("static", True), MuslBuild("stripped", True, True),
                                   MuslBuild("dynamic", False), MuslBuild("alpine", False))}
#: the dynamic linker an Alpine program names (the "alpine" linkage's, to run in a root laid out as Alpine's)
ALPINE_INTERP = "/lib/ld-musl-x86_64.so.1"


#: gcc's specs that compile against a musl folder's headers and link its start files and C library (its libc.so
#: the dynamic linker), gcc's own headers and libgcc beside them
_SPECS = """%rename cpp_options old_cpp_options

*cpp_options:
-nostdinc -isystem {include} -isystem include%s %(old_cpp_options)

*cc1:
%(cc1_cpu) -nostdinc -isystem {include} -isystem include%s

*link_libgcc:
-L{shared} -L{lib} -L .%s

*libgcc:
libgcc.a%s %:if-exists(libgcc_eh.a%s)

*startfile:
%{{!shared: {lib}/Scrt1.o}} {lib}/crti.o crtbeginS.o%s

*endfile:
crtendS.o%s {lib}/crtn.o

*link:
-dynamic-linker {interp} -nostdlib %{{shared:-shared}} %{{static:-static}} %{{rdynamic:-export-dynamic}}
"""


@dataclass(frozen=True)
class Musl:
    """One Debian suite's musl unpacked into ROOT: its C library, headers, and the specs that build on them."""

    suite: str
    root: Path

    @property
    def version(self) -> str:
        return MUSL_SUITES[self.suite]

    @property
    def libc(self) -> Path:
        """Its shared C library, which is its dynamic linker too (in /lib before trixie, in /usr/lib since)."""
        for folder in ("lib", "usr/lib"):
            path = self.root / folder / _TRIPLET / "libc.so"
            if path.is_file() and not path.is_symlink():
                return path
        return self.root / "usr" / "lib" / _TRIPLET / "libc.so"

    @property
    def specs(self) -> Path:
        return self.root / "musl-gcc.specs"

    @property
    def alpine_specs(self) -> Path:
        return self.root / "musl-gcc-alpine.specs"


@fresh.exclusive
def prepare_musl(dest: Path, suite: str) -> Musl:
    """SUITE's musl and musl-dev unpacked into DEST/musl-SUITE (once), with musl-gcc's specs pointed there."""
    musl = Musl(suite, dest.resolve() / f"musl-{suite}")     # its specs name absolute paths
    if musl.specs.exists():
        return musl
    cache = sysroots.cache_dir()
    debs = [sysroots.fetch_deb(cache, package, suite) for package in ("musl", "musl-dev")]
    if musl.root.exists():
        shutil.rmtree(musl.root)
    musl.root.mkdir(parents=True)
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(musl.root)], check=True)
    sysroots.relink_absolute_symlinks(musl.root)
    lib, include = musl.root / "usr" / "lib" / _TRIPLET, musl.root / "usr" / "include" / _TRIPLET
    specs = _SPECS.format(lib=lib, include=include, interp=musl.libc, shared=musl.libc.parent)
    musl.alpine_specs.write_text(_SPECS.format(lib=lib, include=include, interp=ALPINE_INTERP,
                                               shared=musl.libc.parent))
    musl.specs.write_text(specs)
    return musl


@fresh.exclusive
def build(name: str, bindir: Path, musl: Musl, linkage: str) -> Path:
    """Program NAME (cores/musl/NAME.c) on MUSL, linked as LINKAGE, into BINDIR/musl-SUITE-LINKAGE/NAME, made
    again only when its source, this script or that musl changed."""
    how = MUSL_BUILDS[linkage]
    source = MUSL_DIR / f"{name}.c"
    exe = bindir / f"musl-{musl.suite}-{linkage}" / name
    inputs = fresh.digest([source, Path(__file__), musl.libc, musl.specs, musl.alpine_specs], linkage, CFLAGS)
    if fresh.marked(exe, inputs):
        return exe
    exe.parent.mkdir(parents=True, exist_ok=True)
    specs = musl.alpine_specs if linkage == "alpine" else musl.specs
    cmd = ["gcc", "-specs", str(specs), *CFLAGS, *(["-static"] if how.static else []), str(source), "-o",
           str(exe)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building {name} on musl ({linkage}) failed:\n{done.stderr}")
    if how.stripped:
        subprocess.run(["strip", "--strip-all", str(exe)], check=True)
    fresh.mark(exe, inputs)
    return exe


def main(argv: list[str]) -> int:
    for suite in MUSL_SUITES:
        musl = prepare_musl(Path(argv[1]), suite)
        for linkage in MUSL_BUILDS:
            print(build("musl_hold", Path(argv[2]), musl, linkage))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
