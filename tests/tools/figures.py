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
    out += [f"class {c}" for c in report["by_size_class"] if c["bytes"] < 0 or c["count"] < 0]
    for line in report["verdict"]:
        out += [f"verdict: {line}" for p in _PERCENT.findall(line) if not 0 <= float(p) <= 100]
    return out


_FIGURE = re.compile(r'<figure class="heap"><figcaption>(.*?)</figcaption>.*?data-arena="(\d+)"', re.S)


def page_disagreements(html: str, doc: dict) -> list[str]:
    """Where a report page (HTML, with DOC its report's JSON) says two different things of one figure: for
    glibc (`_glibc_disagreements`) each arena's row against what its maps draw and say; for the others, each
    arena's row (in use, free) against what its maps draw, by what each kind of run is (the program's, free
    memory the allocator keeps), and each map's caption against what the map draws.  Empty when no two
    figures disagree."""
    if doc.get("allocator", "glibc") == "glibc":
        return _glibc_disagreements(html, doc)
    from browser import heap_groups
    from heapwalk.analysis.report import human
    from heapwalk.registry import allocators
    from heapwalk.common.mapkinds import FREE, KINDS, USED
    allocators()            # every allocator's folder imported, and so its kinds of run
    #: kinds a map draws apart that the allocator's own figure of free memory counts (tcmalloc's central cache
    #: free bytes, as MallocExtension reports them, include what its spans lose to rounding)
    counted_free = {"tcmalloc": ("tc_rounding",)}.get(doc.get("allocator"), ())
    drawn: dict[int, dict[str, int]] = {}
    groups = heap_groups(html)
    for g in groups:
        sums = drawn.setdefault(int(g["data-arena"]), {})
        for r in g["rects"]:
            kind = r.get("data-kind")
            if kind in KINDS and "data-bytes" in r and r.get("class") not in ("trim", "resident"):
                use = FREE if kind in counted_free else KINDS[kind].use
                sums[use] = sums.get(use, 0) + int(r["data-bytes"])
    rows = doc["report"]["arenas"]
    out = []
    if "more heaps are not drawn" not in html:       # every map drawn: the page's totals are the rows'
        for what, row, maps in (("in use", sum(a["in_use"] for a in rows), sum(s.get(USED, 0) for s in drawn.values())),
                                ("free", sum(sum(a["free"].values()) + a["top"] for a in rows),
                                 sum(s.get(FREE, 0) for s in drawn.values()))):
            if row != maps:
                out.append(f"{what}: {row} in the rows, {maps} in the maps")
    if doc.get("allocator") == "jemalloc":            # a strip is one arena's: each row against its maps
        for a in rows:
            s = drawn.get(a["number"])
            if s is None:
                continue
            for what, row, maps in (("in use", a["in_use"], s.get(USED, 0)),
                                    ("free", sum(a["free"].values()), s.get(FREE, 0))):
                if row != maps:
                    out.append(f"arena {a['number']}: {what} {human(row)} in its row, {human(maps)} in its maps")
    for caption, group in zip(_captions(html), groups):
        used = sum(int(r["data-bytes"]) for r in group["rects"] if r.get("data-kind") in KINDS
                   and KINDS[r["data-kind"]].use == USED and r.get("class") not in ("trim", "resident"))
        if f"in use {human(used)}" not in caption:
            out.append(f"a map draws {human(used)} in use, its caption says '{caption}'")
    return out


def _captions(html: str) -> list[str]:
    """Each heap map's caption, as text, in the page's order."""
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r'<figure class="heap"><figcaption>(.*?)</figcaption>',
                                                           html, re.S)]


def _glibc_disagreements(html: str, doc: dict) -> list[str]:
    """Where a glibc report page says two different things of one figure: each arena's row against what its heap
    maps draw (in use, the tcache struct with it; free in chunks; top; resident) and against what its maps'
    captions say (in use, resident, what trim gives back, in RAM when known)."""
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


def diff_page_disagreements(html: str, d: dict) -> list[str]:
    """Where a diff page (HTML, with D the diff's JSON) says two different things of one figure: the summary's
    cards against the totals' growth, each arena's A, B and change rows against its figures, and the arenas
    the page says grew against their growth."""
    from heapwalk.output.htmldiff import _names, _signed
    from heapwalk.analysis.report import human
    text = re.sub(r"<[^>]+>", "|", html)
    out = []
    names = _names(d)
    for key, growth in d["growth"].items():
        card = re.search(rf"\|{re.escape(names.get(key, key))}\|+([^|]+)\|", text)
        if key != "top" and (card is None or card.group(1) != _signed(growth)):
            out.append(f"card {names.get(key, key)}: {card and card.group(1)}, the growth is {_signed(growth)}")
    table = re.search(r'<table id="diff-arenas">(.*?)</table>', html, re.S)
    rows = re.findall(r"<tr>(.*?)</tr>", table.group(1), re.S)[1:] if table else []
    figures = [k for k in ("system", "rss", "in_use", "free", "top") if d["arenas"] and k in d["arenas"][0]
               and (k != "top" or (d.get("words") or {}).get("top", True))]
    for i, x in enumerate(d["arenas"]):
        cells = [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)][4:]
                 for row in rows[3 * i:3 * i + 3]]
        wanted = [[human(x[k][0]) for k in figures], [human(x[k][1]) for k in figures],
                  [_signed(x[k + "_growth"]) for k in figures]]
        if cells != wanted:
            out.append(f"arena {x['number']}: its rows say {cells}, its figures are {wanted}")
    said = re.search(r"<p>Grew: (.*?)\.</p>", html)
    grown = {x["number"] for x in d["arenas"] if x["status"] != "unmatched" and
             (x["system_growth"] > 0 or x["in_use_growth"] > 0)}
    named = {int(n) for n in re.findall(r"\b(?:arena|owner) (\d+) \(", said.group(1))} if said else set()
    if named != grown:
        out.append(f"the page says arenas {sorted(named)} grew, their figures say {sorted(grown)}")
    return out
