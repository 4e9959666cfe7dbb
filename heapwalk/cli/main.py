"""The ``heapwalk`` command line: heapwalk's gdb commands without knowing gdb.

It drives gdb through its machine interface (pygdbmi), loads heapwalk into it, and runs the same
commands a gdb user would, so the text and the JSON are the same as inside gdb.

    heapwalk report CORE [EXE]    the report of a core (EXE found from the core when not given); --html a page
    heapwalk capture PID          a core of a running process, what the core cannot hold, and the report
    heapwalk capture PID --live   the report of the running process itself, no core
    heapwalk diff A B             which arenas and size classes grew between two snapshots

Exit status: 0 done; 1 the heap is damaged (``heapwalk check`` errors, with --check); 2 usage or
environment errors (gdb missing, no such file, core and executable differ, process not accessible).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from heapwalk import registry
from heapwalk.arch import DEFAULT
from heapwalk.cli.capture import cmd_capture
from heapwalk.cli.cores import open_core, report_command
from heapwalk.cli.diff import cmd_diff
from heapwalk.cli.gdbmi import EXIT_DAMAGED, EXIT_ERROR, EXIT_PARTIAL, CliError
from heapwalk.common.errors import PARTIAL, UNCHECKED
from heapwalk.output import jsondoc
from heapwalk.output.options import add_memory_check, add_no_leaks, add_report_files, cost_epilog

__all__ = ["main", "make_parser"]


def cmd_report(args) -> int:
    gdb, notes = open_core(args, args.core, args.exe)
    status = 0
    with gdb:
        for note in notes:
            print(f"heapwalk: {note}", file=sys.stderr)
        try:
            print(gdb.run(report_command(args.json, args.xml, not args.no_leaks, args.html)), end="")
        except CliError as exc:
            if PARTIAL not in str(exc):
                raise
            print(exc.output, end="")
            print(str(exc), file=sys.stderr)
            status = EXIT_PARTIAL
        if args.check:
            checked = args.json.with_name(args.json.name + ".check") if args.json else None
            try:
                print(gdb.run("heapwalk check" + (f" --json {checked}" if checked else "")), end="")
            except CliError as exc:
                print(exc.output, end="")
                print(str(exc), file=sys.stderr)
                status = EXIT_DAMAGED if UNCHECKED not in str(exc) else EXIT_PARTIAL
            finally:
                if checked is not None:
                    _with_check(args.json, checked)
    return status


def _with_check(report: Path, checked: Path) -> None:
    """The report's JSON (REPORT) with what 'heapwalk check' found (its JSON at CHECKED, then removed): every
    finding that sets the exit status is in the one file, under "findings", and the check's verdict under
    "check"."""
    try:
        doc, check = json.loads(report.read_text()), json.loads(checked.read_text())
    except (OSError, ValueError):
        return
    finally:
        checked.unlink(missing_ok=True)
    seen = {(f.get("kind"), f.get("address"), f.get("message")) for f in doc.get("findings") or []}
    doc["findings"] = (doc.get("findings") or []) + [f for f in check.get("findings") or []
                                                     if (f.get("kind"), f.get("address"), f.get("message")) not in seen]
    doc["check"] = {k: v for k, v in check.items() if k in ("clean", "partial", "checked", "scope")}
    jsondoc.dump(doc, str(report))





def _capture_parser(sub, common) -> None:
    """`heapwalk capture`'s arguments."""
    p = sub.add_parser("capture", parents=[common], help="a core of a running process, and its report",
                       description="Reads the memory of process PID that holds anything (resident or swapped-out "
                       "pages, and the pages of its files it wrote): its heaps first while it runs, then stopped only "
                       "to read again what it wrote meanwhile (where the kernel tracks the pages a process writes; "
                       "else stopped for the whole read), and what a core cannot hold (RSS per mapping, resident "
                       "pages, the allocators' variables, threads, CPUs), lets it go on, "
                       "writes a sparse core gdb opens, then prints the report and each arena's resident memory "
                       "beside its free bytes. The folder gets the core, report.json, report.html (the report as a "
                       "page, resident pages on its heap maps) and capture.json.")
    p.add_argument("pid", type=int, metavar="PID")
    p.add_argument("--out", type=Path, metavar="DIR", help="where to write (default: heapwalk-PID-DATE-TIME)")
    p.add_argument("--live", action="store_true",
                   help="no core: read the process itself (it stays stopped while gdb attaches and the report "
                   "runs: about how long is said before it starts)")
    p.add_argument("--full", action="store_true",
                   help="also keep the pages of the files the process maps (code, read-only data), read from the "
                   "files, so the core opens on a machine without them: a bigger file, a little longer pause")
    p.add_argument("--stop-the-world", action="store_true",
                   help="stop the process for the whole read, rather than copy its memory first while it runs and "
                   "stop it only to read again what it wrote meanwhile (that needs the kernel's soft-dirty bits, "
                   "which it clears, and makes the process take a minor fault on its next write to each page)")
    add_no_leaks(p)
    p.set_defaults(run=cmd_capture, sysroot=None)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="heapwalk",
        description=f"Heap forensics ({', '.join(a.title for a in registry.allocators())}) on a core or a running "
                    "process, through gdb.",
        epilog="Exit status: 0 done, 1 the heap is damaged (report --check), 2 an error (see the message), 3 the "
               "report is partial: an allocator in the process is not decoded (the message names it and why).")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--gdb", default="gdb", metavar="PATH",
                        help="the gdb to run (default: gdb on PATH; for a core of another architecture than this "
                        "machine's, gdb-multiarch where it is installed)")
    common.add_argument("--no-symbols", action="store_true",
                        help="ignore libc's debug symbols (as on a machine without libc6-dbg)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("report", parents=[common], help="the report of a core file",
                       description="The report of 'heapwalk report' in gdb, for a core file.")
    p.add_argument("core", type=Path, metavar="CORE")
    p.add_argument("exe", type=Path, nargs="?", metavar="EXE",
                   help="the program the core is from (default: the one the core names, when it is here)")
    p.add_argument("--sysroot", type=Path, metavar="DIR",
                   help="a copy of the files of the machine the core is from: the program and libraries under "
                   f"the paths the core records (DIR/usr/lib/...), or the libraries in DIR/lib/{DEFAULT.multiarch}")
    add_report_files(p, registry.xml_help(), Path)
    p.add_argument("--check", action="store_true", help="also run 'heapwalk check'; exit 1 when the heap is damaged")
    p.add_argument("--resident-from", type=Path, metavar="CAPTURE_JSON",
                   help="which pages were resident, from the capture.json of a capture taken with this core (a "
                   "gcore core does not record them)")
    add_no_leaks(p)
    add_memory_check(p)
    p.epilog = cost_epilog()
    p.set_defaults(run=cmd_report)

    _capture_parser(sub, common)

    p = sub.add_parser("diff", parents=[common], help="what grew between two snapshots of one process",
                       description="Which arenas grew from A to B, and in them which size classes of free "
                       "chunks and of chunks in use, and which signatures of chunks in use; each is a core "
                       "(reported first), a 'heapwalk report --json' file or a 'heapwalk capture' folder. The "
                       "arenas' RSS is compared when both snapshots recorded it (captures do), and the process's "
                       "RSS when both are captures. Across a restart arenas are matched by the names of the "
                       "threads that use them (the main arena to the main arena) and the others compared "
                       "together; snapshots of two allocators (a restart on another) are compared as totals, "
                       "each in its own figures.")
    p.add_argument("a", type=Path, metavar="A")
    p.add_argument("b", type=Path, metavar="B")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the differences as JSON")
    p.add_argument("--html", type=Path, metavar="FILE", help="also write the differences as one self-contained "
                   "HTML page (charts inline)")
    p.set_defaults(run=cmd_diff, sysroot=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return args.run(args)
    except CliError as exc:
        print(exc if str(exc).startswith("heapwalk") else f"heapwalk: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print("heapwalk: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: one line, and how to see more
        if os.environ.get("HEAPWALK_DEBUG"):
            raise
        print(f"heapwalk: internal error: {type(exc).__name__}: {exc} (HEAPWALK_DEBUG=1 shows a traceback)",
              file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
