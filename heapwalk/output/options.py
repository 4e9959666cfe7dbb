"""The options of the report that gdb's `heapwalk report` and the command line's `heapwalk report` and
`heapwalk capture` both take: one spec, so that their names and help never drift apart."""

from __future__ import annotations

import argparse

__all__ = ["add_report_files", "add_no_leaks"]


def add_report_files(parser: argparse.ArgumentParser, xml_help: str, path=str) -> None:
    """--json, --xml and --html FILE: the report's documents besides its text (PATH: the type of FILE; XML_HELP:
    which allocators write XML statistics, `registry.xml_help`)."""
    parser.add_argument("--json", type=path, metavar="FILE", help="also write the report as JSON (schema: "
                        "docs/json.md)")
    parser.add_argument("--xml", type=path, metavar="FILE", help=xml_help)
    parser.add_argument("--html", type=path, metavar="FILE", help="also write the report as one self-contained "
                        "HTML page (heap maps and charts inline) to attach to a ticket")


def add_no_leaks(parser: argparse.ArgumentParser) -> None:
    """--no-leaks: the report without its leak scan."""
    parser.add_argument("--no-leaks", action="store_true", help="skip the leak scan and the tables of in-use "
                        "chunks (faster on big heaps; with 'capture --live', a shorter stop): the verdict then "
                        "cannot tell live data from a leak")
