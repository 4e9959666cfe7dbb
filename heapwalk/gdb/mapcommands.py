"""gdb command ``heapwalk map``: each heap of each arena as a strip, address left to right, coloured by what
holds each byte (`glibc.heapmap` cuts the heaps into runs, `output.heapmaps` draws them)."""

from __future__ import annotations

from heapwalk.gdb.console import console_with_header, interactive
from heapwalk.gdb.session import UserError, load_allocators
from heapwalk.gdb.subcommand import Parser, Subcommand
from heapwalk.glibc.heapmap import heap_strips
from heapwalk.output.heapmaps import svg_maps, text_maps

__all__ = ["MapCommand", "TEXT_WIDTH", "SVG_WIDTH"]

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
                   "--reserved its reservation never mapped). A column mostly free that holds chunks in use too is marked: "
                   "those chunks pin the free memory around them.")
        p.add_argument("--width", metavar="N", type=int, default=0,
                       help=f"columns per strip (default: the terminal's width, {TEXT_WIDTH} in a log)")
        p.add_argument("--reserved", action="store_true", help="draw each thread heap's whole reservation "
                       "(by default a strip ends where the heap's writable memory ends)")
        p.add_argument("--svg", metavar="FILE", help=f"also write the maps as SVG ({SVG_WIDTH} columns a strip, "
                       "each a stack of the kinds it holds)")
        return p

    def run(self, args) -> None:
        if args.width < 0:
            raise UserError("heapwalk map: --width must be positive")
        found = load_allocators(walk_chunks=True)   # walked: a non-contiguous main arena's pieces are found
        if not found.glibc:
            raise UserError("heapwalk map: only glibc's heaps are drawn so far; this process allocates with "
                            "jemalloc")
        state, mem, layout = found.glibc
        strips = heap_strips(mem, layout, state, args.reserved)
        console = console_with_header(state)
        width = args.width or (max(20, console.width - 2) if interactive() else TEXT_WIDTH)
        console.print(text_maps(strips, width, interactive()), end="")
        if args.svg:
            with open(args.svg, "w", encoding="utf-8") as fh:
                fh.write(svg_maps(strips, SVG_WIDTH, f"heap map: {state.target}"))
