"""jemalloc's run-time options (``opt.*``) read from a target without symbols, through mallctl's own tables.

mallctl resolves a name like ``opt.dirty_decay_ms`` by walking a tree of named nodes kept in the library's
relocated read-only data: each node is {named, name, nchildren, children, ctl}, 40 bytes.  The node named
"opt" lists one child per option, and each child's ctl function copies its option out of a global: the first
address that function computes (relative to the program counter) is the global's address (for an option shown
by name, such as ``thp``, the second address it computes is the table of names it indexes).  How each option is stored (bool, unsigned,
size_t, a string...) is the type its ctl function copies, listed below as data; an option whose type is not
listed is not read.
"""

from __future__ import annotations

import struct

from heapwalk.inferior.elf import ElfImage
from heapwalk.jemalloc.mallctl import MallctlTree, TreeNotFound, cstring
from heapwalk.inferior.memory import ReadError

__all__ = ["OPT_TYPES", "OPT_FIELDS", "OPT_FIELDS_531", "read_opts", "OptionsNotFound", "fixed_point_text"]

_NODE = 40                  # ctl_named_node_t (mallctl.NODE)
_CTL_SPAN = 0x80            # bytes of a ctl function searched for its loads

#: how each option is stored, as the ctl function that reads it copies it (the same in every version that has
#: it; 5.3.1's malloc_conf node holds the option strings from each source, NULL shown as "")
OPT_TYPES: dict[str, str] = {
    **dict.fromkeys(
        "abort abort_conf cache_oblivious confirm_conf hpa retain background_thread stats_print zero "
        "tcache prof prof_active prof_thread_active_init prof_accum prof_gdump prof_final prof_leak prof_leak_error "
        "experimental_infallible_new experimental_hpa_start_huge_if_thp_always experimental_hpa_enforce_hugify "
        "hpa_hugify_sync huge_arena_pac_thp experimental_tcache_gc disable_large_size_classes".split(), "bool"),
    **dict.fromkeys("narenas tcache_nslots_small_min tcache_nslots_small_max tcache_nslots_large "
                    "lg_tcache_flush_small_div lg_tcache_flush_large_div debug_double_free_max_scan prof_bt_max".split(),
                    "unsigned"),
    **dict.fromkeys("oversize_threshold max_background_threads lg_extent_max_active_fit lg_prof_sample tcache_max "
                    "hpa_hugification_threshold hpa_hugify_delay_ms hpa_min_purge_interval_ms hpa_slab_max_alloc "
                    "hpa_sec_nshards hpa_sec_max_alloc hpa_sec_max_bytes hpa_sec_bytes_after_flush "
                    "hpa_sec_batch_fill_extra tcache_gc_incr_bytes tcache_gc_delay_bytes hpa_purge_threshold "
                    "hpa_min_purge_delay_ms process_madvise_max_batch".split(), "size"),
    **dict.fromkeys("dirty_decay_ms muzzy_decay_ms lg_tcache_max lg_prof_interval mutex_max_spin stats_interval "
                    "lg_tcache_nslots_mul experimental_hpa_max_purge_nhp".split(), "signed"),
    **dict.fromkeys("global_var symlink env_var".split(), "string pointer or none"),
    **dict.fromkeys("dss junk".split(), "string pointer"),
    **dict.fromkeys("prof_prefix stats_print_opts stats_interval_opts".split(), "string"),
    **dict.fromkeys("metadata_thp percpu_arena thp zero_realloc hpa_hugify_style".split(), "name"),
    "hpa_dirty_mult": "fixed point",
}

#: options kept in a struct whose address the ctl function computes: their offset in it (5.3.0's
#: opt_hpa_opts {slab_max_alloc, hugification_threshold, dirty_mult, deferral_allowed, hugify_delay_ms,
#: min_purge_interval_ms} and opt_hpa_sec_opts {nshards, max_alloc, max_bytes, bytes_after_flush,
#: batch_fill_extra})
OPT_FIELDS: dict[str, int] = {"hpa_hugification_threshold": 8, "hpa_dirty_mult": 16, "hpa_hugify_delay_ms": 24,
                              "hpa_min_purge_interval_ms": 32, "hpa_sec_max_alloc": 8, "hpa_sec_max_bytes": 16,
                              "hpa_sec_bytes_after_flush": 24, "hpa_sec_batch_fill_extra": 32}
#: the same from 5.3.1: opt_hpa_opts gains {hugify_sync, experimental_max_purge_nhp, purge_threshold,
#: min_purge_delay_ms, hugify_style}; opt_hpa_sec_opts loses bytes_after_flush
OPT_FIELDS_531: dict[str, int] = {**OPT_FIELDS, "hpa_hugify_sync": 32, "hpa_min_purge_interval_ms": 40,
                                  "experimental_hpa_max_purge_nhp": 48, "hpa_purge_threshold": 56,
                                  "hpa_min_purge_delay_ms": 64, "hpa_hugify_style": 72,
                                  "hpa_sec_batch_fill_extra": 24}


