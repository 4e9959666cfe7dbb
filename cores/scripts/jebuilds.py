"""jemalloc built from source with the options production builds use, for the reproducers to link.

Debian's jemalloc comes one way (shared, no prefix, statistics on, 16-byte quantum).  Programs that bring
their own jemalloc configure it otherwise: Redis vendors 5.2.1 with ``--with-lg-quantum=3
--with-jemalloc-prefix=je_``, tikv-jemallocator builds 5.3.0 with ``_rjem_`` and no statistics, others
build with ``--enable-debug``.  Each build here is one of those: its sources come from package registries,
Debian's source packages (jemalloc's own for 5.3.0, redis's vendored copy for 5.2.1) fetched with ``apt-get
source`` from the mirror the machine's apt uses, or the crates that bundle jemalloc (5.1.0, 5.2.1 and 5.3.1:
cores/scripts/sources.py), configured, and compiled into ``lib/libjemalloc_pic.a``, which the harness links into a
stripped program (or a shared library).  Builds are cached beside the sysroots (``jemalloc-NAME``), made once.

The virtual address width (``--with-lg-vaddr``) is pinned: jemalloc's configure would otherwise take it
from the build machine's CPU (57 with 5-level paging), and with it the shape of its radix tree.

It also builds redis-server 7.0 and 8.0 as Redis's own Makefile builds them (``make MALLOC=jemalloc``), for
tests/cores/jemalloc/test_redis.py to run on loopback, and the Rust reproducer cores/jemalloc/rust_hold with tikv-jemallocator (its
crates fetched by name the first time, with the versions Cargo.lock pins), for tests/cores/jemalloc/test_jemalloc_held.py.

Command line: ``python3 cores/scripts/jebuilds.py DEST [NAME ... redis rust]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import fresh
import sources
import sysroots

__all__ = ["SourceBuild", "BUILDS", "prepare_build", "prepare_redis", "REDIS", "REDIS_BUILDS", "prepare_rust",
           "RUST_HOLD", "cargo_program"]


@dataclass(frozen=True)
class SourceBuild:
    """A jemalloc configured from a registry's sources: where the source is (PACKAGE of SUITE, a Debian source
    package, or CRATE; and the folder of jemalloc in it), the version, the prefix of its entry points and its
    configure options."""

    package: str
    suite: str
    folder: str
    version: str
    prefix: str
    options: tuple[str, ...]
    shared: bool = False        # a shared library the reproducers run on with LD_PRELOAD, not an archive
    crate: sources.Crate | None = None  # the source as a crate bundles it instead of a Debian source package
    cflags: str | None = "-O2"  # CFLAGS (None: none given, as a plain ./configure; --enable-debug then adds no -O)


_JEMALLOC = ("jemalloc", "bookworm", "jemalloc-5.3.0", "5.3.0")
_REDIS = ("redis", "bookworm", "redis-7.0.15/deps/jemalloc", "5.2.1")
#: the crates that bundle a jemalloc release's sources with the configure script made for them (in the crate's
#: folder configure/): jemalloc-sys 0.3.2 holds 5.1.0's (Debian buster's libjemalloc2, FreeBSD 12's libc:
#: buster's packages are gone from the mirror); tikv-jemalloc-sys 0.4.1 holds 5.2.1's (Debian bullseye's, whose
#: source package the mirror no longer serves) with one change of its own to heap profiling's exit hook
#: (src/prof.c); tikv-jemalloc-sys 0.7.1 holds 5.3.1's (April 2026).  Each compared file by file with the
#: release's sources (docs/platforms.md).
_CRATE_510 = sources.Crate("jemalloc-sys", "0.3.2", "jemalloc")
_CRATE_521 = sources.Crate("tikv-jemalloc-sys", "0.4.1", "jemalloc")
_CRATE_531 = sources.Crate("tikv-jemalloc-sys", "0.7.1", "jemalloc")
_JEMALLOC_510 = ("jemalloc", "crate", "jemalloc", "5.1.0")
_JEMALLOC_521 = ("jemalloc", "crate", "jemalloc", "5.2.1")
_JEMALLOC_531 = ("jemalloc", "crate", "jemalloc", "5.3.1")
#: name -> build: every one is decoded but 5.3.0-q32, which heapwalk names and does not decode yet
BUILDS = {
    "5.3.0-je": SourceBuild(*_JEMALLOC, "je_", ("--with-jemalloc-prefix=je_", "--with-lg-vaddr=48")),
    # as Debian buster ships it: a shared library, no prefix
    "5.1.0": SourceBuild(*_JEMALLOC_510, "", ("--with-lg-vaddr=48",), shared=True,
                         crate=_CRATE_510),
    "5.3.0-debug": SourceBuild(*_JEMALLOC, "", ("--enable-debug", "--with-lg-vaddr=48")),
    # as './configure --enable-debug' makes it with no CFLAGS: unoptimised code (-O0), preloaded
    "5.3.0-debug-O0": SourceBuild(*_JEMALLOC, "", ("--enable-debug", "--with-lg-vaddr=48"), shared=True,
                                  cflags=None),
    "5.3.1": SourceBuild(*_JEMALLOC_531, "", ("--with-lg-vaddr=48",), crate=_CRATE_531),
    "5.1.0-debug": SourceBuild(*_JEMALLOC_510, "", ("--enable-debug", "--with-lg-vaddr=48"),
                               crate=_CRATE_510),
    # a 32-byte quantum (33 small classes): heapwalk has no layout for it, and says so
    "5.3.0-q32": SourceBuild(*_JEMALLOC, "", ("--with-lg-quantum=5", "--with-lg-vaddr=48")),
    "5.2.1-debug": SourceBuild(*_JEMALLOC_521, "", ("--enable-debug", "--with-lg-vaddr=48"),
                               crate=_CRATE_521),
    # a debug build with Redis's quantum: heapwalk has no layout for it, and says so
    "5.3.0-q8-debug": SourceBuild(*_JEMALLOC, "je_", ("--enable-debug", "--with-lg-quantum=3",
                                                      "--with-jemalloc-prefix=je_", "--with-lg-vaddr=48")),
    "5.3.0-nostats": SourceBuild(*_JEMALLOC, "_rjem_", ("--disable-stats", "--with-jemalloc-prefix=_rjem_",
                                                        "--with-private-namespace=_rjem_", "--with-lg-vaddr=48")),
    "redis-5.2.1": SourceBuild(*_REDIS, "je_", ("--with-version=5.2.1-0-g0", "--with-lg-quantum=3",
                                                "--with-jemalloc-prefix=je_", "--with-lg-vaddr=48")),
    # as Redis 7.2 and later configure their vendored 5.3.0
    # a shared library whose TLS is reached through __tls_get_addr (no initial-exec slot), preloaded
    "5.3.0-noietls": SourceBuild(*_JEMALLOC, "", ("--disable-initial-exec-tls", "--with-lg-vaddr=48"), shared=True),
    "5.3.0-q8": SourceBuild(*_JEMALLOC, "je_", ("--with-lg-quantum=3", "--with-jemalloc-prefix=je_",
                                                "--with-lg-vaddr=48")),
    # as configure makes them on a machine with 5-level paging: a three-level radix tree, 16-byte leaf entries
    "5.3.0-vaddr57": SourceBuild(*_JEMALLOC, "", ("--with-lg-vaddr=57",)),
    "redis-5.2.1-vaddr57": SourceBuild(*_REDIS, "je_", ("--with-version=5.2.1-0-g0", "--with-lg-quantum=3",
                                                        "--with-jemalloc-prefix=je_", "--with-lg-vaddr=57")),
}


class BuildError(RuntimeError):
    pass


def prepare_build(dest: Path, name: str, cache: Path | None = None) -> sysroots.Jemalloc:
    """Builds (or reuses) jemalloc NAME of BUILDS into DEST/jemalloc-NAME, and describes it for the harness."""
    build = BUILDS[name]
    root = dest / f"jemalloc-{name}"
    target = "lib/libjemalloc.so.2" if build.shared else "lib/libjemalloc_pic.a"
    jemalloc = sysroots.Jemalloc(name, root, None if build.shared else root / target, build.prefix,
                                 root / target if build.shared else None)
    if (root / "VERSION").exists() and (root / target).exists():
        return jemalloc
    source = _source(cache or sysroots.cache_dir(), build)
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(source / build.folder, root, symlinks=True)
    if build.crate is not None:
        _crate_configure(source, root)
    env = {k: v for k, v in os.environ.items() if k != "CFLAGS"}
    if build.cflags is not None:
        env["CFLAGS"] = build.cflags
    for cmd in (["./configure", *build.options], ["make", f"-j{os.cpu_count() or 2}", target]):
        result = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildError(f"jemalloc {name}: {' '.join(cmd)} failed: {(result.stderr or result.stdout)[-2000:]}")
    (root / "VERSION").write_text(build.version + "\n")
    return jemalloc


#: redis-server built as upstream builds it (make MALLOC=jemalloc: its vendored jemalloc linked in under the
#: je_ prefix with an 8-byte quantum, its entry points exported with -rdynamic), the virtual address width
#: pinned; by Redis version: 7.0 vendors jemalloc 5.2.1, 7.2 and later 5.3.0 (configured also with
#: --disable-cache-oblivious)
REDIS_BUILDS = {
    "7.0.15": SourceBuild("redis", "bookworm", "redis-7.0.15", "5.2.1", "je_",
                          ("JEMALLOC_CONFIGURE_OPTS=--with-lg-vaddr=48",)),
    "8.0.2": SourceBuild("redis", "trixie", "redis-8.0.2", "5.3.0", "je_",
                         ("JEMALLOC_CONFIGURE_OPTS=--with-lg-vaddr=48",)),
}
REDIS = REDIS_BUILDS["7.0.15"]


def prepare_redis(dest: Path, version: str = "7.0.15", cache: Path | None = None) -> tuple[Path, Path]:
    """Builds (or reuses) redis-server VERSION (of REDIS_BUILDS) into DEST/redis-VERSION, stripped as
    distributions ship it (its exported entry points stay), and the module cores/jemalloc/redis_snapshot.c beside it;
    returns both."""
    redis = REDIS_BUILDS[version]
    root = dest / redis.folder
    program, module = root / "redis-server", root / "heapwalk_snapshot.so"
    source = _source(cache or sysroots.cache_dir(), redis) / redis.folder
    if not program.exists():
        build = root.with_name(root.name + ".build")
        if build.exists():
            shutil.rmtree(build)
        shutil.copytree(source, build, symlinks=True)
        cmd = ["make", f"-j{os.cpu_count() or 2}", "MALLOC=jemalloc", *redis.options, "redis-server"]
        result = subprocess.run(cmd, cwd=build, capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildError(f"redis {version}: {' '.join(cmd)} failed: {(result.stderr or result.stdout)[-2000:]}")
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["strip", "-o", str(program), str(build / "src" / "redis-server")], check=True)
        shutil.rmtree(build)
    code = Path(__file__).resolve().parents[1] / "jemalloc" / "redis_snapshot.c"
    if not module.exists() or module.stat().st_mtime < code.stat().st_mtime:
        subprocess.run(["gcc", "-O1", "-Wall", "-fPIC", "-shared", f"-I{source / 'src'}", str(code), "-o",
                        str(module)], check=True)
    return program, module


#: the Rust reproducer's crate: a service on tikv-jemallocator (jemalloc 5.3.0 in the program, ``_rjem_``
#: prefix, no statistics), built as cargo builds it for release, the virtual address width pinned
RUST_HOLD = Path(__file__).resolve().parents[1] / "jemalloc" / "rust_hold"


def prepare_rust(dest: Path) -> Path:
    """Builds (or reuses) the Rust reproducer into DEST/rust-hold/rust_hold, stripped as services ship; cargo
    fetches its crates the first time (set-up), and builds in DEST/rust-hold/target."""
    return cargo_program(RUST_HOLD, dest / "rust-hold", "rust_hold", {"JEMALLOC_SYS_WITH_LG_VADDR": "48"},
                         "the Rust reproducer (tikv-jemallocator)")


def cargo_program(folder: Path, root: Path, name: str, env: dict[str, str], what: str,
                  features: tuple[str, ...] = ()) -> Path:
    """The cargo package in FOLDER (its Cargo.lock kept) built for release in ROOT/target with ENV and its
    FEATURES, stripped into ROOT/NAME; again only when its manifest, lock or sources changed.  WHAT names it in
    errors."""
    program = root / name
    inputs = fresh.digest([folder / "Cargo.toml", folder / "Cargo.lock", *sorted((folder / "src").glob("*.rs"))],
                          env, *((features,) if features else ()))
    if fresh.marked(program, inputs):
        return program
    cargo = shutil.which("cargo") or shutil.which("cargo", path=str(Path.home() / ".cargo" / "bin"))
    if cargo is None:
        raise BuildError(f"cargo is not installed: {what} needs Rust's toolchain (rustup)")
    root.mkdir(parents=True, exist_ok=True)
    cmd = [cargo, "build", "--release", "--locked", "--quiet", "--manifest-path", str(folder / "Cargo.toml"),
           *(["--features", ",".join(features)] if features else [])]
    result = subprocess.run(cmd, env={**os.environ, "CARGO_TARGET_DIR": str(root / "target"), **env},
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"{name}: {' '.join(cmd)} failed: {(result.stderr or result.stdout)[-2000:]}")
    subprocess.run(["strip", "-o", str(program), str(root / "target" / "release" / name)], check=True)
    fresh.mark(program, inputs)
    return program


def _source(cache: Path, build: SourceBuild) -> Path:
    """The unpacked upstream source of BUILD's Debian source package (fetched once into the cache), or its crate
    (fetched by cargo into its registry cache)."""
    if build.crate is not None:
        try:
            return sources.fetched(build.crate)
        except sources.SourceError as exc:
            raise BuildError(f"jemalloc {build.version}: {exc}") from None
    folder = cache / "sources" / build.suite / build.package
    if (folder / build.folder).exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tarballs = sorted(folder.glob(f"{build.package}_*.orig.tar.*"))
    if not tarballs:
        sysroots.fetch_source(cache, build.package, build.suite, folder)
        tarballs = sorted(folder.glob(f"{build.package}_*.orig.tar.*"))
    if not tarballs:
        raise BuildError(f"apt-get source {build.package}/{build.suite} wrote no upstream tarball")
    with tarfile.open(tarballs[-1]) as tar:
        tar.extractall(folder)
    return folder


def _crate_configure(package: Path, root: Path) -> None:
    """Puts in ROOT, a copy of crate PACKAGE's jemalloc, what the crate's build script puts beside it: the
    configure script of the crate's folder configure/, and the release (its VERSION file, or the release the
    crate's version names after '+', which its build script passes with --with-version)."""
    shutil.copy(package / "configure" / "configure", root / "configure")
    version = package / "configure" / "VERSION"
    if version.exists():
        shutil.copy(version, root / "VERSION")
    else:
        (root / "VERSION").write_text(_crate_release(package) + "\n")


