"""``heapwalk diff A B``: which arenas grew between two snapshots, and in them which size classes of free
pieces and of chunks in use, and which signatures of chunks in use; each snapshot a core (reported first), a
report's JSON or a capture's folder; with their RSS where the snapshots recorded it.  An allocator only one
snapshot has is compared with the other's allocator only it has (a restart on another allocator) as totals,
each in its own figures."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import List, Optional, Tuple

from heapwalk.analysis.diff import ArenaTotals, Signatures, across, diff
from heapwalk.analysis.rss import rss_change
from heapwalk.output.rsstext import rss_change_lines
from heapwalk.cli.cores import open_core, report_command
from heapwalk.cli.gdbmi import CliError
from heapwalk.output import jsondoc
from heapwalk.output.difftext import across_text, diff_text
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


#: each allocator of a snapshot: its name, its arenas, its blocks in use by signature (or None), its words
Snapshot = List[Tuple[str, List[ArenaTotals], Optional[Signatures], dict]]


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
        return [(name, jsondoc.read_snapshot(part), jsondoc.read_signatures(part), jsondoc.read_words(part, name))
                for name, part in parts], rss
    except jsondoc.DocumentError as exc:
        raise CliError(f"heapwalk: {path}: {exc}") from None


def _pairs(a: Snapshot, b: Snapshot):
    """The allocators of A and B to compare, matched by name (the program's allocator with the program's); the
    two allocators only one snapshot has each, the first of each (a restart on another allocator: compared as
    totals), or None; and the lines for the others only one snapshot has."""
    named_b = {part[0]: part for part in b}
    pairs = [(part[0], part, named_b[part[0]]) for part in a if part[0] in named_b]
    matched = {name for name, _, _ in pairs}
    left = [[part for part in snap if part[0] not in matched] for snap in (a, b)]
    other = (left[0].pop(0), left[1].pop(0)) if left[0] and left[1] else None
    alone = [f"{part[0]}: in the {which} snapshot only" for which, parts in zip(("first", "second"), left)
             for part in parts]
    return pairs, other, alone


def cmd_diff(args) -> int:
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"heapwalk-diff-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        (a, owners_a), (b, owners_b) = (_snapshot(args, args.a, workdir / "a.json"),
                                        _snapshot(args, args.b, workdir / "b.json"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    pairs, other, alone = _pairs(a, b)
    diffs = [(name, diff(pa[1], pb[1], pa[2], pb[2]), pa[3]) for name, pa, pb in pairs]
    changed = across(other[0][1], other[1][1], other[0][3], other[1][3]) if other else None
    if changed is not None:
        print(across_text(changed), end="")
    for i, (name, d, said) in enumerate(diffs):
        print(("" if i == 0 and changed is None else "\n") + (f"{name}:\n" if len(diffs) > 1 or changed else "")
              + diff_text(d, said), end="")
    for line in alone:
        print(line)
    rss = [process_rss(p / "report.json" if p.is_dir() else p) for p in (args.a, args.b)]
    if None not in rss:
        print(f"RSS of the process (capture.json): {rss[0] / (1 << 20):.1f} MiB -> {rss[1] / (1 << 20):.1f} MiB "
              f"({(rss[1] - rss[0]) / (1 << 20):+.1f})")
    owners = rss_change(owners_a, owners_b)
    for line in rss_change_lines(owners):
        print(line)
    words = {name: pa[3] for name, pa, _ in pairs}
    first = ({**jsondoc.diff_json(diffs[0][1]), "words": words[diffs[0][0]]} if diffs
             else jsondoc.across_json(changed))
    document = {**first, "process_rss": None if None in rss else rss,
                "rss_by_owner": None if owners is None else [{"kind": k, "before": x, "after": y}
                                                             for k, x, y in owners]}
    if changed is not None:
        document["across"] = jsondoc.across_json(changed)["across"]
    if len(diffs) > 1 or (diffs and changed is not None):
        document["allocators"] = {name: {**jsondoc.diff_json(d), "words": words[name]} for name, d, _ in diffs}
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
