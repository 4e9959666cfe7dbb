"""What /proc tells of a running process that a core cannot hold: whether this user may attach to it, its
MALLOC_* settings, its mappings with their RSS, and which pages are resident."""

from __future__ import annotations

import os
import re
from pathlib import Path

from heapwalk.inferior.ranges import merged
from heapwalk.inferior.pages import ZeroPages
from heapwalk.inferior.residency import present_runs


def ptrace_advice(pid: int) -> str | None:
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


_ENV_ITEM = re.compile(rb"[A-Za-z_][A-Za-z0-9_.-]*=")


def environment(pid: int, variables: tuple[str, ...]) -> tuple[dict[str, str], str | None]:
    """The VARIABLES (names, or prefixes ending in "_": the allocators' settings) the process started with,
    from its environment block (the strings the kernel put on its stack at exec, /proc/PID/environ), and
    None; or ({}, why) when the block
    cannot be read or no longer holds an environment (a process that wrote its title over it, as php-fpm
    and others do: then only the allocator's own state tells)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError as exc:
        return {}, f"its environment block cannot be read ({exc.strerror})"
    items = [item for item in raw.rstrip(b"\0").split(b"\0")]
    if raw and not all(_ENV_ITEM.match(item) for item in items):
        first = next((item for item in items if item and not _ENV_ITEM.match(item)), b"")
        return {}, (f"the process wrote over its environment block (it now holds "
                    f"\"{first[:40].decode(errors='replace')}\")")
    out = {}
    for item in items:
        name, _, value = item.decode(errors="replace").partition("=")
        if any(name.startswith(v) if v.endswith("_") else name == v for v in variables):
            out[name] = value
    return out, None


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
    bit, less the kernel's zero page), or None when pagemap cannot be read."""
    try:
        f = open(f"/proc/{pid}/pagemap", "rb", buffering=0)
    except OSError:
        return None
    runs: list[tuple[int, int]] = []
    zero = ZeroPages()
    with f:
        for m in mappings:
            if "w" not in m["perms"] or "p" not in m["perms"] or m["rss"] == 0:
                continue
            for start in range(m["start"], m["end"], 1 << 30):
                runs += present_runs(f.fileno(), start, min(m["end"], start + (1 << 30)), zero)
    zero.close()
    return [list(run) for run in merged(runs)]


def thread_names(pid: int) -> dict[str, str]:
    """Each thread's name (its comm), by its LWP as text, as far as /proc lets this user read them."""
    out = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            out[tid] = Path(f"/proc/{pid}/task/{tid}/comm").read_text().rstrip("\n")
        except OSError:
            continue
    return out


def namespaces(pid: int) -> dict | None:
    """Where PID runs when it is in a container, None when it shares this process's mount and pid namespaces:
    whether its mount and pid namespaces are its own, the root its files are read through (/proc/PID/root, as
    it sees them), its pid there, and each thread's id there (host thread id -> its id in the namespace)."""
    own = {}
    for kind in ("mnt", "pid"):
        try:
            own[kind] = os.stat(f"/proc/{pid}/ns/{kind}").st_ino != os.stat(f"/proc/self/ns/{kind}").st_ino
        except OSError:
            own[kind] = False
    if not any(own.values()):
        return None
    threads = {}
    for tid in _tids(pid):
        ids = _nspid(f"/proc/{pid}/task/{tid}/status")
        threads[str(tid)] = ids[-1] if ids else None
    ids = _nspid(f"/proc/{pid}/status")
    return {"mount": own["mnt"], "pid": own["pid"], "root": f"/proc/{pid}/root",
            "pid_inside": ids[-1] if ids else None, "threads_inside": threads}


def _tids(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def _nspid(path: str) -> list[int]:
    """The ids of a process or thread in each pid namespace it is in, outermost first (NSpid)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []
