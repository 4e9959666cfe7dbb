"""Other projects' sources for the builds the tests run on, each taken from a package registry by its ordinary
client and cached: a crate that bundles an allocator's C sources (cargo), a PyPI sdist that does (pip), or a
Debian source package (`sysroots.fetch_source`).  Nothing of another project is kept in this repository: a
build names its registry package and version here, and docs/platforms.md lists which package carries which
allocator release and how that was checked (the bundled sources compared file by file with the release's).

Command line: ``python3 cores/scripts/sources.py crate NAME VERSION`` or ``sdist NAME VERSION`` prints the unpacked
package's folder (fetched the first time).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Union

__all__ = ["Crate", "Sdist", "Source", "SourceError", "cargo", "unpacked", "fetched"]


class SourceError(RuntimeError):
    """A registry package could not be fetched or does not hold what was expected of it."""


@dataclass(frozen=True)
class Crate:
    """Crate NAME at VERSION (exactly) from crates.io, and the FOLDER in it that holds the allocator's sources."""

    name: str
    version: str
    folder: str

    def describe(self) -> str:
        return f"crate {self.name} {self.version}"


@dataclass(frozen=True)
class Sdist:
    """PyPI package NAME's source distribution at VERSION, and the FOLDER in it that holds the allocator's
    sources."""

    name: str
    version: str
    folder: str

    def describe(self) -> str:
        return f"PyPI sdist {self.name} {self.version}"


Source = Union[Crate, Sdist]


def cache_dir() -> Path:
    """Where fetched packages are unpacked (beside the sysroots' downloads)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "heapwalk" / "sources"


def cargo() -> str:
    """cargo's path: on PATH, or where rustup puts it."""
    found = shutil.which("cargo") or shutil.which("cargo", path=str(Path.home() / ".cargo" / "bin"))
    if found is None:
        raise SourceError("cargo is not installed: the crates that bundle the allocators' sources need Rust's "
                          "toolchain (rustup)")
    return found


def fetched(source: Source, cache: Path | None = None) -> Path:
    """The unpacked package of SOURCE (its whole folder), fetched from its registry the first time."""
    cache = cache or cache_dir()
    return _crate(source, cache) if isinstance(source, Crate) else _sdist(source, cache)


def unpacked(source: Source, cache: Path | None = None) -> Path:
    """The folder of SOURCE's package that holds the allocator's sources, fetched the first time."""
    folder = fetched(source, cache) / source.folder
    if not folder.is_dir():
        raise SourceError(f"{source.describe()} holds no folder {source.folder}")
    return folder


def _crate(crate: Crate, cache: Path) -> Path:
    """Crate CRATE unpacked by cargo into its registry cache: a package of ours that depends on it alone (one
    a crate version, since such crates may declare the same native library) is resolved with `cargo
    metadata`, which fetches it and says where it is."""
    manifest = cache / "crates" / f"{crate.name}-{crate.version}" / "Cargo.toml"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    (manifest.parent / "lib.rs").write_text("")
    manifest.write_text("[package]\nname = \"heapwalk-source\"\nversion = \"0.0.0\"\nedition = \"2021\"\n"
                        "publish = false\n\n[lib]\npath = \"lib.rs\"\n\n[dependencies]\n"
                        f"{crate.name} = \"={crate.version}\"\n")
    result = subprocess.run([cargo(), "metadata", "--format-version", "1", "--quiet", "--manifest-path",
                             str(manifest)], capture_output=True, text=True)
    if result.returncode != 0:
        raise SourceError(f"{crate.describe()}: cargo metadata failed: {result.stderr.strip()[-2000:]}")
    for package in json.loads(result.stdout)["packages"]:
        if package["name"] == crate.name and package["version"].split("+")[0] == crate.version:
            return Path(package["manifest_path"]).parent
    raise SourceError(f"{crate.describe()}: cargo resolved no such package")


def _sdist(sdist: Sdist, cache: Path) -> Path:
    """SDIST downloaded by pip (its source distribution, never a wheel) and unpacked into the cache."""
    folder = cache / "sdists" / f"{sdist.name}-{sdist.version}"
    done = folder / ".unpacked"
    if done.exists():
        return Path(done.read_text().strip())
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    result = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                             sdist.name, "-d", str(folder), f"{sdist.name}=={sdist.version}"],
                            capture_output=True, text=True)
    archives = sorted(p for p in folder.iterdir() if p.name.endswith((".tar.gz", ".zip")))
    if result.returncode != 0 or len(archives) != 1:
        raise SourceError(f"{sdist.describe()}: pip download failed: {(result.stderr or result.stdout)[-2000:]}")
    with tarfile.open(archives[0]) as tar:
        _extract(tar, folder)
    archives[0].unlink()
    tops = [p for p in folder.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise SourceError(f"{sdist.describe()}: its archive holds {len(tops)} top folders, not one")
    done.write_text(str(tops[0]) + "\n")
    return tops[0]


def _extract(tar: tarfile.TarFile, folder: Path) -> None:
    """TAR unpacked into FOLDER, refusing members that would land outside it."""
    root = folder.resolve()
    for member in tar.getmembers():
        target = (folder / member.name).resolve()
        if root not in target.parents and target != root:
            raise SourceError(f"{member.name}: outside the archive's folder")
        if member.issym() or member.islnk():
            raise SourceError(f"{member.name}: a link in an sdist")
    tar.extractall(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["crate", "sdist"])
    parser.add_argument("name")
    parser.add_argument("version")
    args = parser.parse_args(argv)
    kind = Crate if args.kind == "crate" else Sdist
    try:
        print(fetched(kind(args.name, args.version, ".")))
    except SourceError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
