"""Debian glibc builds other than the system's, unpacked into sysroots for the test matrix.

For each Debian suite in `SUITES` this downloads libc6 and libc6-dbg (and
libc6-dev where reproducers must be linked against that glibc) with apt's
``download`` command, using a private source list and private package lists,
so the machine's own apt configuration is neither needed nor changed.  The
mirror is the one the machine's apt sources already use.  Downloads are kept in
a cache folder, so a second run unpacks without fetching.

A `Sysroot` describes one unpacked glibc: its version, its ld.so, the folder
holding libc.so.6 (for ``--library-path``), its debug files, and the compiler
flags that link a program against it.

Command line: ``python3 cores/scripts/sysroots.py DEST [SUITE ...]`` fetches and unpacks
into DEST/SUITE and prints one line per sysroot.
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

#: suite -> does a reproducer need that glibc's own headers and crt files? (a
#: program linked against a newer glibc refers to symbol versions an older one lacks)
SUITES = {"bullseye": True, "trixie": False, "sid": False}
#: suite -> the oldest glibc it can hold (bullseye and trixie are released and keep theirs; sid only moves on):
#: what tests may know of a suite's glibc before its packages are fetched (collection stays offline)
SUITE_FLOOR = {"bullseye": "2.31", "trixie": "2.41", "sid": "2.43"}
#: suite -> the jemalloc version Debian's libjemalloc2 of that suite holds (run with LD_PRELOAD)
JEMALLOC_SUITES = {"bullseye": "5.2.1", "bookworm": "5.3.0"}
#: the same for suites whose libjemalloc2 needs their own glibc, newer than this machine's (sid's 5.3.1 is
#: built against glibc 2.38 or later): its reproducers run under that suite's ld.so, and it is not linked into
#: programs (that would need that glibc's development files)
JEMALLOC_GLIBC = {"sid": "5.3.1"}
#: the same builds linked into the program (libjemalloc-dev's libjemalloc_pic.a, no prefix, the program
#: stripped): name -> version
JEMALLOC_LINKED = {f"{suite}-linked": version for suite, version in JEMALLOC_SUITES.items()}
_LINKED = "-linked"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
#: names a folder of glibcs built by hand from glibc's release tags, each installed as a sysroot in
#: FOLDER/glibc-X.Y with a VERSION file (docs/platforms.md); the project makes none of them.  Without it,
#: the folder glibc-builds of the cache is used where it exists.
BUILDS_VARIABLE = "HEAPWALK_GLIBC_BUILDS"
BUILD_PREFIX = "glibc-"
MULTIARCH = "x86_64-linux-gnu"


class SysrootError(RuntimeError):
    """A glibc package could not be fetched or unpacked."""


@dataclass(frozen=True)
class Sysroot:
    """One glibc in a folder laid out as Debian's: a Debian package unpacked, or a hand build (`hand_builds`)."""

    suite: str
    root: Path

    @property
    def libdir(self) -> Path:
        for d in (self.root / "usr/lib" / MULTIARCH, self.root / "lib" / MULTIARCH):
            if (d / "libc.so.6").exists():
                return d
        raise SysrootError(f"no libc.so.6 under {self.root}")

    @property
    def ld_so(self) -> Path:
        return self.libdir / "ld-linux-x86-64.so.2"

    @property
    def debug_dir(self) -> Path:
        return self.root / "usr/lib/debug"

    @property
    def version(self) -> str:
        """'2.31' from the unpacked package's changelog folder name or libc file."""
        return (self.root / "VERSION").read_text().strip()

    @property
    def needs_own_headers(self) -> bool:
        return SUITES.get(self.suite, self.suite.startswith(BUILD_PREFIX))

    def launcher(self) -> list[str]:
        """The command prefix that runs a program under this glibc."""
        return [str(self.ld_so), "--library-path", str(self.libdir)]

    def compile_flags(self) -> list[str]:
        """gcc flags that build against this glibc's headers, crt files and libc.so."""
        if not self.needs_own_headers:
            return []
        usrlib = self.root / "usr/lib" / MULTIARCH
        return [f"--sysroot={self.root}", f"-B{usrlib}/", f"-L{usrlib}", f"-L{self.libdir}",
                f"-idirafter/usr/include/{MULTIARCH}", "-idirafter/usr/include"]


def hand_builds_folder() -> Path | None:
    """Where the glibcs built by hand are: $HEAPWALK_GLIBC_BUILDS, else the cache's glibc-builds folder when it
    exists, else None."""
    named = os.environ.get(BUILDS_VARIABLE)
    if named:
        return Path(named)
    cached = cache_dir().parent / "glibc-builds"
    return cached if cached.is_dir() else None


def hand_builds() -> list[Sysroot]:
    """The glibcs built by hand (`hand_builds_folder`), oldest first; none when there is no such folder."""
    folder = hand_builds_folder()
    if folder is None:
        return []
    found = [Sysroot(d.name, d) for d in Path(folder).glob(BUILD_PREFIX + "*") if (d / "VERSION").exists()]
    if not found:
        raise SysrootError(f"${BUILDS_VARIABLE} names {folder}, which holds no {BUILD_PREFIX}X.Y/VERSION")
    return sorted(found, key=lambda s: tuple(int(n) for n in s.version.split(".")[:2]))


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "heapwalk" / "apt"


def _mirror() -> str:
    """The Debian mirror URI the machine's apt sources use (first 'debian' archive)."""
    texts = []
    for p in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            texts.append(p.read_text())
        except OSError:
            continue
    for text in texts:
        for m in re.finditer(r"(?:URIs:|^deb(?:\s+\[[^\]]*\])?)\s+(\S+/debian)\s*$", text, re.M):
            return m.group(1)
    raise SysrootError("no Debian mirror found in /etc/apt/sources.list{,.d}")


def _apt_options(cache: Path) -> list[str]:
    return ["-o", f"Dir::Etc::SourceList={cache / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/dev/null",
            "-o", f"Dir::State::Lists={cache / 'lists'}", "-o", f"Dir::Cache={cache / 'cache'}",
            "-o", "Dir::State::status=/dev/null", "-o", "Debug::NoLocking=1",
            "-o", "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false",
            "-o", "APT::Sandbox::User=root", "-q"]


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SysrootError(f"{' '.join(cmd[:2])} failed: {(result.stderr or result.stdout).strip()[-2000:]}")
    return result.stdout


def _update_lists(cache: Path, suites: list[str]) -> None:
    for d in ("lists/partial", "cache/archives/partial"):
        (cache / d).mkdir(parents=True, exist_ok=True)
    sources = "".join(f"deb [signed-by={KEYRING}] {_mirror()} {s} main\n" for s in suites)
    listfile = cache / "sources.list"
    fresh = listfile.exists() and listfile.read_text() == sources and any((cache / "lists").glob("*Packages*"))
    if not fresh:
        listfile.write_text(sources)
        _run(["apt-get", *_apt_options(cache), "update"])


def fetch_deb(cache: Path, package: str, suite: str) -> Path:
    """PACKAGE's .deb from SUITE: the cached one, else downloaded into the cache."""
    folder = cache / "debs" / suite
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"{package}_*_amd64.deb"))
    if not found:
        _update_lists(cache, list(dict.fromkeys([*SUITES, *JEMALLOC_SUITES])))
        _run(["apt-get", *_apt_options(cache), "download", f"{package}/{suite}"], cwd=folder)
        found = sorted(folder.glob(f"{package}_*_amd64.deb"))
    if not found:
        raise SysrootError(f"apt-get download {package}/{suite} wrote no .deb")
    return found[-1]


def fetch_source(cache: Path, package: str, suite: str, folder: Path) -> None:
    """Downloads the upstream tarballs of source package PACKAGE of SUITE (not Debian's changes, which the
    builds here do not use, and which a mirror may no longer serve) into FOLDER, unpacked by no one, with a
    private list of source packages of the same mirror."""
    lists = cache / "source-lists"
    for d in ("lists/partial", "cache/archives/partial"):
        (lists / d).mkdir(parents=True, exist_ok=True)
    sources = f"deb-src [signed-by={KEYRING}] {_mirror()} {suite} main\n"
    listfile = lists / "sources.list"
    options = [*_apt_options(cache), "-o", f"Dir::Etc::SourceList={listfile}", "-o",
               f"Dir::State::Lists={lists / 'lists'}"]
    if not listfile.exists() or listfile.read_text() != sources or not any((lists / "lists").glob("*Sources*")):
        listfile.write_text(sources)
        _run(["apt-get", *options, "update"])
    _run(["apt-get", *options, "source", "--download-only", "--tar-only", f"{package}/{suite}"], cwd=folder)


def relink_absolute_symlinks(root: Path) -> None:
    """Old packages link to /lib/...: point those links inside ROOT instead."""
    for link in root.rglob("*"):
        if link.is_symlink():
            target = os.readlink(link)
            if target.startswith("/"):
                link.unlink()
                link.symlink_to(os.path.relpath(root / target.lstrip("/"), link.parent))


