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

__all__ = ["MuslBuild", "MUSL_BUILDS", "MUSL_SUITES", "MUSL_ARCHES", "Musl", "prepare_musl", "build", "build_snapshotting",
           "alpine_interp", "MUSL_DIR"]

#: Debian's suites whose musl the reproducers run on, and the version each has
MUSL_SUITES = {"bullseye": "1.2.2", "bookworm": "1.2.3", "trixie": "1.2.5"}
#: Debian's architectures musl is built for here: its processor's name in musl's paths, and the compiler (arm64's
#: programs run under qemu-user: cores/scripts/foreign.py; its gcc's atomics would call glibc's __getauxval)
MUSL_ARCHES = {"amd64": ("x86_64", ("gcc",)), "arm64": ("aarch64", ("aarch64-linux-gnu-gcc", "-mno-outline-atomics"))}

MUSL_DIR = Path(__file__).resolve().parent.parent / "musl"
CFLAGS = ("-O1", "-g", "-pthread", "-Wall", "-Wextra")


@dataclass(frozen=True)
class MuslBuild:
    """How a program is linked with musl: statically or not, stripped or not; "alpine": dynamically, naming musl
    where Alpine has it (`alpine_interp`), to run in a container's root, not here."""

    name: str
    static: bool
    stripped: bool = False

    @property
    def symbols(self) -> bool:
        """Does the program's symbol table name mallocng's context?"""
        return self.static and not self.stripped


MUSL_BUILDS = {b.name: b for b in (MuslBuild("static", True), MuslBuild("stripped", True, True),
                                   MuslBuild("dynamic", False), MuslBuild("alpine", False))}


def alpine_interp(arch: str) -> str:
    """Where an Alpine program of ARCH names musl, its dynamic linker (the "alpine" linkage's, to run in a root
    laid out as Alpine's)."""
    return f"/lib/ld-musl-{MUSL_ARCHES[arch][0]}.so.1"


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
    arch: str = "amd64"

    @property
    def version(self) -> str:
        return MUSL_SUITES[self.suite]

    @property
    def triplet(self) -> str:
        return f"{MUSL_ARCHES[self.arch][0]}-linux-musl"

    @property
    def name(self) -> str:
        """What its builds' folders are named by: the suite, and the architecture but this machine's."""
        return self.suite if self.arch == "amd64" else f"{self.suite}-{self.arch}"

    @property
    def libc(self) -> Path:
        """Its shared C library, which is its dynamic linker too (in /lib before trixie, in /usr/lib since)."""
        for folder in ("lib", "usr/lib"):
            path = self.root / folder / self.triplet / "libc.so"
            if path.is_file() and not path.is_symlink():
                return path
        return self.root / "usr" / "lib" / self.triplet / "libc.so"

    @property
    def specs(self) -> Path:
        return self.root / "musl-gcc.specs"

    @property
    def alpine_specs(self) -> Path:
        return self.root / "musl-gcc-alpine.specs"


@fresh.exclusive
def prepare_musl(dest: Path, suite: str, arch: str = "amd64") -> Musl:
    """SUITE's musl and musl-dev of ARCH unpacked into DEST/musl-SUITE (-ARCH but for this machine's) once, with
    gcc's specs pointed there: programs of this machine run with that folder's libc.so as their dynamic linker,
    another architecture's (under qemu-user, given the folder as its root) and the "alpine" linkage's with
    Alpine's."""
    folder = suite if arch == "amd64" else f"{suite}-{arch}"
    musl = Musl(suite, dest.resolve() / f"musl-{folder}", arch)          # its specs name absolute paths
    if musl.specs.exists():
        return musl
    if arch == "amd64":
        debs = [sysroots.fetch_deb(sysroots.cache_dir(), package, suite) for package in ("musl", "musl-dev")]
    else:
        import foreign
        if foreign.ARCHES[arch].suite != suite:
            raise RuntimeError(f"musl of {arch} is taken from {foreign.ARCHES[arch].suite} only")
        debs = foreign._fetch(foreign.ARCHES[arch], ["musl", "musl-dev"])
    if musl.root.exists():
        shutil.rmtree(musl.root)
    musl.root.mkdir(parents=True)
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(musl.root)], check=True)
    sysroots.relink_absolute_symlinks(musl.root)
    lib, include = musl.root / "usr" / "lib" / musl.triplet, musl.root / "usr" / "include" / musl.triplet
    here = musl.libc if arch == "amd64" else alpine_interp(arch)
    musl.alpine_specs.write_text(_SPECS.format(lib=lib, include=include, interp=alpine_interp(arch),
                                               shared=musl.libc.parent))
    musl.specs.write_text(_SPECS.format(lib=lib, include=include, interp=here, shared=musl.libc.parent))
    return musl


@fresh.exclusive
def build(name: str, bindir: Path, musl: Musl, linkage: str) -> Path:
    """Program NAME (cores/musl/NAME.c) on MUSL, linked as LINKAGE, into BINDIR/musl-SUITE-LINKAGE/NAME, made
    again only when its source, this script or that musl changed."""
    how = MUSL_BUILDS[linkage]
    source = MUSL_DIR / f"{name}.c"
    exe = bindir / f"musl-{musl.name}-{linkage}" / name
    specs = musl.alpine_specs if linkage == "alpine" else musl.specs
    flags = (*CFLAGS, *(["-static"] if how.static else []))
    return _compiled(exe, [source], musl, specs, flags, how.stripped, f"{name} on musl ({linkage})")


@fresh.exclusive
def build_snapshotting(name: str, bindir: Path, musl: Musl, stripped: bool = False) -> Path:
    """Program NAME on MUSL (of another architecture), static (STRIPPED or not), with cores/common/qemusnap.c
    linked in: under qemu-user it writes what qemu's core lacks and aborts where it would stop itself
    (cores/scripts/foreign.py preloads its shim into glibc's programs; a preload would make musl's dynamic linker
    allocate)."""
    exe = bindir / f"musl-{musl.name}-snapshotting{'-stripped' if stripped else ''}" / name
    sources = [MUSL_DIR / f"{name}.c", MUSL_DIR.parent / "common" / "qemusnap.c"]
    flags = (*CFLAGS, "-static", "-DQEMUSNAP_WRAP", "-Wl,--wrap=pthread_create,--wrap=raise,--wrap=kill")
    return _compiled(exe, sources, musl, musl.specs, flags, stripped, f"{name} on musl, snapshotting")


def _compiled(exe: Path, sources: list[Path], musl: Musl, specs: Path, flags: tuple, stripped: bool,
              what: str) -> Path:
    """EXE compiled from SOURCES on MUSL with SPECS and FLAGS (then STRIPPED), made again only when they, this
    script or that musl changed."""
    inputs = fresh.digest([*sources, Path(__file__), musl.libc, specs], flags, stripped, musl.arch)
    if fresh.marked(exe, inputs):
        return exe
    exe.parent.mkdir(parents=True, exist_ok=True)
    compiler = MUSL_ARCHES[musl.arch][1]
    cmd = [*compiler[:1], "-specs", str(specs), *compiler[1:], *flags, *map(str, sources), "-o", str(exe)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building {what} failed:\n{done.stderr}")
    if stripped:
        subprocess.run(["strip" if musl.arch == "amd64" else "aarch64-linux-gnu-strip", "--strip-all", str(exe)],
                       check=True)
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
