"""The figures a report may show, damaged heap or not: shared by the forensics tests and the fuzz driver."""

from __future__ import annotations

import re

_PERCENT = re.compile(r"(-?\d+(?:\.\d+)?)%")


def impossible(report: dict) -> list[str]:
    """What in REPORT (jsonout.report_json's document) no heap can have: a negative byte count or count, a
    share outside 0-100%, a fragmentation outside 0-1, a largest free chunk larger than all free chunks,
    a histogram that does not add up to the free bytes it is drawn from.  Empty when every figure is possible."""
    out = []
    for row in [*report["arenas"], report["totals"]]:
        where = f"arena {row['number']}" if "number" in row else "totals"
        for key, value in row.items():
            if isinstance(value, int) and not isinstance(value, bool) and key != "number" and value < 0:
                out.append(f"{where}: {key} = {value}")
        free = row["free"] if isinstance(row["free"], dict) else {"all": row["free"]}
        out += [f"{where}: free {k} = {v}" for k, v in free.items() if v < 0]
    if not 0 <= report["fragmentation"] <= 1:
        out.append(f"fragmentation {report['fragmentation']}")
    histogram = sum(b["bytes"] for b in report["histogram"])
    if not report["largest_free"] <= report["free_listed"] == histogram:
        out.append(f"largest free {report['largest_free']}, free listed {report['free_listed']}, "
                   f"histogram {histogram}")
    out += [f"histogram bucket {b}" for b in report["histogram"] if b["bytes"] < 0 or b["count"] < 0]
    out += [f"class {c}" for c in report["by_glibc_class"] if c["bytes"] < 0 or c["count"] < 0]
    for line in report["verdict"]:
        out += [f"verdict: {line}" for p in _PERCENT.findall(line) if not 0 <= float(p) <= 100]
    return out
