"""The kinds of damage mallocng's walk names."""

from heapwalk.common.findings import Kind

__all__ = ["AREA", "GROUP", "SLOT", "LIST"]

AREA = Kind("musl_meta_area", "meta area unreadable or not the context's")
GROUP = Kind("musl_group", "group inconsistent with its meta")
SLOT = Kind("musl_slot", "slot header inconsistent with its group")
LIST = Kind("musl_active_list", "a size class's list of groups broken")
