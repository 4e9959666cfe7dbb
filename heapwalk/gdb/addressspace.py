"""The target's address space and kind as gdb shows them: core or process (on every gdb from 10 on), its
mappings, the ranges a core does not hold, which pages were resident, the CPU counts: with
`heapwalk.gdb.adapter`, the gdb side of `heapwalk.inferior`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
import time
from pathlib import Path

import gdb  # type: ignore[import-not-found]

from heapwalk.inferior.corefile import CoreError, CoreFile, parse_ranges
from heapwalk.inferior.elf import Mapping
from heapwalk.inferior.ranges import ranges_without
from heapwalk.inferior.mitext import console_text
from heapwalk.inferior.pages import LivePages
from heapwalk.inferior.residency import Pagemap, Residency, in_core, load_runs, of_core
from heapwalk.inferior.space import MemoryMap

__all__ = ["has_target", "connection_type", "cpu_counts", "clock_ns", "residency", "core_path", "describe_target",
           "memory_map", "page_size", "missing_ranges", "core_holes", "core_not_read", "mappings", "MemoryMap", "command_text"]

_MAPPING_LINE = re.compile(r"^\s*(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+0x[0-9a-f]+\s+(0x[0-9a-f]+)"
                           r"(?:\s+[r-][w-][x-][ps])?(?:\s+(.*?))?\s*$")


def has_target() -> bool:
    """Is there a process or core to look at?"""
    inferior = gdb.selected_inferior()
    return inferior is not None and inferior.pid != 0 and bool(inferior.threads())


def command_text(command: str) -> str:
    """What gdb's COMMAND prints, as the console shows it (under MI too: `mitext.console_text`)."""
    return console_text(gdb.execute(command, to_string=True))


def connection_type() -> str | None:
    """'core', 'native' (a process on this machine), 'remote'... for the selected inferior: from its
    connection (gdb 12 and later), else from what 'info target' says (gdb 10 and 11); None when there is no
    target."""
    connection = getattr(gdb.selected_inferior(), "connection", _NO_ATTRIBUTE)
    if connection is not _NO_ATTRIBUTE:
        return getattr(connection, "type", None)
    if not has_target():
        return None
    try:
        info = command_text("info target")
    except gdb.error:
        return None
    if "core dump file" in info:
        return "core"
    if re.search(r"[Rr]emote (serial target|target) ", info) or "extended-remote" in info:
        return "remote"
    return "native"


_NO_ATTRIBUTE = object()


@contextlib.contextmanager
def _open_core():
    """The core file gdb has open, as a `CoreFile` (None when there is none or it cannot be read)."""
    path = core_path() if connection_type() == "core" else None
    try:
        core = CoreFile(path) if path is not None else None
    except CoreError:
        core = None
    try:
        yield core
    finally:
        if core is not None:
            core.close()


def core_machine() -> int | None:
    """The ELF machine of the core gdb has open (None when there is none or it cannot be read)."""
    with _open_core() as core:
        return core.machine if core is not None else None


def cpu_counts() -> tuple[int, int] | None:
    """The CPUs online and the CPUs the process may run on (glibc's arena limit is 8 per CPU), when known: a
    live process's from this machine, a core's from the note `heapwalk capture` writes; None otherwise."""
    if connection_type() == "core":
        with _open_core() as core:
            facts = core.capture_facts() if core is not None else {}
        online, allowed = facts.get("cpus_online"), facts.get("cpus_allowed")
        return (online, allowed or online) if isinstance(online, int) and online > 0 else None
    try:
        return os.cpu_count() or 1, len(os.sched_getaffinity(gdb.selected_inferior().pid))
    except (OSError, ValueError):
        return None


def clock_ns() -> int | None:
    """CLOCK_MONOTONIC at the snapshot, in nanoseconds (the clock allocators time their decay with): a live
    process's now (it is stopped while heapwalk reads it), a core's from the note `heapwalk capture` writes;
    None for other cores."""
    if connection_type() == "core":
        with _open_core() as core:
            value = (core.capture_facts() if core is not None else {}).get("monotonic_ns")
        return value if isinstance(value, int) and value > 0 else None
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


#: the auxiliary vector's entry for the page size
_AT_PAGESZ = 6


