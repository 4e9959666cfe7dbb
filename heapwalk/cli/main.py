"""The ``heapwalk`` command line: heapwalk's gdb commands without knowing gdb.

It drives gdb through its machine interface (pygdbmi), loads heapwalk into it, and runs the same
commands a gdb user would, so the text and the JSON are the same as inside gdb.

    heapwalk report CORE [EXE]    the report of a core (EXE found from the core when not given)
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
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

from heapwalk.target.corefile import MISSING_ENV, CoreError, CoreFile, file_build_id, format_ranges

__all__ = ["main", "make_parser"]

EXIT_DAMAGED, EXIT_ERROR = 1, 2
_PAGE = 4096


class CliError(Exception):
    """A message for the user and the exit status that goes with it."""

    def __init__(self, message: str, status: int = EXIT_ERROR, output: str = ""):
        super().__init__(message)
        self.status = status
        self.output = output      # what a failed gdb command printed before its error


# ---------------------------------------------------------------------------------------------- gdb


def _mi_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Gdb:
    """One gdb process under pygdbmi, with heapwalk loaded; `run` gives a console command's output."""

    def __init__(self, gdb: str, sysroot: Path | None = None, symbols: bool = True):
        from pygdbmi.gdbcontroller import GdbController

        path = shutil.which(gdb)
        if path is None:
            raise CliError(f"heapwalk: gdb not found ({gdb}): install it (Debian: apt install gdb) or give --gdb PATH")
        self._ctl = GdbController(command=[path, "--nx", "--quiet", "--interpreter=mi3"],
                                  time_to_check_for_additional_output_sec=0.05)
        self.warnings: list[str] = []
        self.keep = None  # whatever must live as long as this gdb (a padded copy of a truncated core)
        for setting in ["set pagination off", "set confirm off", "set width 0", "set height 0",
                        "set print thread-events off"]:
            self.run(setting)
        if not symbols:
            self.run("set debug-file-directory /nonexistent")
        if sysroot is not None:
            self.run(f"set sysroot {sysroot}")
            libdirs = [d for d in (sysroot / "lib" / "x86_64-linux-gnu", sysroot / "usr" / "lib" / "x86_64-linux-gnu",
                                   sysroot / "lib64", sysroot / "lib") if d.is_dir()]
            if libdirs:
                self.run("set solib-search-path " + ":".join(map(str, libdirs)))
                self.run(f"set libthread-db-search-path {libdirs[0]}")
            if (sysroot / "usr" / "lib" / "debug").is_dir() and symbols:
                self.run(f"set debug-file-directory {sysroot / 'usr' / 'lib' / 'debug'}")
        self._load_heapwalk()

    def _load_heapwalk(self) -> None:
        """heapwalk and its dependencies on gdb's sys.path (gdb embeds the system Python, not ours)."""
        import rich

        paths = [str(Path(__file__).resolve().parents[2]), str(Path(rich.__file__).resolve().parent.parent)]
        out = self.run("python import sys; sys.path[:0] = [p for p in %r if p not in sys.path]; "
                       "import heapwalk; heapwalk.load(); print('heapwalk-loaded')" % (paths,))
        if "heapwalk-loaded" not in out:
            raise CliError(f"heapwalk: cannot load heapwalk into gdb's Python: {out.strip()}")

    def run(self, command: str, timeout: float = 3600.0) -> str:
        """COMMAND's console output; CliError with gdb's message when it fails."""
        self._ctl.write(f"-interpreter-exec console {_mi_quote(command)}", read_response=False)
        out: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in self._ctl.get_gdb_response(timeout_sec=0.5, raise_error_on_timeout=False):
                kind, payload = record.get("type"), record.get("payload")
                if kind in ("console", "target", "output") and isinstance(payload, str):
                    out.append(payload)
                elif kind == "log" and isinstance(payload, str):
                    if payload.startswith("warning:"):
                        self.warnings.append(payload.strip())
                elif kind == "result":
                    if record.get("message") == "error":
                        message = (payload or {}).get("msg", "error") if isinstance(payload, dict) else str(payload)
                        raise CliError(message, EXIT_ERROR, "".join(out))
                    return "".join(out)
        raise CliError(f"heapwalk: gdb did not finish '{command}' within {timeout:.0f} s")

    def close(self) -> None:
        try:
            self._ctl.exit()
        except Exception:
            pass
        if self.keep is not None:
            self.keep.cleanup()
            self.keep = None

    def __enter__(self) -> "Gdb":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------- report


