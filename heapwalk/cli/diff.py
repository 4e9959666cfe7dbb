"""``heapwalk diff A B``: which arenas grew between two snapshots, and in them which size classes of free
pieces and of chunks in use, and which signatures of chunks in use; each snapshot a core (reported first), a
report's JSON or a capture's folder; with their RSS where the snapshots recorded it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import List, Optional, Tuple

from heapwalk.analysis.diff import ArenaTotals, Signatures, diff
from heapwalk.analysis.rss import rss_change
from heapwalk.output.rsstext import rss_change_lines
from heapwalk.cli.cores import open_core, report_command
from heapwalk.cli.gdbmi import CliError
from heapwalk.output import jsondoc
from heapwalk.output.difftext import diff_text
from heapwalk.output.htmldiff import diff_html
from heapwalk.output.htmlpage import made_by


def process_rss(path: Path) -> int | None:
    """The process's RSS at the capture whose folder holds PATH (capture.json's mappings), or None."""
    record = path.parent / "capture.json"
    try:
        smaps = json.loads(record.read_text()).get("smaps") or []
        return sum(int(m.get("rss") or 0) for m in smaps) if smaps else None
    except (OSError, ValueError, AttributeError, TypeError):
        return None


#: each allocator of a snapshot: its name, its arenas, its blocks in use by signature (or None)
Snapshot = List[Tuple[str, List[ArenaTotals], Optional[Signatures]]]


def _snapshot(args, path: Path, out: Path) -> tuple[Snapshot, dict | None]:
    """Each allocator of PATH's report, named, with its arenas and its blocks in use by signature, and the
    process's RSS by owner where the report has it: read as is when it is JSON, computed with gdb (written to
    OUT) when it is a core; a capture's folder stands for its report.json."""
    if path.is_dir() and (path / "report.json").exists():
        path = path / "report.json"
    if not path.exists():
        raise CliError(f"heapwalk: no such file: {path}")
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"\x7fELF":
        gdb, _ = open_core(args, path, None)
        with gdb:
            gdb.run(report_command(out, None))
        path = out
    try:
        doc = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        raise CliError(f"heapwalk: {path} is neither a core file nor heapwalk JSON") from None
    try:
        parts = jsondoc.allocator_parts(doc if isinstance(doc, dict) else {})
        owners = [(part.get("report") or {}).get("rss_by_owner") for _, part in parts]
        rss = next((o for o in owners if isinstance(o, dict)), None)
        return [(name, jsondoc.read_snapshot(part), jsondoc.read_signatures(part)) for name, part in parts], rss
    except jsondoc.DocumentError as exc:
        raise CliError(f"heapwalk: {path}: {exc}") from None


def _pairs(a: Snapshot, b: Snapshot):
    """The allocators of A and B to compare, matched by name (the program's allocator with the program's), and
    the lines for those only one snapshot has."""
    named_b = {name: (arenas, sigs) for name, arenas, sigs in b}
    pairs = [(name, (arenas, sigs), named_b[name]) for name, arenas, sigs in a if name in named_b]
    if not pairs:       # no allocator in both (a restart on another allocator): the programs' are compared
        return [(f"{a[0][0]} -> {b[0][0]}", a[0][1:], b[0][1:])], []
    matched = {name for name, _, _ in pairs}
    alone = [f"{name}: in the {which} snapshot only" for which, snap in (("first", a), ("second", b))
             for name, _, _ in snap if name not in matched]
    return pairs, alone


def cmd_diff(args) -> int:
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"heapwalk-diff-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        (a, owners_a), (b, owners_b) = (_snapshot(args, args.a, workdir / "a.json"),
                                        _snapshot(args, args.b, workdir / "b.json"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    pairs, alone = _pairs(a, b)
    diffs = [(name, diff(pa[0], pb[0], pa[1], pb[1])) for name, pa, pb in pairs]
    for i, (name, d) in enumerate(diffs):
        print(("" if i == 0 else "\n") + (f"{name}:\n" if len(diffs) > 1 else "") + diff_text(d, name), end="")
    for line in alone:
        print(line)
    rss = [process_rss(p / "report.json" if p.is_dir() else p) for p in (args.a, args.b)]
    if None not in rss:
        print(f"RSS of the process (capture.json): {rss[0] / (1 << 20):.1f} MiB -> {rss[1] / (1 << 20):.1f} MiB "
              f"({(rss[1] - rss[0]) / (1 << 20):+.1f})")
    owners = rss_change(owners_a, owners_b)
    for line in rss_change_lines(owners):
        print(line)
    document = {**jsondoc.diff_json(diffs[0][1]), "process_rss": None if None in rss else rss,
                "rss_by_owner": None if owners is None else [{"kind": k, "before": x, "after": y}
                                                             for k, x, y in owners]}
    if len(diffs) > 1:
        document["allocators"] = {name: jsondoc.diff_json(d) for name, d in diffs}
    if args.json:
        _write(args.json, json.dumps(document, indent=1) + "\n")
    if args.html:
        _write(args.html, diff_html(document, str(args.a), str(args.b), made_by("heapwalk diff --html")))
        print(f"heapwalk: the differences as a page: {args.html}")
    return 0


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise CliError(f"heapwalk: cannot write {path}: {exc.strerror}") from None
