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


_FIGURE = re.compile(r'<figure class="heap"><figcaption>(.*?)</figcaption>.*?data-arena="(\d+)"', re.S)


def page_disagreements(html: str, doc: dict) -> list[str]:
    """Where a glibc report page (HTML, with DOC its report's JSON) says two different things of one figure: each
    arena's row against what its heap maps draw (in use, the tcache struct with it; free in chunks; top; resident)
    and against what its maps' captions say (in use, resident, what trim gives back, in RAM when known).
    Empty when no two figures disagree."""
    from browser import heap_groups
    from heapwalk.analysis.report import human
    drawn: dict[int, dict[str, int]] = {}
    for g in heap_groups(html):
        sums = drawn.setdefault(int(g["data-arena"]), {})
        for r in g["rects"]:
            key = r.get("class") if r.get("class") in ("trim", "resident") else r.get("data-kind")
            if key and "data-bytes" in r:
                sums[key] = sums.get(key, 0) + int(r["data-bytes"])
    captions: dict[int, list[str]] = {}
    for caption, arena in _FIGURE.findall(html):
        captions.setdefault(int(arena), []).append(re.sub(r"<[^>]+>", "", caption))
    out = []
    for a in doc["report"]["arenas"]:
        n, s = a["number"], drawn.get(a["number"], {})
        pairs = [("in use", a["in_use"], s.get("in_use", 0) + s.get("leaked", 0) + s.get("tcache_struct", 0)),
                 ("free", sum(a["free"].values()), sum(s.get(k, 0) for k in ("tcache", "fast", "unsorted", "small",
                                                                          "large"))),
                 ("top", a["top"], s.get("top", 0))]
        if a.get("rss") is not None:
            pairs.append(("resident", a["rss"], s.get("resident", 0)))
        out += [f"arena {n}: {what} {row} in its row, {maps} in its maps" for what, row, maps in pairs if row != maps]
        if len(captions.get(n, [])) == 1:
            said = captions[n][0]
            wanted = [f"in use {human(a['in_use'])}",
                      f"trim releases {human(s.get('trim', 0))} of address space"]
            if a.get("rss") is not None:
                wanted += [f"resident {human(a['rss'])}", f"({human(a['trim'])} of it in RAM)"]
            out += [f"arena {n}: '{words}' is not in its map's caption '{said}'" for words in wanted
                    if words not in said]
    return out