def resolve_core(core: Path, exe: Path | None,
                 sysroot: Path | None = None) -> tuple[CoreFile, Path | None, list[str]]:
    """The core, the executable to open it with, and notes for the user; CliError when they cannot go
    together (no such file, not a core, an executable of another build than the core's).  Without EXE the
    program the core names is looked for under SYSROOT first (a copy of the machine the core came from),
    then where the core says it was."""
    if not core.exists():
        raise CliError(f"heapwalk: no such core file: {core}")
    if sysroot is not None and not sysroot.is_dir():
        raise CliError(f"heapwalk: no such sysroot folder: {sysroot}")
    try:
        cf = CoreFile(core)
    except CoreError as exc:
        raise CliError(f"heapwalk: {exc}") from None
    notes = []
    mapped = cf.executable()
    in_core = cf.executable_build_id()
    if exe is None:
        candidates = _executable_candidates(mapped.path, sysroot) if mapped else []
        if not candidates:
            where = f" ({mapped.path}, not on this machine{' nor under ' + str(sysroot) if sysroot else ''})" \
                if mapped else ""
            notes.append(f"the core's executable is not known{where}: give it as EXE for symbols and libraries")
            return cf, None, notes
        matching = [c for c in candidates if not in_core or file_build_id(c) in (None, in_core)]
        exe = (matching or candidates)[0]
        notes.append(f"executable from the core: {exe}")
    if not exe.is_file():
        raise CliError(f"heapwalk: no such executable: {exe}")
    in_file = file_build_id(exe)
    if in_core and in_file and in_core != in_file:
        raise CliError(f"heapwalk: {exe} does not match the core: its build-id is {in_file}, the program in the "
                       f"core was built as {in_core}{f' ({mapped.path})' if mapped else ''}; give the executable "
                       "the process ran")
    return cf, exe, notes


def _executable_candidates(recorded: str, sysroot: Path | None) -> list[Path]:
    """The files that may be the program recorded at path RECORDED: its copy under SYSROOT, then itself."""
    paths = [sysroot / recorded.lstrip("/")] if sysroot is not None else []
    paths.append(Path(recorded))
    return [p for p in paths if p.is_file()]


def _open_core(args, core: Path, exe: Path | None) -> tuple[Gdb, list[str]]:
    cf, exe, notes = resolve_core(core, exe, args.sysroot)
    truncated = cf.truncation()
    cf.close()
    padded = None
    if truncated is not None:
        notes.append(_truncation_note(core, truncated))
        padded = tempfile.TemporaryDirectory(prefix="heapwalk-")
        core = _padded_copy(core, truncated.expected, Path(padded.name))
        os.environ[MISSING_ENV] = format_ranges(truncated.missing)
    else:
        os.environ.pop(MISSING_ENV, None)
    gdb = Gdb(args.gdb, args.sysroot, not args.no_symbols)
    gdb.keep = padded  # the padded copy lives as long as gdb has it open
    try:
        if exe is not None:
            gdb.run(f"file {exe}")
        gdb.run(f"core-file {core}")
    except CliError as exc:
        gdb.close()
        raise CliError(f"heapwalk: gdb cannot open {core}: {exc}") from None
    return gdb, notes


def _truncation_note(core: Path, t) -> str:
    """One paragraph on a truncated core: how much is there and which memory is missing."""
    shown = ", ".join(f"{a:#x}-{b:#x}" for a, b in t.missing[:4]) + (", ..." if len(t.missing) > 4 else "")
    return (f"{core} is truncated: {t.size} of {t.expected} bytes ({100 * t.size // t.expected}%); "
            f"{len(t.missing)} memory region(s), {t.missing_bytes} bytes, are missing ({shown}). The report "
            "covers what the core holds and names what lies in the missing regions as unreadable")


