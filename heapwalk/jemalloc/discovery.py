"""Finding jemalloc's state in a target without debug symbols: the object that holds it, its version and
build, the arena array and its length, the TLS offset of each thread's tsd, the radix tree of extents.

- the object (`heapwalk.jemalloc.find`): the one that exports jemalloc's entry points under some prefix, or
  whose read-only data holds jemalloc's messages;
- mallctl's tree (`heapwalk.jemalloc.mallctl`): found in its data, it leads to the code below without
  symbols; its ``config.*`` and ``arenas.nbins`` functions say how the build was configured;
- the version: the string ``version``'s function computes, else the one in the read-only data
  ("5.3.0-0-g<commit>", "5.2.1-0-g0");
- ``arenas``: loaded by ``arenas.lookup``'s function (or by the atexit hook after an exported
  ``malloc_stats_print``, which also reads ``narenas_total``), else found in the object's data as the array
  whose first slot holds an arena;
- the radix tree of extents: the tree ``arenas.lookup`` (or an exported ``malloc_usable_size``) hands to the
  lookup of a pointer's extent (its second argument);
- the tsd: a shared object's one initial-exec TLS relocation (a TPOFF64 relocation against no symbol) is the GOT
  slot that holds the TLS block's offset from each thread's thread pointer; otherwise (jemalloc linked into
  the program) the offset is what separates the tsds whose thread caches the arenas list from the threads'
  thread pointers.

Each fact is checked against memory (an arena shows the version's layout; the TLS offset lands on tsds),
and recorded with how it was found.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from heapwalk.arch import DEFAULT, Architecture
from heapwalk.common.findings import Fact
from heapwalk.jemalloc.arenaarray import CONTAINER_STATES, arena_array, container_states
from heapwalk.jemalloc.background import background_state
from heapwalk.jemalloc.find import JemallocImage, JemallocNotFound, find_jemalloc
from heapwalk.jemalloc.rtree import COMPACT_48, LEAF_SHIFTS, RtreeShape, shape_for, shape_keyed_by
from heapwalk.jemalloc.tsdoffset import static_module_offset, tsd_module, tsd_offset
from heapwalk.jemalloc.layout import (LAYOUTS, PROF_LAYOUTS, JeLayout, UnsupportedJemalloc, layout_for,
                                      quantum_of, quantum_phrase)
from heapwalk.jemalloc.mallctl import MallctlTree, TreeNotFound, cstring
from heapwalk.jemalloc.opt import OptionsNotFound, read_opts
from heapwalk.inferior.elf import ElfImage, Mapping, readable_runs
from heapwalk.inferior.memory import Memory, ReadError, u64

__all__ = ["JeDiscovery", "JemallocNotFound", "discover_jemalloc", "container_states", "CONTAINER_STATES"]

_VERSION = re.compile(rb"(\d+)\.(\d+)\.(\d+)-\d+-g[0-9a-f]{1,40}\0")
_HOOK_SPAN = 0x600      # bytes of a function searched for its loads
_CTL_SPAN = 0x80        # bytes of a small ctl function
_CONSTANT_SPAN = 0x100  # bytes of a ctl function that stores a constant, to its end when unoptimised


@dataclass(frozen=True)
class JeDiscovery:
    """What heapwalk needs to decode jemalloc, with how each part was found."""

    version: tuple[int, int, int]
    version_text: str               # the library's own string, "5.3.0-0-g54eaed1d..."
    layout: JeLayout
    library: str
    base: int
    arenas: int                     # address of arenas[]
    narenas_total: int              # how many slots of arenas[] to read (narenas_total, or the last arena's + 1)
    tsd_tpoff: int | None           # the tsd's offset from a thread's thread pointer (None: unknown)
    facts: tuple[Fact, ...] = field(default=())
    opt: dict = field(default_factory=dict)     # the run-time options by mallctl name (empty: not found)
    rtree: int | None = None        # the radix tree of extents (None: not found)
    unread: tuple[tuple[int, str], ...] = ()    # (address, what) of what was found but cannot be read
    prefix: str | None = None       # the prefix of its exported entry points ("", "je_"...; None: exports none)
    build: dict = field(default_factory=dict)   # how it was configured, as far as mallctl shows (config.*)
    background_state: int | None = None     # the byte that says whether background threads run now (None: unknown)
    rtree_shape: RtreeShape = COMPACT_48    # the radix tree's levels and leaf entries (the build's address width)
    conf_variable: str = "MALLOC_CONF"      # the environment variable the build reads its options from
    tsd_module: int | None = None   # a dlopened library's TLS module id: each thread's tsd is its block of it
    arch: Architecture = DEFAULT    # the architecture of its code (where each thread keeps its TLS)

    @property
    def statistics(self) -> bool:
        """Whether the build keeps statistics (config.stats; assumed when mallctl does not say)."""
        return self.build.get("stats") is not False


def discover_jemalloc(mem: Memory, mappings: list[Mapping], thread_pointers: Sequence[int] = (),
                      found: JemallocImage | None = None) -> JeDiscovery:
    """Locates jemalloc's version, arenas[], narenas_total, the tsd's TLS offset (from the threads' thread
    pointers THREAD_POINTERS when jemalloc is linked into the program), its options and its radix tree
    (JemallocNotFound, in words a user understands, when the target does not map jemalloc, or when heapwalk
    cannot decode the build it maps)."""
    found = found or find_jemalloc(mem, mappings)
    if found is None:
        raise JemallocNotFound("no mapped object holds jemalloc")
    image, path, base = found.image, found.path, found.base
    facts = [Fact("jemalloc", {"base": base, "path": path, "prefix": found.prefix}, found.how)]
    tree, how = _tree(image)
    facts.append(Fact("mallctl", tree.address if tree else None, how))
    version, text, where = _version(image, tree)
    facts.append(Fact("jemalloc_version", text, where))
    build = _build(tree)
    facts.append(Fact("build", build or None, "the constants of mallctl's config.*, arenas.nbins and arenas.page"
                      if build else "not determined: no mallctl tree"))
    name = f"jemalloc {text.split('-')[0]} (in {path})"
    layout = _layout(name, version, build, image.arch)
    arenas, count, narenas, how = arena_array(mem, found, tree, layout)
    facts += [Fact("arenas", arenas, how), Fact("narenas_total", narenas, how)]
    _check_layout(mem, layout, arenas, count, name)
    tpoff, module, tls_facts, unread = _tsd_place(mem, image, layout, arenas, count, thread_pointers)
    facts += tls_facts
    opt, how, lost = _options(image, tree, version)
    facts.append(Fact("opt", len(opt) or None, how))
    rtree, shape, how = _rtree(found, tree, layout)
    facts.append(Fact("rtree", rtree, how))
    if build.get("stats") is False and rtree is None:
        raise JemallocNotFound(f"{name} is built without statistics (--disable-stats, as tikv-jemallocator builds "
                               f"it by default) and its radix tree of extents was not found, so nothing of its "
                               f"memory can be counted ({how.replace('not determined: ', '')})")
    background, how = background_state(tree, layout)
    facts.append(Fact("background_thread", background, how))
    variable, how = _conf_variable(image, found.prefix)
    facts.append(Fact("conf_variable", variable, how))
    return JeDiscovery(version, text, layout, path, base, arenas, count, tpoff, tuple(facts), opt, rtree,
                       tuple(unread + lost), found.prefix, build, background, shape, variable, module, image.arch)


def _tsd_place(mem: Memory, image: ElfImage, layout: JeLayout, arenas: int, count: int, thread_pointers: list[int]
               ) -> tuple[int | None, int | None, list[Fact], list[tuple[int, str]]]:
    """Where each thread's tsd is: (its offset from the thread pointer, or the TLS module whose block it is in
    each thread, the facts that say how, what was unreadable).  A library whose TLS is reached through a module
    id (built --disable-initial-exec-tls) is placed by its module's entry in each thread's DTV: at one offset
    when its TLS is static (loaded at start), per thread when it was loaded with dlopen."""
    if not image.is_program:
        module, how = tsd_module(mem, image, layout)
        if module is not None:
            offset = static_module_offset(mem, module, [fs for fs in thread_pointers if fs], image.arch)
            if offset is not None:
                return offset, None, [Fact("tsd_tls_offset", offset, f"{how}, at one offset from every thread "
                                           "pointer (its library's TLS is in the static TLS block)")], []
            return None, module, [Fact("tsd_tls_offset", None, "not determined: its TLS is apart in each thread "
                                       "(a library loaded with dlopen)"), Fact("tsd_tls_module", module, how)], []
    tpoff, how, unread = tsd_offset(mem, image, layout, arenas, count, thread_pointers)
    facts = [Fact("tsd_tls_offset", tpoff, how)]
    if tpoff is None and not image.is_program:
        facts.append(Fact("tsd_tls_module", None, "not determined: no one module-id slot for a TLS block the size "
                          "of the tsd"))
    return tpoff, None, facts, unread


def _layout(name: str, version: tuple[int, int, int], build: dict[str, bool | int], arch: Architecture = DEFAULT
            ) -> JeLayout:
    """The layout of NAME, of VERSION built as BUILD says for ARCH, whose pthread_mutex_t jemalloc's mutexes
    embed (JemallocNotFound, in a user's words, when heapwalk has none)."""
    mutex_size = arch.mutex_size
    nbins = int(build.get("nbins", 36))
    lg_page = int(build.get("page", 4096)).bit_length() - 1
    pages = "" if lg_page == 12 else f" and {1 << (lg_page - 10)} KiB pages"
    known = ", ".join(layout.name.split(" ", 1)[1] for layout in LAYOUTS.values())
    quantum = quantum_of(nbins, lg_page)
    if quantum is None:
        raise JemallocNotFound(f"{name} is built with {nbins} small size classes{pages}: heapwalk does not decode "
                               f"that build yet (it knows {known})")
    debug, prof = bool(build.get("debug")), bool(build.get("prof"))
    try:
        return layout_for(version, quantum, debug, prof, lg_page, mutex_size)
    except UnsupportedJemalloc:
        traits = ["--enable-debug"] if debug else []
        if quantum != 4:
            traits.append(f"{quantum_phrase(quantum)} ({nbins} small size classes)")
        if lg_page != 12:
            traits.append(f"{1 << (lg_page - 10)} KiB pages")
        if mutex_size != 40:
            traits.append(f"{arch.name}'s {mutex_size}-byte mutexes")
        if prof and tuple(version) in PROF_LAYOUTS:
            traits.append("--enable-prof")
        if traits:
            raise JemallocNotFound(f"{name} is built with {' and '.join(traits)}: heapwalk does not decode that "
                                   f"build yet (it knows {known})") from None
        raise JemallocNotFound(f"{name} is a build heapwalk does not decode yet (it knows {known})") from None


_CONF = re.compile(rb"(?<=\0)([A-Z0-9_]*MALLOC_CONF)\0")


def _conf_variable(image: ElfImage, prefix: str | None) -> tuple[str, str]:
    """The environment variable the build reads its options from (MALLOC_CONF under its prefix: Redis's
    JE_MALLOC_CONF, tikv-jemallocator's _RJEM_MALLOC_CONF), and how it was found: the name among the image's
    strings, the one its exported prefix gives when there are several."""
    names: list[str] = []
    for seg in image.readonly_data() or image.readonly():
        for _start, data in readable_runs(image.mem, seg.address, seg.filesz):
            names += [m.decode() for m in _CONF.findall(bytes(data))]
    expected = None if prefix is None else prefix.upper() + "MALLOC_CONF"
    if expected is not None and (expected in names or not names):
        return expected, f"the prefix of its exported entry points ({prefix or 'none'})"
    if names:
        return names[0], "the variable's name among its strings"
    return "MALLOC_CONF", "not found among its strings: jemalloc's default name"


def _tree(image: ElfImage) -> tuple[MallctlTree | None, str]:
    """mallctl's tree and how it was found (None, and why, when it was not)."""
    try:
        tree = MallctlTree.find(image)
    except TreeNotFound as exc:
        return None, f"not determined: {exc}"
    except ReadError as exc:
        return None, f"not determined: {exc}"
    return tree, f"{len(tree.top)} top-level nodes around the node named \"opt\""


#: what a build's ``config.*`` constants and ``arenas.nbins`` are read as
_BUILD_FLAGS = ("debug", "stats", "prof", "fill", "lazy_lock")


def _build(tree: MallctlTree | None) -> dict[str, bool | int]:
    """How the build was configured, as far as its mallctl functions show: ``config.<flag>`` (bool) and
    ``nbins``, the number of small size classes (36 with a 16-byte quantum and 4 KiB pages), and ``page``, the
    page it was built for (``arenas.page``)."""
    if tree is None:
        return {}
    out: dict[str, bool | int] = {}
    wanted = [(f"config.{flag}", flag, lambda v: v in (0, 1), bool) for flag in _BUILD_FLAGS] + \
        [("arenas.nbins", "nbins", lambda v: 0 < v < 256, int),
         ("arenas.page", "page", lambda v: v in (1 << 12, 1 << 14, 1 << 16), int)]
    for dotted, key, sane, kind in wanted:
        node = tree.node(dotted)
        if node is None or not node.ctl:
            continue
        try:
            value = tree.image.code.stored_constant(_code(tree.image.mem, node.ctl, _CONSTANT_SPAN))
        except ReadError:
            continue
        if value is not None and sane(value):
            out[key] = kind(value)
    return out


def _code(mem: Memory, start: int, span: int) -> bytes:
    """SPAN bytes of code from START, fewer where the mapping ends first."""
    try:
        return mem.read(start, span)
    except ReadError:
        return mem.read(start, _CTL_SPAN)


def _rtree(found: JemallocImage, tree: MallctlTree | None, layout: JeLayout) -> tuple[int | None, RtreeShape, str]:
    """The radix tree of extents: the tree that arenas.lookup (or an exported malloc_usable_size) passes to
    the lookup of a pointer's extent, an address into the image's writable data computed as a call's second argument, in the function
    or (a debug build, which inlines less) in one it calls; the first whose root holds only readable nodes."""
    places = []
    end = found.image.arch.user_space_end
    usual = shape_for(48, layout.classes.lg_page, end)
    node = tree.node("arenas.lookup") if tree is not None else None
    if node is not None and node.ctl:
        places.append((node.ctl, "arenas.lookup's function"))
    start = found.entry("malloc_usable_size")
    if start is not None:
        places.append((start, f"{found.prefix}malloc_usable_size"))
    if not places:
        return None, usual, "not determined: neither arenas.lookup's function nor malloc_usable_size was found"
    said = []
    for start, what in places:
        try:
            code = found.image.mem.read(start, _HOOK_SPAN)
        except ReadError as exc:
            said.append(f"{what} is unreadable ({exc.reason})")
            continue
        shift = found.image.code.first_shift_right(code)
        shape = usual if shift is None else shape_keyed_by(shift, layout.classes.lg_page, end)
        if shape is None:
            return None, usual, f"not decoded: the build's radix tree keys its leaves by address >> {shift}, a " \
                                f"shape heapwalk does not read yet (with 4 KiB pages it reads >> " \
                                f"{LEAF_SHIFTS[0]}, 48-bit builds, and >> {LEAF_SHIFTS[1]}, builds for 57-bit " \
                                f"addresses)"
        levels = f"{_COUNTS.get(len(shape.levels), len(shape.levels))} levels " \
                 f"({shape.page_bits + sum(shape.levels)}-bit addresses)"
        for target, at in _tree_candidates(found.image, code, start):
            if _plausible_tree(found.image.mem, layout, shape, target):
                return target, shape, f"the lookup's tree in {what} (code at {at:#x}), {levels}"
        said.append(f"no address {what} (or a function it calls) hands on as a second argument leads to a "
                    "radix tree")
    return None, usual, "not determined: " + "; ".join(said)


_COUNTS = {1: "one", 2: "two", 3: "three"}
_CALLEES = 12           # calls of a function followed to find its tree
def _tree_candidates(image: ElfImage, code: bytes, start: int) -> list[tuple[int, int]]:
    """(target, where) of each address into IMAGE's writable data that CODE (at START) computes as a call's
    second argument (directly, or as unoptimised code does, through a register copied into it), then the same
    in the functions it calls."""
    writable = [(seg.address, seg.address + seg.memsz) for seg in image.writable()]

    def leas(block: bytes, at: int) -> list[tuple[int, int]]:
        return [(r.target, at + r.offset) for r in image.through_slots(image.code.address_refs(block, at))
                if r.computes
                and r.argument == 1 and any(lo <= r.target < hi for lo, hi in writable)]

    out = leas(code, start)
    for callee in dict.fromkeys(image.code.calls(code, start)).keys():
        if len(out) > 4 * _CALLEES or not image.contains(callee):
            continue
        try:
            out += leas(image.mem.read(callee, _HOOK_SPAN), callee)
        except ReadError:
            continue
    return out


def _plausible_tree(mem: Memory, layout: JeLayout, shape: RtreeShape, rtree: int) -> bool:
    """Whether RTREE's root (of SHAPE) is readable and holds at least one node, each one readable."""
    try:
        words = struct.unpack(f"<{1 << shape.levels[0]}Q", mem.read(rtree + layout.rtree_root,
                                                                    8 << shape.levels[0]))
    except ReadError:
        return False
    nodes = [w for w in words if w]
    if not 0 < len(nodes) <= 1 << 12 or any(w & 7 for w in nodes):
        return False
    try:
        for w in nodes[:16]:
            mem.read(w, 8)
    except ReadError:
        return False
    return True


def _options(image: ElfImage, tree: MallctlTree | None, version: tuple[int, int, int]
             ) -> tuple[dict, str, list[tuple[int, str]]]:
    """The options, how they were found, and what of them is unreadable; none, and why, when mallctl's table
    cannot be found or read."""
    if tree is None:
        return {}, "not determined: no mallctl tree", []
    try:
        return read_opts(image, tree, version)
    except OptionsNotFound as exc:
        return {}, f"not determined: {exc}", []
    except ReadError as exc:
        return {}, f"not determined: {exc}", [(exc.address, f"mallctl's table of options is unreadable ({exc.reason})")]


def _version(image: ElfImage, tree: MallctlTree | None) -> tuple[tuple[int, int, int], str, str]:
    """The version, its string and how it was found: the string mallctl's "version" returns, else the first
    version string of the image's read-only data."""
    node = tree.node("version") if tree is not None else None
    if node is not None and node.ctl:
        try:
            leas = [r.target for r in image.code.address_refs(image.mem.read(node.ctl, _CTL_SPAN), node.ctl)
                    if r.computes]
            for at in leas:
                text = cstring(image, at, 128)
                m = _VERSION.match(text.encode() + b"\0")
                if m:
                    return (int(m[1]), int(m[2]), int(m[3])), text, f"the string mallctl's version returns, at {at:#x}"
        except (ReadError, ValueError):
            pass
    for seg in image.readonly_data() or image.readonly():
        for start, data in readable_runs(image.mem, seg.address, seg.filesz):
            m = _VERSION.search(bytes(data))
            if m:
                return (int(m[1]), int(m[2]), int(m[3])), m[0][:-1].decode(), \
                    f"version string in the read-only data at {start + m.start():#x}"
    raise JemallocNotFound(f"jemalloc (in {image.path}) shows no version string in its read-only data "
                           f"(is the file at hand?)")


def _check_layout(mem: Memory, layout: JeLayout, arenas: int, count: int, name: str) -> None:
    """One of the first arenas in arenas[] shows LAYOUT: its dirty, muzzy and retained containers' states read
    1, 2, 3 (arena 0 normally; a later one when arena 0 is damaged, which the decoder then reports)."""
    said = []
    for index in range(min(count, 8)):
        try:
            arena = u64(mem, arenas + 8 * index)
            if not arena:
                continue
            states = container_states(mem, layout, arena)
        except ReadError as exc:
            said.append(f"arena {index} is unreadable ({exc.reason})")
            continue
        if states == CONTAINER_STATES:
            return
        said.append(f"arena {index} ({arena:#x}) has extent containers whose states read {states}, not "
                    f"{list(CONTAINER_STATES)}")
    raise JemallocNotFound(f"no arena of {name} shows the layout heapwalk knows for {layout.name}: "
                           + "; ".join(said or ["arenas[] is empty"]))



