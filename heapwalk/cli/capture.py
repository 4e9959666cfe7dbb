"""``heapwalk capture PID``: a core of a running process (or its report read live) and what /proc says
beside it; the report then knows which pages were resident (from the core, or from capture.json beside
gcore's core)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from heapwalk import registry
from heapwalk.capture import guard, precopy, ptrace
from heapwalk.cli.cores import open_core, report_command
from heapwalk.capture.corewriter import hold_for, write_core
from heapwalk.cli.gdbmi import CliError, Gdb
from heapwalk.analysis.report import human
from heapwalk.capture.proc import environment, namespaces, ptrace_advice, read_smaps, resident_runs, thread_names
from heapwalk.inferior.pages import PagesUnknown
from heapwalk.output import jsondoc


def _residency_note(doc: dict, pages_read: bool) -> str:
    """A line when the report could not say how much of each arena was in RAM (its table says it otherwise):
    the page map was read (PAGES_READ) but the allocator does not yet split it by arena, or it was not read."""
    report = doc.get("report") or {}
    if report.get("residency") or any(a.get("rss") is not None for a in report.get("arenas") or []):
        return ""
    if pages_read:
        name = doc.get("allocator") or "the allocator"
        return f"RSS per arena: not shown for {name}'s arenas yet (docs/{name}.md)\n"
    return "RSS per arena: not available (cannot read /proc/PID/pagemap)\n"


#: what a live report's stop costs, measured on a 2-CPU machine (issue 71): 0.25 s, 25 ms for each shared object
#: gdb reads the symbols of, 3.5 ms for each MiB of private writable memory in RAM the report reads (a service of
#: 3 objects stopped 0.34 s at 15 MiB, 0.63 s at 108 MiB; a Python of 29 objects and 15 MiB, 0.97 s)
LIVE_BASE, LIVE_PER_OBJECT, LIVE_PER_MIB = 0.25, 0.025, 0.0035


def live_pause(smaps: list[dict]) -> tuple[float, int, int]:
    """About how long 'capture --live' keeps a process with the mappings SMAPS stopped (`LIVE_BASE`...): the
    seconds, its shared objects, its bytes of private writable memory in RAM."""
    objects = len({m["name"] for m in smaps if ".so" in m["name"].rsplit("/", 1)[-1]})
    private = sum(m["rss"] for m in smaps if "w" in m["perms"] and "p" in m["perms"])
    return LIVE_BASE + LIVE_PER_OBJECT * objects + LIVE_PER_MIB * private / (1 << 20), objects, private


def _live(args, pid: int, json_file: Path):
    """gdb attached, the live report; (seconds stopped, smaps, resident runs, the report's text)."""
    text = None
    with Gdb(args.gdb, None, not args.no_symbols) as gdb, guard.Guard(pid) as watcher:
        started = time.monotonic()
        try:
            gdb.run(f"attach {pid}", timeout=600)
        except CliError as exc:
            raise CliError(f"heapwalk: cannot attach to {pid}: {exc} (see 'man 2 ptrace'; as root, or with "
                           "kernel.yama.ptrace_scope=0, it works)") from None
        try:
            smaps = read_smaps(pid)
            runs = resident_runs(pid, smaps)
            text = gdb.run(report_command(json_file, None, not args.no_leaks, json_file.with_suffix(".html")))
        finally:
            gdb.run("detach")
            watcher.released()
            stopped = time.monotonic() - started
    return stopped, smaps, runs, text


def _precopied(pid: int, core: Path, stop_the_world: bool):
    """PID's anonymous memory copied while it runs (`precopy.run`, its scratch file beside CORE), or None with
    the line that says why not (none when STOP_THE_WORLD asked for that)."""
    if stop_the_world:
        return None, ""
    try:
        return precopy.run(pid, core.with_name(core.name + ".precopy")), ""
    except precopy.PrecopyUnavailable as exc:
        return None, f"heapwalk: the whole read was done while it was stopped (no copy first while it ran): {exc}\n"


def _stopped_briefly(pid: int, core: Path, facts: dict, whole_files: bool, stop_the_world: bool = False):
    """PID stopped with ptrace while its core is written (`corewriter`, FACTS in its HEAPWALK note,
    WHOLE_FILES: the pages of its files too), its anonymous memory first copied while it runs unless
    STOP_THE_WORLD; (seconds stopped, smaps, resident runs, the core's `CoreSummary`, the pre-copy's record
    or None, a line to print)."""
    copies = None
    try:
        copies, said = _precopied(pid, core, stop_the_world)
        hold = hold_for(pid, whole_files, None if copies is None else copies.expected_at_stop())
        core.unlink(missing_ok=True)         # an old core's blocks given back before the stop, not in it
        started = time.monotonic()
        with ptrace.stop(pid) as stopped:
            # the process's clock at its stop: what its allocator's timers (jemalloc's decay) are measured against
            facts = dict(facts, monotonic_ns=time.clock_gettime_ns(time.CLOCK_MONOTONIC))
            smaps = read_smaps(pid)
            runs = resident_runs(pid, smaps)
            # the RSS of the mappings whose pages the core does not keep: what the process's RSS by owner needs
            facts["mapping_rss"] = [[m["start"], m["end"], m["rss"]] for m in smaps
                                    if not ("w" in m["perms"] and "p" in m["perms"])]
            pending = write_core(stopped, core, facts, hold, whole_files, copies)
        stopped_for = time.monotonic() - started
        written = pending.finish()
        return stopped_for, smaps, runs, written, _precopy_record(copies, pending), said
    except ptrace.PtraceError as exc:
        raise CliError(f"heapwalk: cannot capture {pid}: {exc} (see 'man 2 ptrace'; as root, or with "
                       "kernel.yama.ptrace_scope=0, it works)") from None
    except PagesUnknown as exc:
        raise CliError(f"heapwalk: cannot capture {pid}: {exc}: heapwalk reads a process only where its page map "
                       "says a read allocates nothing in it; run heapwalk as the process's user or as root") from None
    except OSError as exc:
        raise CliError(f"heapwalk: cannot write the core of {pid} to {core}: {exc.strerror}") from None
    finally:
        if copies is not None:
            copies.close()


def _precopy_record(copies, pending) -> dict | None:
    """What the pre-copy did, for capture.json: each round (bytes read, seconds, the stop before it), the bytes
    written since the last clear that the final stop read again, and the bytes the core took from the copies."""
    if copies is None:
        return None
    return {"rounds": [{"read": r.read, "seconds": round(r.seconds, 3), "stopped_before": round(r.stopped, 3)}
                       for r in copies.rounds],
            "written_meanwhile": copies.forgotten, "from_copies": sum(n for _, _, n in pending.deferred)}


def _goes_on(held_before: bool) -> str:
    """What the capture says of the process once it let it go: running again, or stopped as it was found."""
    return "it was stopped before the capture and is left stopped" if held_before else "it is running again"


def _pause_line(pid: int, stopped: float, written, record: dict | None, held_before: bool) -> str:
    """What the capture says of the process's stop: how long, and what it read meanwhile."""
    what = (f"while heapwalk read its memory ({human(written.written)} that is not zeros, written to a sparse core "
            f"of {human(written.size)})")
    if record is not None:
        stops = [r["stopped_before"] for r in record["rounds"] if r["stopped_before"]]
        before = f"; {len(stops)} stop{'s' if len(stops) > 1 else ''} of {sum(stops):.2f} s before" if stops else ""
        what = (f"to read {human(max(written.written - record['from_copies'], 0))}, what it wrote while heapwalk "
                f"copied its memory as it ran ({human(record['from_copies'])} of the core from those copies{before})")
    line = f"heapwalk: process {pid} was stopped for {stopped:.2f} s {what}; {_goes_on(held_before)}\n"
    if record is not None and record["from_copies"] < written.written // 2:
        line += ("heapwalk: the copy made while it ran saved little: it wrote most of its memory again meanwhile "
                 "(--stop-the-world stops it once, for the whole read)\n")
    return line


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
    variables = tuple(v for a in registry.allocators() for v in a.variables)
    settings, unknown = environment(pid, variables)
    return {"pid": pid, "exe": exe, "cmdline": cmdline, "environment": settings, "environment_unknown": unknown,
            "threads": threads, "cpus_online": os.cpu_count(), "thread_names": thread_names(pid)}


def _program(args, pid: int, record: dict) -> Path:
    """The program PID runs, as this machine reaches it: for a process in a container's mount namespace, through
    its root (/proc/PID/root, then the sysroot of the capture's report); its namespaces in RECORD."""
    container = record["container"] = namespaces(pid)
    if container and container["mount"] and args.sysroot is None:
        args.sysroot = Path(container["root"])
        return args.sysroot / record["exe"].lstrip("/")
    return Path(record["exe"])


def _container_line(pid: int, container: dict | None) -> str:
    """What 'heapwalk capture' says of a process in a container: its namespaces, its ids there, and where its
    files were read ("" for a process in this machine's namespaces)."""
    if not container:
        return ""
    own = " and ".join(k for k in ("mount", "pid") if container[k])
    inside = container["threads_inside"]
    ids = ", ".join(f"{tid} is {n}" for tid, n in inside.items() if n is not None)
    files = f"; its files read through {container['root']}" if container["mount"] else ""
    return (f"heapwalk: process {pid} runs in a container ({own} namespaces of its own): pid "
            f"{container['pid_inside']} there; its threads there: {ids}{files}\n")


def malloc_settings(record: dict, doc: dict) -> str:
    """The line that says the process's malloc settings and where they come from: its environment block
    (RECORD), and each allocator's own state in the report's DOC (glibc's mp_, jemalloc's options), which
    holds them however they were set."""
    env = record.get("environment") or {}
    if record.get("environment_unknown"):
        said = f"not known from its environment: {record['environment_unknown']}"
    else:
        said = (", ".join(f"{k}={v}" for k, v in env.items()) or "none") + " (its environment block)"
    allocators = {a.name: a for a in registry.allocators()}
    for name, part in jsondoc.allocator_parts(doc):
        allocator = allocators.get(name)
        state = allocator.settings_in(part) if allocator is not None else ""
        if state:
            said += f"; {state}"
    return f"heapwalk: malloc settings: {said}"


def _out_folder(args, pid: int) -> Path:
    """The capture's folder (--out, or one named after PID and the time), made now."""
    out_dir = args.out or Path(f"heapwalk-{pid}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"heapwalk: cannot create the folder {out_dir} for the capture: {exc.strerror}; give --out a "
                       "folder you may write to") from None
    return out_dir


def cmd_capture(args) -> int:
    pid = args.pid
    advice = ptrace_advice(pid)
    if advice:
        raise CliError(f"heapwalk: cannot attach to {pid}: {advice}")
    out_dir = _out_folder(args, pid)
    record = _process_record(pid)
    record["stopped_before_capture"] = guard.stop_held(pid)
    exe = _program(args, pid, record)
    try:
        record["cpus_allowed"] = len(os.sched_getaffinity(pid))
    except OSError:
        record["cpus_allowed"] = None
    json_file = out_dir / "report.json"
    core = out_dir / "core"
    written, precopied, said = None, None, ""
    if args.live:
        estimate, objects, private = live_pause(read_smaps(pid))
        record["live_estimate_seconds"] = round(estimate, 2)
        print(f"heapwalk: --live keeps process {pid} stopped while gdb attaches and the whole report runs: about "
              f"{estimate:.1f} s for its {objects} shared objects and {human(private)} of private memory "
              "('heapwalk capture PID' without --live stops it for a fraction of that)", flush=True)
        stopped, smaps, runs, text = _live(args, pid, json_file)
    else:
        stopped, smaps, runs, written, precopied, said = _stopped_briefly(pid, core, {
            "cpus_online": record["cpus_online"], "cpus_allowed": record["cpus_allowed"],
            "thread_names": record["thread_names"]}, args.full, args.stop_the_world)
        record["precopy"] = precopied
    stopped = round(stopped, 3)       # the figure said and the one recorded are the same
    record.update(stopped_seconds=stopped, smaps=smaps, resident_runs=runs,
                  core=None if args.live else str(core), time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  core_writer=None if args.live else "heapwalk")
    if written is not None:
        record.update(core_size=written.size, core_bytes_written=written.written, not_read=[
            {"start": lo, "end": hi, "why": why} for lo, hi, why in written.not_read])
    (out_dir / "capture.json").write_text(json.dumps(record, indent=1) + "\n")
    if not args.live:
        gdb, _ = open_core(args, core, exe)
        with gdb:
            text = gdb.run(report_command(json_file, None, not args.no_leaks, json_file.with_suffix(".html")))
    if args.live:
        print(f"heapwalk: process {pid} was stopped for {stopped:.2f} s while heapwalk read it live; "
              f"{_goes_on(record['stopped_before_capture'])}")
    else:
        print(_pause_line(pid, stopped, written, precopied, record["stopped_before_capture"]), end="")
        print(said, end="")
    if written is not None and written.not_read:
        print(f"heapwalk: not read, so not in the core: {human(written.not_read_bytes)} of mappings no read may touch "
              "without allocating or mapping a page in the process (untouched shared memory, devices); "
              "capture.json lists them")
    print(_container_line(pid, record["container"]), end="")
    doc = json.loads(json_file.read_text())
    print(f"heapwalk: {record['threads']} threads, {record['cpus_allowed']} of {record['cpus_online']} CPUs allowed")
    print(malloc_settings(record, doc))
    print(text, end="")
    print(_residency_note(doc, bool(runs)), end="")
    print(f"heapwalk: written to {out_dir}: {'' if args.live else 'core, '}report.json, report.html, capture.json")
    return 0