def _padded_copy(core: Path, size: int, directory: Path) -> Path:
    """A sparse copy of CORE padded with a hole to SIZE bytes and without section headers (gdb refuses a
    core whose headers describe more than the file holds, and gcore puts its section headers last; a core
    needs none, as the kernel's have none), which gdb opens."""
    copy = directory / core.name
    result = subprocess.run(["cp", "--sparse=always", str(core), str(copy)], capture_output=True, text=True)
    if result.returncode != 0:
        raise CliError(f"heapwalk: cannot copy {core} to pad it: {result.stderr.strip()}")
    os.truncate(copy, size)
    with open(copy, "r+b") as f:
        f.seek(_E_SHOFF)
        f.write(bytes(8))
        f.seek(_E_SHNUM)
        f.write(bytes(4))  # e_shnum and e_shstrndx
        _restore_lost_notes(f, size)
    return copy


_E_SHOFF, _E_SHNUM = 40, 60   # ELF64 header: section header table offset, and its count and string index
_NT_PRSTATUS, _PRSTATUS_SIZE, _PT_NOTE = 1, 336, 4


def _restore_lost_notes(f, size: int) -> None:
    """gcore writes a core's notes last, so a truncated gcore core has lost them, and gdb takes a core
    without a thread for no core at all: a PT_NOTE whose bytes are gone is pointed at one NT_PRSTATUS with
    no registers, appended at SIZE (the threads' registers, and so their TLS, are unknown)."""
    f.seek(0)
    head = f.read(64)
    phoff, = struct.unpack_from("<Q", head, 32)
    phentsize, phnum = struct.unpack_from("<HH", head, 54)
    note = struct.pack("<III", 5, _PRSTATUS_SIZE, _NT_PRSTATUS) + b"CORE\0\0\0\0" + bytes(_PRSTATUS_SIZE)
    for i in range(phnum):
        f.seek(phoff + i * phentsize)
        p_type, _, p_offset, _, _, p_filesz = struct.unpack("<IIQQQQ", f.read(40))
        f.seek(p_offset)
        if p_type == _PT_NOTE and (p_offset + p_filesz > size or not any(f.read(min(p_filesz, 64)))):
            f.seek(size)
            f.write(note)
            f.seek(phoff + i * phentsize + 8)
            f.write(struct.pack("<Q", size))
            f.seek(phoff + i * phentsize + 32)
            f.write(struct.pack("<QQ", len(note), 0))
            return


def _report_command(json_file: Path | None, xml_file: Path | None) -> str:
    command = "heapwalk report"
    if json_file is not None:
        command += f" --json {json_file}"
    if xml_file is not None:
        command += f" --xml {xml_file}"
    return command


def cmd_report(args) -> int:
    gdb, notes = _open_core(args, args.core, args.exe)
    with gdb:
        for note in notes:
            print(f"heapwalk: {note}", file=sys.stderr)
        print(gdb.run(_report_command(args.json, args.xml)), end="")
        if args.check:
            try:
                print(gdb.run("heapwalk check"), end="")
            except CliError as exc:
                print(exc.output, end="")
                print(str(exc), file=sys.stderr)
                return EXIT_DAMAGED
    return 0


# ---------------------------------------------------------------------------------------------- capture


def _ptrace_advice(pid: int) -> str | None:
    """Why this user cannot attach to PID, and what to do, or None when nothing stands in the way."""
    try:
        st = os.stat(f"/proc/{pid}")
    except FileNotFoundError:
        return f"no process {pid}"
    except PermissionError:
        return f"process {pid} is not visible to this user: run heapwalk as root (sudo)"
    if os.geteuid() == 0:
        return None
    if st.st_uid != os.geteuid():
        return (f"process {pid} belongs to user {st.st_uid}, not to you: run heapwalk as that user or as root "
                "(sudo heapwalk capture ...)")
    try:
        scope = int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        scope = 0
    if scope >= 3:
        return "ptrace is disabled on this machine (kernel.yama.ptrace_scope = 3) until it reboots"
    if scope >= 1:
        return ("kernel.yama.ptrace_scope is %d: only root may attach to a process that is not its child: "
                "run heapwalk as root (sudo), or allow it with 'sudo sysctl kernel.yama.ptrace_scope=0'" % scope)
    return None


