"""gdb command ``heapwalk map``: each heap of each arena as a strip, address left to right, coloured by what
holds each byte (each allocator cuts its heaps into runs, `output.heapmaps` draws them); and the HTML page
'heapwalk report --html' writes, with those maps in it (`output.htmlreport`)."""

from __future__ import annotations

from collections.abc import Iterable

from heapwalk.face import CannotDraw
from heapwalk.gdb.console import console_with_header, interactive
from heapwalk.gdb.leakcommands import scan_leaks
from heapwalk.gdb.session import UserError, load_allocators
from heapwalk.registry import described
from heapwalk.gdb.subcommand import Parser, Subcommand
from heapwalk.output.heapmaps import svg_map_parts, text_maps
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
        p = Parser(prog="heapwalk map", description=described(
            "Each heap of each arena as a strip, address left to right, coloured by what holds each byte, and "
            "under each strip, where the target says, the resident pages", "map"))
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
        strips, notes = [], []
        for decoded in found.decoded:
            leaked = scan_leaks(found, decoded).leaked_chunks() if args.leaks and decoded.scans_leaks else None
            try:
                strips += decoded.strips(args.reserved, leaked)
            except CannotDraw as exc:
                if len(found.decoded) == 1:
                    raise UserError(f"heapwalk map: {exc}") from None
                notes.append(f"{exc}")
        console = console_with_header(found.decoded[0])
        for other in found.decoded[1:]:
            console_with_header(other, found.decoded[0])
        for note in notes:
            console.print(note)
        width = args.width or (max(20, console.width - 2) if interactive() else TEXT_WIDTH)
        console.print(text_maps(strips, width, interactive()), end="")
        title = f"heap map: {found.decoded[0].target}"
        if args.svg:
            _write(args.svg, (part.encode() for part in svg_map_parts(strips, SVG_WIDTH, title)))
        if args.png:
            _write(args.png, png_maps(strips, SVG_WIDTH))


def _write(path: str, data: bytes | Iterable[bytes], command: str = "heapwalk map") -> None:
    """DATA (or its parts, each written as it is made) written to PATH, or a one-line error that says why not."""
    try:
        with open(path, "wb") as fh:
            for part in [data] if isinstance(data, bytes) else data:
                fh.write(part)
    except OSError as exc:
        raise UserError(f"{command}: cannot write {path}: {exc.strerror}") from None


def write_report_html(path: str, pages, console, both: str = "") -> None:
    """Writes to PATH the report page of PAGES, each allocator's (decoded, report document, leaked blocks or
    None), the program's allocator first, with BOTH the sentence of what each holds; and says where on
    CONSOLE."""
    bodies = []
    for decoded, doc, leaked in pages:
        try:
            strips = decoded.strips(leaked=leaked)
        except CannotDraw:
            strips = []
        bodies.append((decoded, doc, decoded.html(doc, strips)))
    (first, doc, sections), *rest = bodies
    beside = [(f"{d.title}, in use beside {first.title}", d.name, parts) for d, _, parts in rest]
    if rest:
        both = f"{both} {first.title} comes first, then {', '.join(d.title for d, _, _ in rest)}."
    page = report_html(doc, first.html_header(doc), sections,
                       made_by("heapwalk report --html", doc.get("target") or ""), beside, both)
    _write(path, page.encode(), "heapwalk report")
    console.print(f"\nthe report as a page: {path}")
