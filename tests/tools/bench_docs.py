"""`make bench` writes what it measured into docs/performance.md: one part per size, each with the machine, the
date, the commit and the method, between markers of its own, so that a run replaces its size's part and leaves
the rest of the page (hand-written analysis, other sizes) as it was."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import textwrap
from datetime import datetime, timezone
from pathlib import Path

from bench_plot import growth_svg

ROOT = Path(__file__).resolve().parents[2]
HEADING = "## What `make bench` measured last"
INTRO = ("`make bench` writes this section itself (`tests/tools/bench_docs.py`), one part per size, replacing that size's "
         "part each time it runs: the machine, the date, the commit, the method and the medians, as measured. A "
         "cell reads: the command's median seconds inside gdb, that against the floor (the same bytes read 4 MiB at "
         "a time) and, in parentheses, against one bulk read of each heap, then gdb's peak RSS and what it holds "
         "above gdb's own per million chunks (or blocks). The bars (issue 76): `report` and `leaks` within 5x the "
         "floor, `bins`, `check`, `chunks` and `map` within 3x, and at most 24 MiB per million chunks or blocks.")
#: the section is put before this heading when the page does not have it yet
ANCHOR = "## The one pass"
SIZE_ORDER = ("smoke", "small", "medium", "large", "huge")
#: each command's bar against the floor (the same bytes read 4 MiB at a time), by its first two words
BARS = {"heapwalk report": 5.0, "heapwalk leaks": 5.0, "heapwalk bins": 3.0, "heapwalk check": 3.0,
        "heapwalk chunks": 3.0, "heapwalk map": 3.0}
#: gdb's memory above its own a command may hold per million chunks or blocks
MEMORY_BAR = 24 * (1 << 20)
MIB = 1 << 20
WIDTH = 115      # the page's prose is wrapped at this width; a table's rows are not


def begin_marker(size: str) -> str:
    return f"<!-- make bench {size}: begin -->"


def end_marker(size: str) -> str:
    return f"<!-- make bench {size}: end -->"


def machine() -> dict:
    """What the numbers were measured on: processor, memory, kernel, gdb, gdb's Python and numpy, glibc, and
    the commit of the tree measured."""
    cpuinfo = _read("/proc/cpuinfo")
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    meminfo = re.search(r"^MemTotal:\s*(\d+) kB", _read("/proc/meminfo"), re.M)
    python = _run(["gdb", "-nx", "-batch", "-q", "-x", str(ROOT / "gdbinit"), "-ex",
                   "python import sys, numpy; print('bench-python', sys.version.split()[0], numpy.__version__)"])
    versions = re.search(r"^bench-python (\S+) (\S+)$", python, re.M)
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "cpu": model.group(1).strip() if model else platform.processor() or "unknown",
        "cpus": os.cpu_count() or 0,
        "memory_bytes": int(meminfo.group(1)) * 1024 if meminfo else 0,
        "kernel": platform.release(),
        "virtual": _virtual(cpuinfo),
        "gdb": (_run(["gdb", "--version"]).splitlines() or ["gdb (unknown)"])[0].strip(),
        "python": versions.group(1) if versions else "unknown",
        "numpy": versions.group(2) if versions else "unknown",
        "glibc": (os.confstr("CS_GNU_LIBC_VERSION") or "unknown").replace("glibc ", "")
        if "CS_GNU_LIBC_VERSION" in os.confstr_names else "unknown",
    }


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _commit() -> str:
    """The commit measured, and whether the tree had changes beside it."""
    head = _run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]).strip() or "unknown"
    changed = _run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"]).strip()
    return f"{head} with uncommitted changes" if changed else head


def _virtual(cpuinfo: str) -> str:
    """Where the numbers were measured, when not on bare metal: the hypervisor and the container
    (systemd-detect-virt), else 'a virtual machine' when the processor says it runs under one, else ''."""
    vm = _run(["systemd-detect-virt", "--vm"]).strip()
    container = _run(["systemd-detect-virt", "--container"]).strip()
    flags = re.search(r"^flags\s*:(.*)$", cpuinfo, re.M)
    under = flags is not None and " hypervisor" in flags.group(1)
    parts = [f"a virtual machine ({vm})" if vm and vm != "none" else "a virtual machine" if under else "",
             f"a container ({container})" if container and container != "none" else ""]
    return ", in ".join(p for p in parts if p)


def machine_line(m: dict) -> str:
    """The machine as one sentence."""
    where = f", {m['virtual']}" if m["virtual"] else ""
    return (f"{m['cpu']}, {m['cpus']} logical CPUs, {m['memory_bytes'] / (1 << 30):.1f} GiB{where}; Linux "
            f"{m['kernel']}; {m['gdb']}; gdb's Python {m['python']}, numpy {m['numpy']}; glibc {m['glibc']}")


def cores_of(data: dict) -> list[tuple[str, dict, str]]:
    """Each core the run measured as (its name in the tables, its numbers, what it counts: chunks or blocks)."""
    cores = [(f"glibc {r['shape']}, {r['chunks'] / 1e6:.1f} M chunks", r, "chunks") for r in data.get("shapes") or []]
    je = data.get("jemalloc")
    if je:
        cores.append((f"jemalloc ({je['jemalloc']}) random, {je['blocks'] / 1e6:.1f} M blocks", je, "blocks"))
    cores += [(f"{r['name']} random, {r['blocks'] / 1e6:.1f} M blocks", r, "blocks") for r in data.get("preloaded") or []]
    return cores


def commands_of(cores: list[tuple[str, dict, str]]) -> list[str]:
    """Every command timed on any of CORES, in the order they were timed."""
    commands: list[str] = []
    for _, r, _ in cores:
        commands += [c["command"] for c in r["commands"] if c["command"] not in commands]
    return commands


def _cell(row: dict | None, unit: str) -> str:
    if row is None:
        return "-"
    return (f"{row['command_seconds']:.2f} s, {row['times_floor_4m']:.1f}x ({row['times_floor']:.1f}x), "
            f"{row['peak_rss_bytes'] / MIB:,.0f} MiB ({row[f'rss_per_million_{unit}'] / MIB:.0f}/M)")


def _heaps_row(name: str, r: dict) -> str:
    heap = r.get("heap_bytes", r.get("extent_bytes", r.get("block_bytes", 0)))
    pieces = f"{r['heaps']} heaps" if "heaps" in r else f"{r['extent_runs']:,} runs of extents" \
        if "extent_runs" in r else f"{r['block_runs']:,} runs of pages in use"
    one_pass = f"{r['walk_seconds']:.2f} s, {r['walk_times_floor']:.1f}x" if "walk_seconds" in r else "-"
    scan = f"{r['leak_scan_seconds']:.2f} s, {r['leak_scan_times_floor']:.1f}x" if "leak_scan_seconds" in r else "-"
    return (f"| {name} | {heap / MIB:,.0f} MiB in {pieces} | {r['floor_seconds']:.3f} s | "
            f"{r['floor_4m_seconds']:.3f} s | {r['gdb_load_seconds']:.2f} s, {r['gdb_load_peak_rss_bytes'] / MIB:,.0f} MiB "
            f"| {one_pass} | {scan} |")


def bar_lines(cores: list[tuple[str, dict, str]]) -> list[str]:
    """The commands within their bars on every core, then each other one with where it is not, and by how much:
    time against the floor of 4 MiB reads (`BARS`), then memory per million (`MEMORY_BAR`)."""
    commands = commands_of(cores)
    met, missed, small, large = [], [], [], []
    for command in commands:
        rows = [(name.split(",")[0], next((c for c in r["commands"] if c["command"] == command), None), unit)
                for name, r, unit in cores]
        rows = [(name, row, unit) for name, row, unit in rows if row is not None]
        short = command.split(" --")[0]
        bar = BARS.get(" ".join(short.split()[:2]))
        over = [(name, row["times_floor_4m"]) for name, row, _ in rows if bar is not None and row["times_floor_4m"] > bar]
        if over:
            missed.append(f"- `{short}` over its {bar:g}x: {', '.join(f'{x:.1f}x on {name}' for name, x in over)}")
        elif bar is not None:
            met.append(f"`{short}` ({bar:g}x)")
        heavy = [(name, row[f"rss_per_million_{unit}"]) for name, row, unit in rows
                 if row[f"rss_per_million_{unit}"] > MEMORY_BAR]
        if heavy:
            large.append(f"- `{short}` over it: {', '.join(f'{x / MIB:.0f} MiB/M on {name}' for name, x in heavy)}")
        else:
            small.append(f"`{short}`")
    lines = ["Against the bars of time (the floor of 4 MiB reads):"]
    lines += [f"- within them on every core: {', '.join(met)}"] if met else []
    lines += missed + ["", f"Against the bar of memory ({MEMORY_BAR / MIB:.0f} MiB per million chunks or blocks):"]
    lines += [f"- within it on every core: {', '.join(small)}"] if small else []
    return lines + large


def section(size: str, data: dict, m: dict, argv: list[str], extra: list[str] = ()) -> str:
    """The part of the page for SIZE: DATA (tests/tools/bench.py's JSON), measured on M (`machine`) by the command ARGV,
    with EXTRA lines (capture, stress, pre-copy) as they were printed."""
    cores = cores_of(data)
    runs = max((r["runs"] for _, r, _ in cores), default=0)
    times = "once, its time" if runs == 1 else f"{runs} times, the median of its times"
    method = (f"Measured on {machine_line(m)}. Command: `tests/tools/bench.py {' '.join(argv)}`; each command run as a "
              f"whole `gdb -batch` {times} inside gdb (gdb's start and the core's loading not counted), the peak RSS "
              "the highest of the runs.")
    lines = [f"### {size}: {m['date']}, commit {m['commit']}", "", textwrap.fill(method, WIDTH, break_on_hyphens=False),
             ""]
    if cores:
        lines += ["| core | heap | floor: one read each | in 4 MiB reads | gdb start and core load | one pass alone "
                  "| leak scan alone |", "|---|---|---|---|---|---|---|"]
        lines += [_heaps_row(name, r) for name, r, _ in cores]
        commands = commands_of(cores)
        lines += ["", "| command | " + " | ".join(name for name, _, _ in cores) + " |",
                  "|---|" + "---|" * len(cores)]
        for command in commands:
            cells = [_cell(next((c for c in r["commands"] if c["command"] == command), None), unit)
                     for _, r, unit in cores]
            lines.append(f"| `{command}` | " + " | ".join(cells) + " |")
        lines += ["", *bar_lines(cores)]
    if extra:
        lines += [""] + [textwrap.fill(line, WIDTH, initial_indent="- ", subsequent_indent="  ",
                                       break_on_hyphens=False) for line in extra if line]
    return "\n".join(lines).rstrip() + "\n"


def updated(text: str, size: str, body: str) -> str:
    """TEXT (the page) with SIZE's part replaced by BODY, or added in size order (the section made first when
    the page has none)."""
    block = f"{begin_marker(size)}\n{body.rstrip()}\n{end_marker(size)}\n"
    begin, end = text.find(begin_marker(size)), text.find(end_marker(size))
    if begin >= 0 and end > begin:
        stop = end + len(end_marker(size))
        return text[:begin] + block.rstrip("\n") + text[stop:]
    if HEADING not in text:
        at = text.find(f"\n{ANCHOR}")
        head = f"{HEADING}\n\n{textwrap.fill(INTRO, WIDTH)}\n\n"
        text = text.rstrip("\n") + "\n\n" + head if at < 0 else text[:at + 1] + head + text[at + 1:]
    start = text.index(HEADING)
    following = text.find("\n## ", start + len(HEADING))
    limit = len(text) if following < 0 else following + 1
    rank = SIZE_ORDER.index(size) if size in SIZE_ORDER else len(SIZE_ORDER)
    later = [i for i in (text.find(begin_marker(s), start, limit) for s in SIZE_ORDER[rank + 1:]) if i >= 0]
    at = min(later) if later else limit
    before = text[:at].rstrip("\n") + "\n\n"
    after = text[at:].lstrip("\n")
    return before + block + ("\n" + after if after else "")


def growth(runs: list[dict], kept: dict[str, list[str]] | None = None) -> str:
    """How `report`'s cost grows from size to size: a row per core of each run of RUNS (the bench JSON of each
    size, in size order), its chunks or blocks, heap, seconds, against the floor of 4 MiB reads, gdb's memory
    above its own in all and per million, and the run's commit and date; the rows KEPT (by size: the table's
    rows as the page had them) for a size no run of RUNS has, in their place."""
    lines = ["### How `report`'s cost grows", "",
             textwrap.fill("Each size's last run (above), `heapwalk report` on each of its cores, as `make bench` "
                           "wrote it (each size's run rewrites this table from the runs it finds in build/bench, "
                           "and keeps the rows of a size it finds none of: sizes measured at other commits say so "
                           "in the last column), and its plot (`performance-growth.svg`, written with it).", WIDTH),
             "", "![How report's time and memory grow with the chunks or blocks](performance-growth.svg)", "",
             "| size | core | chunks or blocks | heap | report | x floor (4 MiB reads) | above gdb's own | per million "
             "| commit, date |", "|---|---|---|---|---|---|---|---|---|"]
    measured = {data["size"] for data in runs}
    order = {s: i for i, s in enumerate(SIZE_ORDER)}
    for size in sorted(measured | set(kept or {}), key=lambda s: order.get(s, len(SIZE_ORDER))):
        if size not in measured:
            lines += (kept or {})[size]
            continue
        data = next(d for d in runs if d["size"] == size)
        for name, r, unit in cores_of(data):
            row = next((c for c in r["commands"] if c["command"] == "heapwalk report"), None)
            if row is None:
                continue
            count = r[unit]
            above = row["peak_rss_bytes"] - r["gdb_load_peak_rss_bytes"]
            heap = r.get("heap_bytes", r.get("extent_bytes", r.get("block_bytes", 0)))
            m = data.get("machine", {})
            lines.append(f"| {data['size']} | {name.split(',')[0]} | {count:,} | {heap / MIB:,.0f} MiB | "
                         f"{row['command_seconds']:.2f} s | {row['times_floor_4m']:.1f}x | {above / MIB:,.0f} MiB | "
                         f"{row[f'rss_per_million_{unit}'] / MIB:.0f} MiB | {m.get('commit', '?')}, "
                         f"{m.get('date', '?')[:10]} |")
    return "\n".join(lines) + "\n"


def write(path: Path, data: dict, others: dict[str, dict] | None = None) -> None:
    """Writes the part of the page at PATH for DATA's size (tests/tools/bench.py's JSON, with the machine it was measured
    on, the command and the lines printed after the tables), then the growth table from DATA, the rows the page
    has of the other sizes (those of the runs that wrote their parts), and OTHERS (the other sizes' last runs, by
    size) for a size the page has no row of: a run left out of the page (measured in a slow spell, or without
    --docs) does not come in by another size's run."""
    text = path.read_text() if path.exists() else "# Performance\n"
    body = section(data["size"], data, data["machine"], data["argv"], data.get("lines", []))
    text = updated(text, data["size"], body)
    kept = growth_rows(text)
    runs = {**{size: run for size, run in (others or {}).items() if size not in kept}, data["size"]: data}
    ordered = [runs[s] for s in SIZE_ORDER if s in runs]
    table = growth(ordered, kept)
    path.write_text(updated(text, "growth", table))
    path.with_name(path.stem + "-growth.svg").write_text(growth_svg(table.splitlines()))


def growth_rows(text: str) -> dict[str, list[str]]:
    """The rows of the growth table the page TEXT holds, by size: what a machine whose build/bench lacks a size's
    run keeps of it (a new machine has measured none yet)."""
    begin, end = text.find(begin_marker("growth")), text.find(end_marker("growth"))
    rows: dict[str, list[str]] = {}
    for line in text[begin:end].splitlines() if 0 <= begin < end else []:
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 2 and cells[1] in SIZE_ORDER:
            rows.setdefault(cells[1], []).append(line)
    return rows


if __name__ == "__main__":
    import json
    import sys
    if len(sys.argv) != 3:
        sys.exit("usage: tests/tools/bench_docs.py BENCH_JSON PAGE  (the page's part for that run, written again)")
    write(Path(sys.argv[2]), json.loads(Path(sys.argv[1]).read_text()))