def prepare(dest: Path, suite: str, cache: Path | None = None) -> Sysroot:
    """Fetches (or reuses) SUITE's glibc packages and unpacks them into DEST/SUITE."""
    cache = cache or cache_dir()
    root = dest / suite
    stamp = root / "VERSION"
    if stamp.exists():
        return Sysroot(suite, root)
    packages = ["libc6", "libc6-dbg"] + (["libc6-dev"] if SUITES.get(suite) else [])
    debs = [fetch_deb(cache, p, suite) for p in packages]
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for deb in debs:
        _run(["dpkg-deb", "-x", str(deb), str(root)])
    relink_absolute_symlinks(root)
    version = re.search(r"libc6_(\d+\.\d+)", debs[0].name)
    if not version:
        raise SysrootError(f"cannot read the glibc version from {debs[0].name}")
    sysroot = Sysroot(suite, root)
    sysroot.ld_so  # raises if the layout is not as expected
    stamp.write_text(version.group(1) + "\n")
    return sysroot


@dataclass(frozen=True)
class Jemalloc:
    """One Debian jemalloc unpacked into a folder: libjemalloc2's shared library (run with LD_PRELOAD), or
    libjemalloc-dev's archive (ARCHIVE set: linked into the program, its entry points named with PREFIX)."""

    suite: str
    root: Path
    archive: Path | None = None
    prefix: str = ""
    shared: Path | None = None      # a shared library built from source (None: Debian's, under usr/lib)

    @property
    def library(self) -> Path:
        """The file the reproducer runs on: the shared library, or the archive it is linked with."""
        return self.archive or self.shared or self.root / "usr/lib" / MULTIARCH / "libjemalloc.so.2"

    @property
    def version(self) -> str:
        return (self.root / "VERSION").read_text().strip()

    @property
    def conf_variable(self) -> str:
        """The environment variable the build reads its options from (MALLOC_CONF under its prefix)."""
        return f"{self.prefix.upper()}MALLOC_CONF"

    def environment(self) -> dict[str, str]:
        """What runs a program on this jemalloc instead of glibc's malloc (nothing when it is linked in)."""
        return {} if self.archive else {"LD_PRELOAD": str(self.library)}

    def glibc(self) -> Sysroot | None:
        """The glibc this jemalloc needs beside it, newer than the machine's (`JEMALLOC_GLIBC`), fetched or
        reused next to it; None when the machine's will do."""
        return prepare(self.root.parent, self.suite) if self.suite in JEMALLOC_GLIBC else None


def prepare_jemalloc(dest: Path, name: str, cache: Path | None = None) -> Jemalloc:
    """Fetches (or reuses) jemalloc NAME and unpacks it into DEST/jemalloc-NAME: SUITE's libjemalloc2, or
    for SUITE-linked its libjemalloc-dev."""
    cache = cache or cache_dir()
    root = dest / f"jemalloc-{name}"
    suite, linked = (name[:-len(_LINKED)], True) if name.endswith(_LINKED) else (name, False)
    package = "libjemalloc-dev" if linked else "libjemalloc2"
    jemalloc = Jemalloc(name, root, root / "usr/lib" / MULTIARCH / "libjemalloc_pic.a" if linked else None)
    if (root / "VERSION").exists():
        return jemalloc
    deb = fetch_deb(cache, package, suite)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    _run(["dpkg-deb", "-x", str(deb), str(root)])
    version = re.search(package + r"_(\d+\.\d+\.\d+)", deb.name)
    if not version or not jemalloc.library.exists():
        raise SysrootError(f"{deb.name} holds no {jemalloc.library.name} of a known version")
    (root / "VERSION").write_text(version.group(1) + "\n")
    return jemalloc


def available_jemallocs(dest: Path) -> list[Jemalloc]:
    """The jemallocs already unpacked under DEST, oldest first."""
    return [prepare_jemalloc(dest, s) for s in [*JEMALLOC_SUITES, *JEMALLOC_LINKED]
            if (dest / f"jemalloc-{s}" / "VERSION").exists()]


def available(dest: Path) -> list[Sysroot]:
    """The sysroots already unpacked under DEST, oldest glibc first."""
    found = [Sysroot(s, dest / s) for s in SUITES if (dest / s / "VERSION").exists()]
    return sorted(found, key=lambda s: tuple(int(x) for x in s.version.split(".")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("suites", nargs="*", default=list(SUITES))
    parser.add_argument("--jemalloc", action="store_true", help="the suites' libjemalloc2 (SUITE-linked: their "
                        "libjemalloc-dev) instead of their glibc")
    args = parser.parse_intermixed_args(argv)
    if args.jemalloc:
        for suite in args.suites:
            try:
                j = prepare_jemalloc(args.dest, suite)
            except SysrootError as exc:
                print(f"{suite}: {exc}", file=sys.stderr)
                return 1
            print(f"{suite}: jemalloc {j.version} in {j.root}")
        return 0
    for suite in args.suites:
        try:
            s = prepare(args.dest, suite)
        except SysrootError as exc:
            print(f"{suite}: {exc}", file=sys.stderr)
            return 1
        print(f"{suite}: glibc {s.version} in {s.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