OptionsNotFound = TreeNotFound


def read_opts(image: ElfImage, tree: MallctlTree | None = None, version: tuple[int, int, int] = (5, 3, 0)
              ) -> tuple[dict[str, bool | int | str], str, list[tuple[int, str]]]:
    """Every option of OPT_TYPES the image (jemalloc VERSION) has, in mallctl's order (the options of an inner
    node such as 5.3.1's malloc_conf in its place, under their own names, as malloc_stats_print prints them),
    how the table was found, and (address, what) of each option whose memory is unreadable (OptionsNotFound
    when the tree was not found; ReadError when it is unreadable)."""
    tree = tree or MallctlTree.find(image)
    node = tree.node("opt")
    if node is None:
        raise OptionsNotFound(f"mallctl's tree at {tree.address:#x} has no node \"opt\"")
    fields = OPT_FIELDS_531 if version >= (5, 3, 1) else OPT_FIELDS
    out: dict[str, bool | int | str] = {}
    unread: list[tuple[int, str]] = []
    _read_children(image, node.children, node.nchildren, fields, out, unread, depth=0)
    return out, f"mallctl's \"opt\" node at {node.address:#x} ({node.nchildren} options)", unread


def _read_children(image: ElfImage, children: int, nchildren: int, fields: dict[str, int],
                   out: dict[str, bool | int | str], unread: list[tuple[int, str]], depth: int) -> None:
    """The options of the NCHILDREN nodes at CHILDREN into OUT (and those of an inner node among them, one
    level down); what is unreadable into UNREAD."""
    for i in range(nchildren):
        name = f"#{i}"
        try:
            _named, name_at, count, inner, ctl = struct.unpack("<QQQQQ", image.mem.read(children + _NODE * i, _NODE))
            name = cstring(image, name_at)
            if not ctl and count and inner and depth == 0:
                _read_children(image, inner, min(count, 64), fields, out, unread, depth + 1)
                continue
            kind = OPT_TYPES.get(name)
            if kind is not None and ctl:
                out[name] = _value(image, kind, ctl, fields.get(name, 0))
        except ReadError as exc:
            unread.append((exc.address, f"option {name} is unreadable ({exc.reason})"))
        except ValueError:
            continue


def _value(image: ElfImage, kind: str, ctl: int, field: int) -> bool | int | str:
    """The option a ctl function at CTL copies out, read as KIND, FIELD bytes into what it computes: the
    global is the first address the function computes or reads (a load, which names the field itself), or
    reaches through a slot of the global offset table; a string kept as an array is the address the function
    computes or reads from such a slot; an option shown by name indexes the table of names the next address it
    computes is."""
    refs = image.through_slots(image.code.all_refs(image.mem.read(ctl, _CTL_SPAN), ctl))
    if not refs:
        raise ValueError(f"no load of a global in the ctl function at {ctl:#x}")
    mem, at = image.mem, refs[0].target + (field if refs[0].computes else 0)
    if kind == "string" and not refs[0].computes:      # an array's address, read from the slot that holds it
        at = struct.unpack("<Q", mem.read(refs[0].target, 8))[0]
    leas = [refs[0].target] + [r.target for r in refs[1:] if r.computes]
    if kind == "bool":
        return mem.read(at, 1)[0] != 0
    if kind in ("unsigned", "fixed point", "name"):
        value = struct.unpack("<I", mem.read(at, 4))[0]
        if kind == "fixed point":
            return fixed_point_text(value)
        if kind == "name":
            if len(leas) < 2:
                raise ValueError(f"no table of names in the ctl function at {ctl:#x}")
            return cstring(image, struct.unpack("<Q", mem.read(leas[1] + 8 * value, 8))[0])
        return value
    if kind == "size":
        return struct.unpack("<Q", mem.read(at, 8))[0]
    if kind == "signed":
        return struct.unpack("<q", mem.read(at, 8))[0]
    if kind in ("string pointer", "string pointer or none"):
        at = struct.unpack("<Q", mem.read(at, 8))[0]
        if at == 0 and kind == "string pointer or none":
            return ""
    return cstring(image, at)


def fixed_point_text(value: int) -> str:
    """A 16.16 fixed-point option as jemalloc prints it: "-1" for all ones, else the integer part, a point,
    and the fraction's decimal digits (14 at most) without trailing zeros."""
    if value == 0xFFFFFFFF:
        return "-1"
    fraction = value & 0xFFFF
    digits = (fraction * 10 ** 14) >> 16
    text = str(digits).rjust(14, "0").rstrip("0") if digits else "0"
    return f"{value >> 16}.{text}"
