"""Does moving code move output?  Every command's text, JSON, XML and page on reproducer cores of every
allocator, printed by this tree and by the tree of a git revision, compared byte for byte.

    python tests/tools/same_as.py REV            # e.g. the commit before a restructuring

The revision's files are taken with `git archive` into a temporary folder (its compiled C libraries copied
from this tree, whose sources a restructuring does not change); both trees run in the same gdb with the same
cores, so nothing but the code differs.  Prints each difference (the first lines of a diff) and exits 1 when
there is one.  A development tool for restructurings (issue 73); tests/cores/commands/test_same_output.py holds the output to
a fixed old baseline in `make test`.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "cores" / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "tools"))
sys.path.insert(0, str(ROOT / "tests"))

#: each allocator's commands; {d} is the folder the documents go to
COMMON = ("heapwalk report", "heapwalk report --json {d}/report.json", "heapwalk report --html {d}/report.html",
          "heapwalk check --json {d}/check.json", "heapwalk arenas", "heapwalk threads")
GLIBC = COMMON + ("heapwalk bins --json {d}/bins.json", "heapwalk tcache --json {d}/tcache.json",
                  "heapwalk chunks --limit 20 --json {d}/chunks.json", "heapwalk report --xml {d}/malloc_info.xml",
                  "heapwalk check", "heapwalk bins", "heapwalk tcache")


def cases():
    """(name, capture, gdb -iex settings, commands) of the cores compared: glibc's on three glibcs (symbols
    hidden but on the system's), damaged ones, and each other allocator's."""
    import harness
    from conftest import (NO_SYMBOLS, SYSROOTS, capture, capture_jemalloc, capture_mimalloc, capture_tcmalloc,
                          corruption, glibc)
    for g, name, symbols in (("system", "bins", True), ("system", "thread_arenas", False), ("system", "leak", False),
                             ("system", "mmapped", False), ("bullseye", "many_arenas", False),
                             ("sid", "thread_arenas", False)):
        yield f"{g}/{name}", capture(g, name), glibc(g).gdb_settings(symbols), GLIBC
    for mode in ("tcache_in_free", "chunk_size", "fd_bk", "top_shrunk"):
        yield f"system/corrupt-{mode}", corruption("system", mode), glibc("system").gdb_settings(False), GLIBC
    jemalloc = harness.jemalloc_reproducers(harness.prepare_jemalloc(SYSROOTS, "bookworm"))
    for name in jemalloc[:2]:
        yield f"jemalloc-bookworm/{name}", capture_jemalloc("bookworm", name), [NO_SYMBOLS], COMMON
    yield "tcmalloc-bookworm", capture_tcmalloc("bookworm"), [NO_SYMBOLS], COMMON
    for suite in ("bookworm", "3.3.2"):
        yield f"mimalloc-{suite}", capture_mimalloc(suite), [NO_SYMBOLS], COMMON


def run(tree: Path, cap, iex: list[str], commands, out: Path) -> str:
    """The text gdb prints running COMMANDS with TREE's heapwalk on CAP; documents written into OUT."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = ["gdb", "-nx", "-batch", "-q"]
    for c in iex:
        cmd += ["-iex", c]
    cmd += ["-x", str(tree / "gdbinit")]
    for c in commands:
        cmd += ["-ex", c.format(d=out)]
    cmd += [str(cap.exe), str(cap.core)]
    env = {"HEAPWALK_VENV": str(ROOT / ".venv"), "PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
           "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    return (result.stdout + result.stderr).replace(str(out), "OUT")


#: what differs from run to run by itself: the minute a page was made
_CLOCK = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC")


def differences(name: str, a: str, b: str) -> list[str]:
    """The first lines of a diff of A (the revision's) and B (this tree's), under NAME; none when equal."""
    a, b = _CLOCK.sub("(time)", a), _CLOCK.sub("(time)", b)
    if a == b:
        return []
    diff = list(difflib.unified_diff(a.splitlines(), b.splitlines(), "revision", "this tree", lineterm="", n=1))
    return [f"{name}:"] + diff[:40]


def tree_of(revision: str, into: Path) -> Path:
    """REVISION's files in INTO, with this tree's compiled C libraries beside their sources."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    for lib in (ROOT / "heapwalk").rglob("*.so"):
        target = into / lib.relative_to(ROOT)
        if target.parent.is_dir():
            shutil.copy2(lib, target)
    return into


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision")
    args = parser.parse_args()
    found = []
    with tempfile.TemporaryDirectory(prefix="same-as-") as tmp:
        old = tree_of(args.revision, Path(tmp) / "tree")
        for name, cap, iex, commands in cases():
            a_dir, b_dir = Path(tmp) / "a" / name, Path(tmp) / "b" / name
            text_a, text_b = run(old, cap, iex, commands, a_dir), run(ROOT, cap, iex, commands, b_dir)
            here = differences(f"{name}: the text", text_a, text_b)
            for document in sorted(p.name for p in a_dir.iterdir()) if a_dir.is_dir() else ():
                other = b_dir / document
                here += differences(f"{name}: {document}", (a_dir / document).read_text(),
                                    other.read_text() if other.exists() else "")
            print(f"{name}: " + ("the same" if not here else "DIFFERENT"))
            found += here
    print("\n".join(found))
    print(f"same_as {args.revision}: " + ("every output the same" if not found else "outputs differ"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