def page_size(default: int) -> int:
    """The target's page: AT_PAGESZ of its auxiliary vector (a core's NT_AUXV, a live process's
    /proc/PID/auxv), DEFAULT (its architecture's usual page) where neither says."""
    vector: dict[int, int] = {}
    if connection_type() == "core":
        with _open_core() as core:
            vector = core.auxv() if core is not None else {}
    else:
        with contextlib.suppress(OSError, gdb.error, AttributeError):
            raw = Path(f"/proc/{gdb.selected_inferior().pid}/auxv").read_bytes()
            vector = {k: v for k, v in struct.iter_unpack("<QQ", raw[:len(raw) // 16 * 16])}
    value = vector.get(_AT_PAGESZ)
    return value if isinstance(value, int) and 4096 <= value <= 1 << 20 and value & (value - 1) == 0 else default


def thread_names() -> dict[int, str]:
    """A core's thread names, LWP -> name: from the note `heapwalk capture` writes in its core, or from the
    capture.json beside gcore's core ('set heapwalk resident-from'); {} otherwise (a live process's gdb knows
    them)."""
    if connection_type() != "core":
        return {}
    with _open_core() as core:
        names = (core.capture_facts() if core is not None else {}).get("thread_names")
    recorded = _setting("heapwalk resident-from")
    if not isinstance(names, dict) and recorded:
        try:
            names = json.loads(Path(recorded).read_text()).get("thread_names")
        except (OSError, ValueError, AttributeError):
            names = None
    if not isinstance(names, dict):
        return {}
    return {int(lwp): str(name) for lwp, name in names.items() if str(lwp).isdigit()}


def residency() -> Residency | None:
    """Which pages were resident, where that is known: a process on this machine's from its page map, a
    core's from what `heapwalk capture` recorded (in the core, or beside gcore's core); None otherwise."""
    kind = connection_type()
    if kind == "core":
        with _open_core() as core:
            found = of_core(core) if core is not None else None
        recorded = _setting("heapwalk resident-from")
        return found if found is not None or not recorded else load_runs(recorded)
    if kind != "native":
        return None
    pid = gdb.selected_inferior().pid
    try:
        with open(f"/proc/{pid}/pagemap", "rb", buffering=0) as f:
            os.pread(f.fileno(), 8, 0)
    except OSError:
        return None
    return Pagemap(pid)


def core_contents(seen=None) -> Residency | None:
    """What the core gdb has open holds of each address (`residency.in_core`: for a core that does not say which
    pages were resident; SEEN: the pages a walk already judged); None for a process."""
    if connection_type() != "core":
        return None
    with _open_core() as core:
        return in_core(core, seen) if core is not None else None


def core_path() -> str | None:
    """The core file gdb has open, or None."""
    try:
        info = command_text("info target")
    except gdb.error:
        return None
    m = re.search(r"Local core dump file:\s*\n?\s*`(.+)', file type", info) or \
        re.search(r"Local core dump file:\s*\n?\s*`([^']+)'", info)    # a path may hold a quote
    return m.group(1) if m else None


def describe_target() -> str:
    """'core file /x/core of /x/exe' or 'process 1234 (/x/exe)'."""
    inferior = gdb.selected_inferior()
    exe = gdb.current_progspace().filename or "?"
    if connection_type() == "core":
        return f"core file {core_path() or '?'} of {exe}"
    return f"process {inferior.pid} ({exe})"


_SECTION = re.compile(r"^\s*(0x[0-9a-f]+) - (0x[0-9a-f]+) is (\S+)", re.M)


def memory_map() -> MemoryMap:
    """The selected inferior's MemoryMap, less the ranges whose bytes a core does not hold (`core_holes`):
    what a truncated core lacks, what a capture did not read, and the zero-filled pages of files gdb has not."""
    space = _memory_map()
    missing = core_holes() if space.core else []
    if not missing:
        return space
    return MemoryMap(space.mappings, ranges_without(space.regions, missing),
                     None if space.readable is None else ranges_without(space.readable, missing), True,
                     None if space.writable is None else ranges_without(space.writable, missing))


def missing_ranges() -> list[tuple[int, int]]:
    """The address ranges the core lacks, as the command line found them when it padded a truncated core
    for gdb (whose padding would otherwise read as zeros): 'set heapwalk core-missing'."""
    return parse_ranges(_setting("heapwalk core-missing"))


def _setting(name: str) -> str:
    """The value of heapwalk's gdb setting NAME ('' when unset, or not registered in this gdb)."""
    try:
        return gdb.parameter(name) or ""
    except (gdb.error, RuntimeError):
        return ""


def core_holes() -> list[tuple[int, int]]:
    """Every range of the core gdb has open whose bytes it does not hold, though gdb may read zeros there:
    `missing_ranges`, and `CoreFile.holes` with the files gdb can read."""
    with _open_core() as core:
        holes = core.holes(_gdb_reads_file) if core is not None else []
    return sorted(missing_ranges() + holes)


def core_not_read() -> tuple[tuple[int, int, str], ...]:
    """The (start, end, why) runs a capture's core says it did not read (none for any other target)."""
    if connection_type() != "core":
        return ()
    with _open_core() as core:
        runs = core.capture_facts().get("not_read", ()) if core is not None else ()
    return tuple((a, b, str(why)) for a, b, why in (r for r in runs if isinstance(r, list) and len(r) == 3)
                 if isinstance(a, int) and isinstance(b, int))


def _gdb_reads_file(mapping, address: int) -> bool:
    """Does gdb give the bytes of the file MAPPING (a core's NT_FILE entry) maps, at ADDRESS, a page the core
    holds no bytes of?  Where the file is at its path under gdb's sysroot, gdb reads it; elsewhere it may read
    a copy of it that it loaded as a library (gdb 10 does) or give zeros (gdb 13 does): the bytes gdb gives are
    compared with that copy's."""
    try:
        sysroot = gdb.parameter("sysroot") or ""
    except (gdb.error, RuntimeError):
        sysroot = ""
    if sysroot.startswith("target:"):
        sysroot = sysroot[len("target:"):]
    if os.path.isfile(os.path.join(sysroot, mapping.path.lstrip("/")) if sysroot else mapping.path):
        return True
    name = os.path.basename(mapping.path)
    copy = next((o.filename for o in gdb.objfiles() if o.filename and os.path.basename(o.filename) == name), None)
    if copy is None:
        return False
    try:
        got = gdb.selected_inferior().read_memory(address, 64).tobytes()
        with open(copy, "rb") as f:
            f.seek(mapping.offset + address - mapping.start)
            want = f.read(64)
    except (gdb.error, OSError, ValueError):
        return False
    return got == want and any(want)


def _memory_map() -> MemoryMap:
    maps = mappings()
    spans = [(m.start, m.end) for m in maps]
    if connection_type() != "core":
        readable = spans
        if connection_type() == "native":
            with LivePages(gdb.selected_inferior().pid) as pages:
                readable = ranges_without(spans, pages.absent())
        return MemoryMap(maps, spans, readable or None, writable=_live_writable())
    with _open_core() as core:
        writable = list(core.writable) if core is not None else None
        loads = core.regions() if core is not None else None
    try:
        sections = [(int(a, 16), int(b, 16), name) for a, b, name in
                    _SECTION.findall(command_text("info files"))]
    except gdb.error:
        return MemoryMap(maps, loads or [], spans or None, True, writable)
    if loads is None:
        loads = [(a, b) for a, b, name in sections if re.fullmatch(r"load\d+", name)]
    return MemoryMap(maps, loads, [(a, b) for a, b, _ in sections] + spans or None, True, writable)


def _live_writable() -> list[tuple[int, int]] | None:
    """The writable mappings of a process on this machine (/proc/PID/maps); None for any other target."""
    if connection_type() != "native":
        return None
    try:
        with open(f"/proc/{gdb.selected_inferior().pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = []
    for line in lines:
        fields = line.split(None, 2)
        if len(fields) >= 2 and fields[1][1:2] == "w":
            start, _, end = fields[0].partition("-")
            out.append((int(start, 16), int(end, 16)))
    return out


def mappings() -> list[Mapping]:
    """The target's mappings as 'info proc mappings' shows them (core file note, or /proc/PID/maps)."""
    try:
        text = command_text("info proc mappings")
    except gdb.error:
        return []
    out = []
    for line in text.splitlines():
        m = _MAPPING_LINE.match(line)
        if m:
            out.append(Mapping(int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16), m.group(4) or ""))
    return out