def _environment(pid: int) -> dict[str, str]:
    """The MALLOC_* variables and GLIBC_TUNABLES the process started with."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        name, _, value = item.decode(errors="replace").partition("=")
        if name.startswith("MALLOC_") or name == "GLIBC_TUNABLES":
            out[name] = value
    return out


def read_smaps(pid: int) -> list[dict]:
    """Every mapping of PID with its RSS (/proc/PID/smaps): start, end, perms, rss bytes, name."""
    out: list[dict] = []
    try:
        text = Path(f"/proc/{pid}/smaps").read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            start, _, end = head[0].partition("-")
            try:
                out.append({"start": int(start, 16), "end": int(end, 16), "perms": head[1], "rss": 0,
                            "name": head[5].strip() if len(head) > 5 else ""})
            except ValueError:
                continue
        elif line.startswith("Rss:") and out:
            out[-1]["rss"] = int(line.split()[1]) * 1024
    return out


def resident_runs(pid: int, mappings: list[dict]) -> list[list[int]] | None:
    """[start, end) runs of resident pages in PID's writable private mappings (/proc/PID/pagemap's present
    bit), or None when pagemap cannot be read."""
    try:
        f = open(f"/proc/{pid}/pagemap", "rb")
    except OSError:
        return None
    runs: list[list[int]] = []
    with f:
        for m in mappings:
            if "w" not in m["perms"] or "p" not in m["perms"] or m["rss"] == 0:
                continue
            for start in range(m["start"], m["end"], 1 << 30):
                end = min(m["end"], start + (1 << 30))
                try:
                    f.seek(start // _PAGE * 8)
                    entries = array("Q", f.read((end - start) // _PAGE * 8))
                except (OSError, ValueError):
                    return None
                for i, entry in enumerate(entries):
                    if entry >> 63:
                        page = start + i * _PAGE
                        if runs and runs[-1][1] == page:
                            runs[-1][1] = page + _PAGE
                        else:
                            runs.append([page, page + _PAGE])
    return runs


def resident_in(runs: list[list[int]], start: int, end: int) -> int:
    """Bytes of [start, end) inside the resident RUNS."""
    return sum(max(0, min(e, end) - max(s, start)) for s, e in runs if s < end and start < e)


def _arena_rss_lines(doc: dict, runs: list[list[int]] | None) -> str:
    """Each arena's resident bytes beside its free bytes: memory free in the heap and still in RAM."""
    if runs is None or "report" not in doc:
        return "RSS per arena: not available (cannot read /proc/PID/pagemap)\n"
    from heapwalk.analysis.report import human

    rows = {r["address"]: r for r in doc["report"]["arenas"]}
    lines = [f"{'arena':>6} {'heaps':>5} {'system':>10} {'RSS':>10} {'in use':>10} {'free':>10} {'trim':>10}"]
    for a in doc["arenas"]:
        rss = sum(resident_in(runs, h["address"], h["address"] + h["size"]) for h in a["heaps"])
        r = rows.get(a["address"], {})
        free = sum((r.get("free") or {}).values()) + (r.get("top") or 0)
        lines.append(f"{a['number']:>6} {len(a['heaps']):>5} {human(a['system_mem']):>10} {human(rss):>10} "
                     f"{human(r.get('in_use') or 0):>10} {human(free):>10} {human(r.get('trim') or 0):>10}")
    return ("Resident memory per arena (from /proc/PID/pagemap at the capture; free includes top, trim is what "
            "malloc_trim(0) would give back):\n" + "\n".join(lines) + "\n")


