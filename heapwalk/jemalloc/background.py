"""Whether jemalloc's background threads run, read without symbols: the flag mallctl's "background_thread"
sets at run time (background_thread_enabled_state), found in the code of that ctl's function."""

from __future__ import annotations

from heapwalk.inferior.elf import ElfImage
from heapwalk.inferior.memory import ReadError
from heapwalk.jemalloc.layout import JeLayout
from heapwalk.jemalloc.mallctl import MallctlTree

__all__ = ["background_state"]

_CODE_SPAN = 0x600      # bytes of the ctl function searched for its loads


def background_state(tree: MallctlTree | None, layout: JeLayout) -> tuple[int | None, str]:
    """The flag that says whether background threads run (background_thread_enabled_state, which mallctl's
    "background_thread" sets at run time, as Redis does, whatever opt.background_thread said): the first byte
    its function reads, directly or through the register it put the flag's address in (position-independent
    code), outside the mutexes it takes (those known by the "locked" flag it stores; 5.1.0's mutexes have none,
    and none of their fields is read as a byte)."""
    node = tree.node("background_thread") if tree is not None else None
    if node is None or not node.ctl:
        return None, "not determined: mallctl has no background_thread"
    try:
        code = tree.image.mem.read(node.ctl, _CODE_SPAN)
    except ReadError as exc:
        return None, f"not determined: background_thread's function is unreadable ({exc.reason})"
    mutexes = {target - layout.mutex_locked for target in tree.image.code.byte_stores(code, node.ctl)} \
        if layout.mutex_locked >= 0 else set()
    for target in tree.image.code.byte_loads(code, node.ctl):
        if not any(m <= target < m + layout.mutex_size for m in mutexes) and tree.image.contains(target):
            return target, "the first byte background_thread's function reads beside its mutexes"
    for callee in dict.fromkeys(tree.image.code.calls(code, node.ctl)):
        target = _passed_global(tree.image, callee)
        if target is not None and not any(m <= target < m + layout.mutex_size for m in mutexes):
            return target, ("the global the first small function background_thread's function calls passes on "
                            f"(unoptimised code: background_thread_enabled at {callee:#x})")
    return None, "not determined: background_thread's function reads no byte beside its mutexes"


#: the most bytes of a function that only passes a global on (unoptimised code's background_thread_enabled)
_PASSES_SPAN = 48


def _passed_global(image: ElfImage, start: int) -> int | None:
    """The one global of IMAGE's writable data a small unoptimised function at START hands to the function it
    calls (an inline function compiled apart: the global's address computed as a call's first argument, an atomic load), or None."""
    if not image.contains(start):
        return None
    try:
        code = image.mem.read(start, _PASSES_SPAN)
    except ReadError:
        return None
    end = image.code.frame_body(code)
    if end is None:
        return None
    writable = [(seg.address, seg.address + seg.memsz) for seg in image.writable()]
    targets = [r.target for r in image.through_slots(image.code.address_refs(code[:end], start))
               if r.computes and r.argument == 0
               and image.code.call_at(code, r.end) and any(lo <= r.target < hi for lo, hi in writable)]
    return targets[0] if len(targets) == 1 else None
