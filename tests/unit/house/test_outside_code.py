"""Nothing of another project in the tree: no archive (by name or by its first bytes), no binary, no file that
only a vendored source tree or its build would hold, and no other author's copyright notice.  The builds the
tests need fetch their sources from package registries (cores/scripts/sources.py, docs/platforms.md); heapwalk's own
baseline in tests/data is the one archive, and it holds heapwalk alone."""

from __future__ import annotations

import re
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: heapwalk's own earlier tree, which tests/cores/commands/test_same_output.py compares with
OWN_ARCHIVE = re.compile(r"tests/data/baseline-[0-9a-f]+\.tar\.gz")
OWN_ARCHIVE_MEMBERS = re.compile(r"(heapwalk(/.*)?|gdbinit)")
ARCHIVE_NAMES = re.compile(r".*\.(tar|tgz|txz|tbz2?|tar\.\w+|gz|xz|bz2|zst|lz|lzma|zip|7z|rar|crate|whl|egg|deb|"
                           r"rpm|jar|a|so|so\.\d+|o|dylib|dll|exe)$", re.I)
#: first bytes -> what such a file is
MAGIC = {b"\x1f\x8b": "a gzip archive", b"\xfd7zXZ\x00": "an xz archive", b"BZh": "a bzip2 archive",
         b"\x28\xb5\x2f\xfd": "a zstd archive", b"PK\x03\x04": "a zip archive", b"7z\xbc\xaf\x27\x1c": "a 7z archive",
         b"!<arch>\n": "an ar archive (a .deb or a static library)", b"\x7fELF": "an ELF binary",
         b"Rar!": "a rar archive"}
#: names only another project's sources or its build system bring
UPSTREAM_FILES = {"configure", "configure.ac", "configure.in", "CMakeLists.txt", "Makefile.in", "Makefile.am",
                  "autogen.sh", "meson.build", "BUILD.bazel", "WORKSPACE", "COPYING", "LICENSE", "LICENSE.txt",
                  "LICENSE.md", "NOTICE", "AUTHORS", "ChangeLog", "config.guess", "config.sub", "install-sh"}
NOTICE = re.compile("copy" + r"right\s*(\(c\)|©|\d{4})", re.I)


def tracked_files() -> list[str]:
    """The tree's files as git tracks them (a tree without git: every file but the ones the build makes)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        return [f for f in out.decode().split("\0") if f and (ROOT / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "build", "__pycache__", ".pytest_cache"}
        return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                if p.is_file() and not skip & set(p.relative_to(ROOT).parts) and ".egg-info" not in str(p)]


FILES = tracked_files()


def test_the_tree_holds_no_archive_and_no_binary():
    """No file is an archive or a built binary, by its name or by its first bytes, but heapwalk's own baseline."""
    found = []
    for name in FILES:
        if OWN_ARCHIVE.fullmatch(name):
            continue
        head = (ROOT / name).open("rb").read(8)
        kind = next((what for magic, what in MAGIC.items() if head.startswith(magic)), None)
        if kind is None and (ROOT / name).stat().st_size > 262:
            with (ROOT / name).open("rb") as fh:
                fh.seek(257)
                kind = "a tar archive" if fh.read(5) == b"ustar" else None
        if kind or ARCHIVE_NAMES.match(name):
            found.append(f"{name}: {kind or 'named as an archive or a binary'}")
    assert found == []


def test_heapwalk_s_own_baseline_holds_heapwalk_alone():
    """The one archive the tree keeps is an earlier heapwalk: its package and gdbinit, nothing else."""
    baselines = [f for f in FILES if OWN_ARCHIVE.fullmatch(f)]
    assert baselines
    for name in baselines:
        with tarfile.open(ROOT / name) as tar:
            strangers = [m.name for m in tar.getmembers() if not OWN_ARCHIVE_MEMBERS.fullmatch(m.name.rstrip("/"))]
        assert strangers == [], name


def test_no_vendored_source_tree():
    """No file only a vendored source tree brings (its configure script, its build files, its licence), and no
    other author's copyright notice in any text file."""
    upstream = [f for f in FILES if Path(f).name in UPSTREAM_FILES]
    assert upstream == []
    notices = []
    for name in FILES:
        if OWN_ARCHIVE.fullmatch(name) or name.endswith(".png"):
            continue
        text = (ROOT / name).read_text(errors="replace")
        notices += [f"{name}: {m.group(0)}" for m in NOTICE.finditer(text)]
    assert notices == []


@pytest.mark.parametrize("name,expected", [("cores/data/mimalloc-2.0.5.tar.xz", True), ("a/libjemalloc_pic.a", True),
                                           ("cores/mimalloc/mi_hold.c", False), ("tests/data/x.json", False)])
def test_archive_names_are_recognised(name, expected):
    """The name test catches the release tarballs and built libraries the tree once held, and spares sources."""
    assert bool(ARCHIVE_NAMES.match(name)) == expected
