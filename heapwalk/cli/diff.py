"""``heapwalk diff A B``: which arenas grew between two snapshots, and in them which size classes of free
pieces and of chunks in use, and which signatures of chunks in use; each snapshot a core (reported first), a
report's JSON or a capture's folder; with their RSS where the snapshots recorded it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from heapwalk.analysis.diff import ArenaTotals, Signatures, diff
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


def _snapshot(args, path: Path, out: Path) -> tuple[list[ArenaTotals], Signatures | None]:
    """The arenas of PATH's report and its chunks in use by signature: read as is when it is JSON, computed
    with gdb (written to OUT) when it is a core; a capture's folder stands for its report.json."""
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
        return jsondoc.read_snapshot(doc), jsondoc.read_signatures(doc)
    except jsondoc.DocumentError as exc:
        raise CliError(f"heapwalk: {path}: {exc}") from None


def cmd_diff(args) -> int:
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"heapwalk-diff-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        a, b = _snapshot(args, args.a, workdir / "a.json"), _snapshot(args, args.b, workdir / "b.json")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    d = diff(a[0], b[0], a[1], b[1])
    print(diff_text(d), end="")
    rss = [process_rss(p / "report.json" if p.is_dir() else p) for p in (args.a, args.b)]
    if None not in rss:
        print(f"RSS of the process (capture.json): {rss[0] / (1 << 20):.1f} MiB -> {rss[1] / (1 << 20):.1f} MiB "
              f"({(rss[1] - rss[0]) / (1 << 20):+.1f})")
    document = {**jsondoc.diff_json(d), "process_rss": None if None in rss else rss}
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