def _crate_release(package: Path) -> str:
    """The jemalloc release a tikv-jemalloc-sys crate bundles, from its version's build metadata
    ('0.7.1+5.3.1-0-g81034ce...' -> '5.3.1-0-g81034ce...')."""
    for line in (package / "Cargo.toml").read_text().splitlines():
        if line.startswith("version = ") and "+" in line:
            return line.split("+", 1)[1].strip().strip('"')
    raise sources.SourceError(f"{package.name}: no jemalloc release in its version")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("names", nargs="*", default=[*BUILDS, "redis", "rust"])
    args = parser.parse_args(argv)
    for name in args.names:
        if name == "rust":
            try:
                print(f"rust: {prepare_rust(args.dest)}")
            except (BuildError, subprocess.CalledProcessError) as exc:
                print(f"rust: {exc}", file=sys.stderr)
                return 1
            continue
        if name == "redis":
            for version in REDIS_BUILDS:
                try:
                    print(f"redis {version}: {prepare_redis(args.dest, version)[0]}")
                except (BuildError, sysroots.SysrootError, subprocess.CalledProcessError) as exc:
                    print(f"redis {version}: {exc}", file=sys.stderr)
                    return 1
            continue
        try:
            j = prepare_build(args.dest, name)
        except (BuildError, sysroots.SysrootError) as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
        print(f"{name}: jemalloc {j.version} in {j.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
