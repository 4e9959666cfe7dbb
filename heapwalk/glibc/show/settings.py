"""The settings glibc's malloc holds in its own state, as 'heapwalk capture' says them beside the environment."""

from __future__ import annotations

from heapwalk.analysis.report import human

__all__ = ["mp_settings"]


#: the fields of glibc's mp_ that the MALLOC_* variables, GLIBC_TUNABLES and mallopt set, as the capture names them
_MP_SETTINGS = (("arena_max", "arena_max", False), ("arena_test", "arena_test", False),
                ("trim_threshold", "trim_threshold", True), ("mmap_threshold", "mmap_threshold", True),
                ("top_pad", "top_pad", True), ("n_mmaps_max", "mmap_max", False),
                ("tcache_count", "tcache_count", False), ("tcache_max_bytes", "tcache_max", True))


def mp_settings(doc: dict) -> str:
    """The settings glibc's own state holds (mp_ in DOC, a report document), however they were set: the
    variables, GLIBC_TUNABLES or mallopt; "" when mp_ was not read."""
    mp = doc.get("mp") if isinstance(doc.get("mp"), dict) else None
    if not mp:
        return ""
    values = [f"{label} {human(mp[key]) if size else mp[key]}" for key, label, size in _MP_SETTINGS
              if isinstance(mp.get(key), int)]
    if isinstance(mp.get("no_dyn_threshold"), int):
        values.append("thresholds " + ("pinned (set by a variable or mallopt)" if mp["no_dyn_threshold"]
                                       else "dynamic (raised as large blocks are freed)"))
    return "malloc's own state (mp_): " + ", ".join(values)