def cmd_capture(args) -> int:
    pid = args.pid
    advice = _ptrace_advice(pid)
    if advice:
        raise CliError(f"heapwalk: cannot attach to {pid}: {advice}")
    out_dir = args.out or Path(f"heapwalk-{pid}-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    exe = Path(os.path.realpath(f"/proc/{pid}/exe"))
    record = {"pid": pid, "exe": str(exe), "cmdline": Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
              .decode(errors="replace").strip(), "environment": _environment(pid),
              "threads": len(os.listdir(f"/proc/{pid}/task")), "cpus_online": os.cpu_count()}
    try:
        record["cpus_allowed"] = len(os.sched_getaffinity(pid))
    except OSError:
        record["cpus_allowed"] = None
    json_file = out_dir / "report.json"
    core = out_dir / "core"
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
                text = gdb.run(_report_command(json_file, None))
            else:
                gdb.run(f"generate-core-file {core}", timeout=3600)
        finally:
            gdb.run("detach")
            stopped = time.monotonic() - started
    record.update(stopped_seconds=round(stopped, 3), smaps=smaps, resident_runs=runs,
                  core=None if args.live else str(core), time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    if not args.live:
        gdb, _ = _open_core(args, core, exe)
        with gdb:
            text = gdb.run(_report_command(json_file, None))
    (out_dir / "capture.json").write_text(json.dumps(record, indent=1) + "\n")
    what = "while heapwalk read it live" if args.live else "while gcore wrote the core"
    print(f"heapwalk: process {pid} was stopped for {stopped:.2f} s {what}; it is running again")
    print(f"heapwalk: {record['threads']} threads, {record['cpus_allowed']} of {record['cpus_online']} CPUs allowed; "
          f"malloc settings: {', '.join(f'{k}={v}' for k, v in record['environment'].items()) or 'none'}")
    print(text, end="")
    print(_arena_rss_lines(json.loads(json_file.read_text()), runs), end="")
    print(f"heapwalk: written to {out_dir}: {'' if args.live else 'core, '}report.json, capture.json")
    return 0


# ---------------------------------------------------------------------------------------------- diff


def _snapshot(args, path: Path, out: Path) -> dict:
    """The report JSON of PATH: read as is when it is JSON, computed with gdb (written to OUT) when it is a core."""
    if not path.exists():
        raise CliError(f"heapwalk: no such file: {path}")
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"\x7fELF":
        gdb, _ = _open_core(args, path, None)
        with gdb:
            gdb.run(_report_command(out, None))
        return json.loads(out.read_text())
    try:
        doc = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        raise CliError(f"heapwalk: {path} is neither a core file nor heapwalk JSON") from None
    if "report" not in doc:
        raise CliError(f"heapwalk: {path} has no report: write it with 'heapwalk report --json FILE'")
    return doc


def diff_snapshots(a: dict, b: dict) -> dict:
    """Per arena (matched by address), what grew from A to B: system memory, in-use and free bytes, and the
    free chunks of each size class."""
    rows_a = {r["address"]: r for r in a["report"]["arenas"]}
    rows_b = {r["address"]: r for r in b["report"]["arenas"]}
    hist_a, hist_b = ({r["address"]: d["report"].get("histogram_by_arena", {}).get(str(r["number"]), [])
                       for r in d["report"]["arenas"]} for d in (a, b))
    arenas = []
    for address in list(rows_b) + [x for x in rows_a if x not in rows_b]:
        ra, rb = rows_a.get(address), rows_b.get(address)

        def value(r, key):
            if r is None:
                return 0
            v = r.get(key)
            return sum(v.values()) if isinstance(v, dict) else (v or 0)

        entry = {"address": address, "number": (rb or ra)["number"], "status":
                 "new" if ra is None else "gone" if rb is None else "both"}
        for key in ("system", "in_use", "free", "top"):
            entry[key] = [value(ra, key), value(rb, key)]
            entry[key + "_growth"] = value(rb, key) - value(ra, key)
        classes = {}
        for side, hist in ((0, hist_a.get(address, [])), (1, hist_b.get(address, []))):
            for h in hist:
                c = classes.setdefault((h["low"], h["high"]), [0, 0, 0, 0])
                c[side * 2] += h["count"]
                c[side * 2 + 1] += h["bytes"]
        entry["free_classes"] = [{"low": lo, "high": hi, "count": [c[0], c[2]], "bytes": [c[1], c[3]],
                                  "bytes_growth": c[3] - c[1]} for (lo, hi), c in sorted(classes.items())
                                 if c[3] != c[1] or c[2] != c[0]]
        arenas.append(entry)
    arenas.sort(key=lambda e: -e["system_growth"])
    total = {k: sum(e[k + "_growth"] for e in arenas) for k in ("system", "in_use", "free", "top")}
    return {"arenas": arenas, "growth": total,
            "grew": [e["number"] for e in arenas if e["system_growth"] > 0 or e["in_use_growth"] > 0]}


def diff_text(d: dict) -> str:
    mib = 1 << 20

    def signed(n: int) -> str:
        return f"{n / mib:+.1f}"

    lines = [f"{'arena':>6} {'address':>16} {'system MiB':>16} {'in use MiB':>16} {'free MiB':>16}  status"]
    for e in d["arenas"]:
        lines.append(f"{e['number']:>6} {e['address']:#16x} {signed(e['system_growth']):>16} "
                     f"{signed(e['in_use_growth']):>16} {signed(e['free_growth']):>16}  {e['status']}")
    g = d["growth"]
    lines.append(f"{'total':>6} {'':16} {signed(g['system']):>16} {signed(g['in_use']):>16} {signed(g['free']):>16}")
    for e in d["arenas"]:
        grown = [c for c in e["free_classes"] if c["bytes_growth"] > 0]
        if grown:
            lines.append(f"arena {e['number']}: free chunks grew in " + ", ".join(
                f"{c['low']}-{c['high']} B ({c['count'][0]} -> {c['count'][1]} chunks, "
                f"{c['bytes_growth'] / 1024:+,.0f} KiB)" for c in sorted(grown, key=lambda c: -c["bytes_growth"])[:4]))
    if d["grew"]:
        lines.append("grew: arena " + ", ".join(map(str, d["grew"])) + " (system memory or in-use bytes)")
    else:
        lines.append("no arena grew")
    return "\n".join(lines) + "\n"


def cmd_diff(args) -> int:
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"heapwalk-diff-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        a, b = _snapshot(args, args.a, workdir / "a.json"), _snapshot(args, args.b, workdir / "b.json")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    d = diff_snapshots(a, b)
    print(diff_text(d), end="")
    if args.json:
        args.json.write_text(json.dumps(d, indent=1) + "\n")
    return 0


# ---------------------------------------------------------------------------------------------- main


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="heapwalk", description="glibc heap forensics on a core or a running process, through gdb.",
        epilog="Exit status: 0 done, 1 the heap is damaged (report --check), 2 an error (see the message).")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--gdb", default="gdb", metavar="PATH", help="the gdb to run (default: gdb on PATH)")
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
                   "the paths the core records (DIR/usr/lib/...), or the libraries in DIR/lib/x86_64-linux-gnu")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON (docs/json.md)")
    p.add_argument("--xml", type=Path, metavar="FILE", help="also write what malloc_info(3) would have printed")
    p.add_argument("--check", action="store_true", help="also run 'heapwalk check'; exit 1 when the heap is damaged")
    p.set_defaults(run=cmd_report)

    p = sub.add_parser("capture", parents=[common], help="a core of a running process, and its report",
                       description="Stops process PID as briefly as gcore needs, writes its core and what the core "
                       "cannot hold (RSS per mapping, resident pages, MALLOC_* and GLIBC_TUNABLES, threads, CPUs), "
                       "then prints the report and each arena's resident memory beside its free bytes.")
    p.add_argument("pid", type=int, metavar="PID")
    p.add_argument("--out", type=Path, metavar="DIR", help="where to write (default: heapwalk-PID-DATE-TIME)")
    p.add_argument("--live", action="store_true",
                   help="no core: read the process itself (it stays stopped while the report runs)")
    p.set_defaults(run=cmd_capture, sysroot=None)

    p = sub.add_parser("diff", parents=[common], help="what grew between two snapshots of one process",
                       description="Which arenas and free-chunk size classes grew from A to B; each is a core "
                       "(reported first) or a 'heapwalk report --json' file.")
    p.add_argument("a", type=Path, metavar="A")
    p.add_argument("b", type=Path, metavar="B")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the differences as JSON")
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
