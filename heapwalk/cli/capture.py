"""``heapwalk capture PID``: a core of a running process (or its report read live), what /proc says beside
it, and each arena's resident memory beside its free bytes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from heapwalk.cli import ptrace
from heapwalk.cli.cores import open_core, report_command
from heapwalk.cli.corewriter import write_core
from heapwalk.cli.gdbmi import CliError, Gdb
from heapwalk.output import jsondoc
from heapwalk.analysis.report import human
from heapwalk.cli.proc import environment, ptrace_advice, read_smaps, resident_in, resident_runs


def _arena_rss_lines(doc: dict, runs: list[list[int]] | None) -> str:
    """Each arena's resident bytes beside its free bytes: memory free in the heap and still in RAM."""
    if doc.get("allocator") == "jemalloc":
        note = "RSS per arena: not shown for jemalloc's arenas yet (docs/jemalloc.md)\n"
        return note if "glibc_malloc" not in doc else note + "glibc's malloc, beside jemalloc: " + \
            _arena_rss_lines(doc["glibc_malloc"], runs)
    try:
        arenas = jsondoc.read_snapshot(doc)
    except jsondoc.DocumentError:
        arenas = None
    if runs is None or arenas is None:
        return "RSS per arena: not available (cannot read /proc/PID/pagemap)\n"
    lines = [f"{'arena':>6} {'heaps':>5} {'system':>10} {'RSS':>10} {'in use':>10} {'free':>10} {'trim':>10}"]
    for a in arenas:
        rss = sum(resident_in(runs, start, start + size) for start, size in a.heaps)
        lines.append(f"{a.number:>6} {len(a.heaps):>5} {human(a.system):>10} {human(rss):>10} "
                     f"{human(a.in_use):>10} {human(a.free + a.top):>10} {human(a.reclaim):>10}")
    return ("Resident memory per arena (from /proc/PID/pagemap at the capture; free includes top, trim is what "
            "malloc_trim(0) would give back):\n" + "\n".join(lines) + "\n")


def _through_gdb(args, pid: int, core: Path, json_file: Path):
    """gdb attached: the live report, or gcore's whole core; (seconds stopped, smaps, resident runs, the
    report's text or None)."""
    text = None
    with Gdb(args.gdb, None, not args.no_symbols) as gdb:
        started = time.monotonic()
        try:
            gdb.run(f"attach {pid}", timeout=600)
        except CliError as exc:
            raise CliError(f"heapwalk: cannot attach to {pid}: {exc} (see 'man 2 ptrace'; as root, or with "
                           "kernel.yama.ptrace_scope=0, it works)") from None
        try:
            smaps = read_smaps(pid)
            runs = resident_runs(pid, smaps)
            if args.live:
                text = gdb.run(report_command(json_file, None))
            else:
                gdb.run(f"generate-core-file {core}", timeout=3600)
        finally:
            gdb.run("detach")
            stopped = time.monotonic() - started
    return stopped, smaps, runs, text


def _stopped_briefly(pid: int, core: Path, facts: dict):
    """PID stopped with ptrace while its core is written (`corewriter`, FACTS in its HEAPWALK note);
    (seconds stopped, smaps, resident runs, the core's `CoreSummary`)."""
    try:
        started = time.monotonic()
        with ptrace.stop(pid) as stopped:
            smaps = read_smaps(pid)
            runs = resident_runs(pid, smaps)
            written = write_core(stopped, core, facts)
        return time.monotonic() - started, smaps, runs, written
    except ptrace.PtraceError as exc:
        raise CliError(f"heapwalk: cannot capture {pid}: {exc} (see 'man 2 ptrace'; as root, or with "
                       "kernel.yama.ptrace_scope=0, it works)") from None
    except OSError as exc:
        raise CliError(f"heapwalk: cannot write the core of {pid} to {core}: {exc.strerror}") from None


def _process_record(pid: int) -> dict:
    """What /proc says of PID that the capture records: its program, command line, MALLOC_* settings and
    threads; CliError when /proc does not let this user read them."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        raise CliError(f"heapwalk: no process {pid}") from None
    except OSError as exc:
        raise CliError(f"heapwalk: cannot read /proc/{pid} ({exc.strerror}): run heapwalk as the process's user "
                       "or as root") from None
    return {"pid": pid, "exe": exe, "cmdline": cmdline, "environment": environment(pid), "threads": threads,
            "cpus_online": os.cpu_count()}


def cmd_capture(args) -> int:
    pid = args.pid
    advice = ptrace_advice(pid)
    if advice:
        raise CliError(f"heapwalk: cannot attach to {pid}: {advice}")
    out_dir = args.out or Path(f"heapwalk-{pid}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"heapwalk: cannot create the folder {out_dir} for the capture: {exc.strerror}; give --out a "
                       "folder you may write to") from None
    record = _process_record(pid)
    exe = Path(record["exe"])
    try:
        record["cpus_allowed"] = len(os.sched_getaffinity(pid))
    except OSError:
        record["cpus_allowed"] = None
    json_file = out_dir / "report.json"
    core = out_dir / "core"
    written = None
    if args.live or args.full:
        stopped, smaps, runs, text = _through_gdb(args, pid, core, json_file)
    else:
        stopped, smaps, runs, written = _stopped_briefly(pid, core, {
            "cpus_online": record["cpus_online"], "cpus_allowed": record["cpus_allowed"]})
    record.update(stopped_seconds=round(stopped, 3), smaps=smaps, resident_runs=runs,
                  core=None if args.live else str(core), time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  core_writer="gcore" if args.full else None if args.live else "heapwalk")
    if written is not None:
        record.update(core_size=written.size, core_bytes_written=written.written)
    if not args.live:
        gdb, _ = open_core(args, core, exe)
        with gdb:
            text = gdb.run(report_command(json_file, None))
    (out_dir / "capture.json").write_text(json.dumps(record, indent=1) + "\n")
    what = "while heapwalk read it live" if args.live else "while gcore wrote the core" if args.full else \
        (f"while heapwalk read its memory ({human(written.written)} that is not zeros, written to a sparse core "
         f"of {human(written.size)})")
    print(f"heapwalk: process {pid} was stopped for {stopped:.2f} s {what}; it is running again")
    print(f"heapwalk: {record['threads']} threads, {record['cpus_allowed']} of {record['cpus_online']} CPUs allowed; "
          f"malloc settings: {', '.join(f'{k}={v}' for k, v in record['environment'].items()) or 'none'}")
    print(text, end="")
    print(_arena_rss_lines(json.loads(json_file.read_text()), runs), end="")
    print(f"heapwalk: written to {out_dir}: {'' if args.live else 'core, '}report.json, capture.json")
    return 0
