"""The tests' two views of one heap: glibc's malloc_info XML and heapwalk's JSON.

`parse_malloc_info` reads what the process printed; `malloc_info_view` computes
the same structure from heapwalk's JSON, following malloc_info's rules
(documented in docs/json.md): fastbin lines give from = size - 15, to = size,
total = count x size; regular-bin lines give min/max/total of the size fields
as stored (flag bits included); "rest" counts top (2.31+) and every chunk in
bins 1..127.  The two must be equal.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any


def parse_malloc_info(path) -> dict[str, Any]:
    root = ET.parse(path).getroot()
    heaps = []
    for heap in root.findall("heap"):
        sizes = heap.find("sizes")
        lines = [(el.tag, int(el.get("from")), int(el.get("to")), int(el.get("total")), int(el.get("count")))
                 for el in sizes]
        heaps.append({
            "nr": int(heap.get("nr")),
            "sizes": lines,
            "totals": {el.get("type"): (int(el.get("count")), int(el.get("size"))) for el in heap.findall("total")},
            "system": {el.get("type"): int(el.get("size")) for el in heap.findall("system")},
            "aspace": {el.get("type"): int(el.get("size")) for el in heap.findall("aspace")},
        })
    return {
        "heaps": heaps,
        "totals": {el.get("type"): (int(el.get("count")), int(el.get("size"))) for el in root.findall("total")},
        "system": {el.get("type"): int(el.get("size")) for el in root.findall("system")},
        "aspace": {el.get("type"): int(el.get("size")) for el in root.findall("aspace")},
    }


def _version(doc) -> tuple[int, int]:
    major, minor = doc["glibc"]["decoded_as"].split(".")
    return int(major), int(minor)


def malloc_info_view(doc: dict[str, Any]) -> dict[str, Any]:
    """What malloc_info would have printed for the heap heapwalk decoded."""
    version = _version(doc)
    heaps = []
    sum_fast = [0, 0]
    sum_rest = [0, 0]
    sum_system = {"current": 0, "max": 0}
    sum_aspace = {"total": 0, "mprotect": 0}
    for arena in doc["arenas"]:
        bins = arena["bins"]
        lines = []
        fast_count = fast_bytes = 0
        for fb in bins.get("fast", []):
            if fb["count"]:
                size = (fb["index"] + 2) * 16
                lines.append(("size", size - 15, size, fb["count"] * size, fb["count"]))
                fast_count += fb["count"]
                fast_bytes += fb["bytes"]
        regular = sorted(bins["small"] + bins["large"], key=lambda b: b["index"])
        for b in regular:
            lines.append(("size", b["size_field_min"], b["size_field_max"], b["size_field_total"], b["count"]))
        uns = bins["unsorted"]
        if uns["count"]:
            lines.append(("unsorted", uns["size_field_min"], uns["size_field_max"], uns["size_field_total"],
                          uns["count"]))
        rest_count = uns["count"] + sum(b["count"] for b in regular)
        rest_size = uns["size_field_total"] + sum(b["size_field_total"] for b in regular)
        if version >= (2, 31):
            rest_count += 1
            rest_size += arena["top"]["size"]
        totals = {"rest": (rest_count, rest_size)}
        if version < (2, 43):
            totals["fast"] = (fast_count, fast_bytes)
        if arena["kind"] == "main":
            aspace = {"total": arena["system_mem"], "mprotect": arena["system_mem"]}
        else:
            aspace = {"total": sum(h["size"] for h in arena["heaps"]),
                      "mprotect": sum(h["mprotect_size"] for h in arena["heaps"]),
                      "subheaps": len(arena["heaps"])}
        heaps.append({"nr": arena["number"], "sizes": lines, "totals": totals,
                      "system": {"current": arena["system_mem"], "max": arena["max_system_mem"]},
                      "aspace": aspace})
        sum_fast[0] += fast_count
        sum_fast[1] += fast_bytes
        sum_rest[0] += rest_count
        sum_rest[1] += rest_size
        sum_system["current"] += arena["system_mem"]
        sum_system["max"] += arena["max_system_mem"]
        sum_aspace["total"] += aspace["total"]
        sum_aspace["mprotect"] += aspace["mprotect"]
    mmap = (doc["mp"]["n_mmaps"], doc["mp"]["mmapped_mem"]) if doc["mp"] else \
        (doc["mmapped"]["count"], doc["mmapped"]["bytes"])  # mp_ not found: what memory holds
    totals = {"rest": tuple(sum_rest), "mmap": mmap}
    if version < (2, 43):
        totals["fast"] = tuple(sum_fast)
    return {"heaps": heaps, "totals": totals, "system": sum_system, "aspace": sum_aspace}


#: the per-arena figures of malloc_stats_print's "J" that heapwalk's jemalloc JSON carries under the same names
JE_ARENA_FIELDS = ("nthreads", "pactive", "pdirty", "pmuzzy", "retained", "dirty_decay_ms", "muzzy_decay_ms",
                   "dirty_npurge", "dirty_nmadvise", "dirty_purged", "muzzy_npurge", "muzzy_nmadvise",
                   "muzzy_purged", "mapped", "base", "internal", "resident", "metadata_thp")
#: what later versions print besides (compared where both sides have them): of the base's bytes, those for
#: extent headers and for radix tree nodes (5.3.1); the address space given up on, and the spare extent headers
#: (5.2 and later)
JE_ARENA_531 = ("metadata_edata", "metadata_rtree", "abandoned_vm", "extent_avail")
JE_BIN_FIELDS = ("nmalloc", "ndalloc", "curregs", "nrequests", "nfills", "nflushes", "nreslabs", "curslabs",
                 "nonfull_slabs")
_JE_LARGE = ("allocated", "nmalloc", "ndalloc", "nrequests", "nfills", "nflushes")


def jemalloc_arena_view(arena: dict[str, Any], like: dict[str, Any] | None = None) -> dict[str, Any]:
    """One arena of heapwalk's jemalloc JSON as the fields malloc_stats_print prints for it; LIKE (what a
    version printed for the arena, stats.arenas.<i>) leaves out what that version does not print (5.1.0: the
    free extents by size, the bins' nonfull_slabs, fills and flushes in the totals)."""
    view = {"fields": {k: arena[k] for k in JE_ARENA_FIELDS + JE_ARENA_531 if k in JE_ARENA_FIELDS or
                       arena.get(k) is not None},
            "bins": [{k: b[k] for k in JE_BIN_FIELDS} for b in arena["bins"]],
            "small": arena["small"], "large": {k: arena["large"][k] for k in _JE_LARGE},
            "curlextents": [c["curlextents"] for c in arena["lextents"]], "extents": arena["extents"]}
    if like is None:
        return view
    shown = like["bins"][0].keys() if like["bins"] else JE_BIN_FIELDS
    view["bins"] = [{k: b[k] for k in JE_BIN_FIELDS if k in shown} for b in view["bins"]]
    view["small"] = {k: v for k, v in view["small"].items() if k in like["small"]}
    view["large"] = {k: v for k, v in view["large"].items() if k in like["large"]}
    if "extents" not in like:
        del view["extents"]
    return view


def jemalloc_printed_view(printed: dict[str, Any], index: int, ledger: dict[str, Any],
                           bin_sizes: list[int] | None = None) -> dict[str, Any]:
    """Arena INDEX of what malloc_stats_print printed ("J", stats.arenas.<i>), as the reproducer left it
    after printing (cores/jemalloc/je_common.h): jemalloc 5.3's printer buffer was counted in arena 0's internal
    bytes while it printed and no longer is, and taking it back counts one more allocation of its class and the
    printer's free: a large one, or where the buffer is a small class of the build (BIN_SIZES: the small
    classes, stats.arenas.bin's sizes; with 64 KiB pages the 64 KiB buffer is one), one of that bin."""
    fields = {k: printed[k] for k in JE_ARENA_FIELDS + JE_ARENA_531 if k in printed}
    large = {k: printed["large"][k] for k in _JE_LARGE if k in printed["large"]}
    bins = [{k: b[k] for k in JE_BIN_FIELDS if k in b} for b in printed["bins"]]
    small = {k: v for k, v in printed["small"].items() if k != "mutex"}
    buffer = ledger["stats_buffer"]
    if buffer is not None and buffer["arena"] == index:
        if buffer["internal"]:
            fields["internal"] -= buffer["size"]
        if buffer["retaken"] and buffer["size"] in (bin_sizes or []):
            for counts in (bins[bin_sizes.index(buffer["size"])], small):
                for k in ("nmalloc", "ndalloc", "nrequests"):
                    counts[k] += 1
        elif buffer["retaken"]:
            for k in ("nmalloc", "ndalloc", "nrequests", "nfills"):
                large[k] += 1
    view = {"fields": fields, "bins": bins, "small": small, "large": large,
            "curlextents": [c["curlextents"] for c in printed["lextents"]]}
    if "extents" in printed:
        view["extents"] = printed["extents"]
    return view
