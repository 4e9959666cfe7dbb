"""gdb command ``heapwalk map``: each heap of each arena as a strip, address left to right, coloured by what
holds each byte (`glibc.heapmap` cuts the heaps into runs, `output.heapmaps` draws them); and the HTML page
'heapwalk report --html' writes, with those maps in it (`output.htmlreport`)."""

from __future__ import annotations


from heapwalk.gdb.console import console_with_header, gdb_console, interactive
from heapwalk.gdb.leakcommands import scan_leaks
from heapwalk.gdb.session import UserError, load_allocators
from heapwalk.gdb.subcommand import Parser, Subcommand
from heapwalk.glibc.heapmap import heap_strips
from heapwalk.jemalloc.heapmap import extent_strips
from heapwalk.output.heapmaps import svg_maps, text_maps
from heapwalk.output.htmlpage import made_by
from heapwalk.output.htmlreport import report_html
from heapwalk.output.pngmaps import png_maps

__all__ = ["MapCommand", "TEXT_WIDTH", "SVG_WIDTH", "write_report_html"]

#: columns of a strip in a log (a terminal's strips take its width)
TEXT_WIDTH = 100
#: columns of a strip in an SVG
SVG_WIDTH = 1024


class MapCommand(Subcommand):
    name = "map"

    def make_parser(self):
        p = Parser(prog="heapwalk map", description="Each heap of each arena as a strip, address left to right, "
                   "each column shown by what holds most of its bytes: in use, tcache, fastbin, unsorted, small, "
                   "large, top, the tcache struct, headers, a thread heap's mapped but unused tail (and with "
                   "--reserved its reservation never mapped); under each strip what malloc_trim(0) would give back "
                   "and, where the target says, the resident pages. A column mostly free that holds chunks in use "
                   "too is marked: those chunks pin the free memory around them. For jemalloc, each arena's "
                   "extents: in use, free regions in slabs, dirty, muzzy and retained pages.")
        p.add_argument("--width", metavar="N", type=int, default=0,
                       help=f"columns per strip (default: the terminal's width, {TEXT_WIDTH} in a log)")
        p.add_argument("--reserved", action="store_true", help="draw each thread heap's whole reservation "
                       "(by default a strip ends where the heap's writable memory ends)")
        p.add_argument("--svg", metavar="FILE", help=f"also write the maps as SVG ({SVG_WIDTH} columns a strip, "
                       "each a stack of the kinds it holds)")
        p.add_argument("--png", metavar="FILE", help=f"also write the maps as a PNG picture ({SVG_WIDTH} pixels a "
                       "strip)")
        p.add_argument("--leaks", action="store_true", help="also run the leak scan ('heapwalk leaks') and mark "
                       "the chunks in use that nothing reaches as leaked")
        return p

    def run(self, args) -> None:
        if args.width < 0:
            raise UserError("heapwalk map: --width must be positive")
        # walked: a non-contiguous main arena's pieces are found; kept: the strips' chunks (and the leak scan's)
        found = load_allocators(walk_chunks=True, keep_chunks=True, keep_used=args.leaks)
        je = found.jemalloc
        strips = jemalloc_strips(je) if je is not None and (je.extents is not None or not found.glibc) else []
        if found.glibc:
            state, mem, layout = found.glibc
            leaked = scan_leaks(found).leaked_chunks() if args.leaks else None
            strips = heap_strips(mem, layout, state, args.reserved, leaked) + strips
            console = console_with_header(state)
            if je is not None and je.extents is None:
                console.print("jemalloc's extents are not drawn: its radix tree of extents was not found")
        else:
            console = gdb_console()
            console.print(f"{found.jemalloc.target}\njemalloc {found.jemalloc.version}" if found.jemalloc.target
                          else f"jemalloc {found.jemalloc.version}")
        width = args.width or (max(20, console.width - 2) if interactive() else TEXT_WIDTH)
        console.print(text_maps(strips, width, interactive()), end="")
        title = f"heap map: {(found.jemalloc or found.glibc[0]).target}"
        if args.svg:
            _write(args.svg, svg_maps(strips, SVG_WIDTH, title).encode())
        if args.png:
            _write(args.png, png_maps(strips, SVG_WIDTH))


def jemalloc_strips(state) -> list:
    """The strips of jemalloc's extents (none without jemalloc); UserError when its radix tree was not found."""
    if state is None:
        return []
    if state.extents is None:
        raise UserError("heapwalk map: jemalloc's radix tree of extents was not found, so its extents cannot be "
                        "drawn (its statistics are in 'heapwalk report')")
    return extent_strips(state.extents, state.residency)


def _write(path: str, data: bytes, command: str = "heapwalk map") -> None:
    """DATA written to PATH, or a one-line error that says why not."""
    try:
        with open(path, "wb") as fh:
            fh.write(data)
    except OSError as exc:
        raise UserError(f"{command}: cannot write {path}: {exc.strerror}") from None


def write_report_html(path: str, glibc, doc: dict, console, beside: dict | None = None, both: str = "",
                      jemalloc=None, leaked=None) -> None:
    """Writes to PATH the report page of the report document DOC, with the heap maps of GLIBC (state, memory,
    layout; None for jemalloc's), the chunks at LEAKED (the leak scan's, when it ran) marked leaked, and
    JEMALLOC's extents (its state, or None) and, for a process with both allocators, jemalloc's document
    BESIDE with the sentence BOTH; and says where on CONSOLE."""
    strips = heap_strips(glibc[1], glibc[2], glibc[0], leaked=leaked) if glibc else []
    je_strips = jemalloc_strips(jemalloc) if jemalloc is not None and jemalloc.extents is not None else []
    if glibc is None:
        strips, je_strips = je_strips, []
    page = report_html(doc, strips, made_by("heapwalk report --html", doc.get("target") or ""), beside, both,
                       je_strips)
    _write(path, page.encode(), "heapwalk report")
    console.print(f"\nthe report as a page: {path}")
