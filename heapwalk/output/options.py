"""The options of the report that gdb's `heapwalk report` and the command line's `heapwalk report` and
`heapwalk capture` both take: one spec, so that their names and help never drift apart."""

from __future__ import annotations

import argparse

from heapwalk.analysis import sizing

__all__ = ["add_report_files", "add_no_leaks"]


def add_report_files(parser: argparse.ArgumentParser, xml_help: str, path=str) -> None:
    """--json, --xml and --html FILE: the report's documents besides its text (PATH: the type of FILE; XML_HELP:
    which allocators write XML statistics, `registry.xml_help`)."""
    parser.add_argument("--json", type=path, metavar="FILE", help="also write the report as JSON (schema: "
                        "docs/json.md)")
    parser.add_argument("--xml", type=path, metavar="FILE", help=xml_help)
    parser.add_argument("--html", type=path, metavar="FILE", help="also write the report as one self-contained "
                        "HTML page (heap maps and charts inline) to attach to a ticket")


def cost_epilog() -> str:
    """What a report costs, for its help (`analysis.sizing`'s rates, measured by `make bench`)."""
    seconds, per_gib = sizing.RATES["report"]
    return (f"Cost: about {seconds:g} s and {per_gib >> 20} MiB of gdb's memory per GiB of heap of some 200-byte "
            "chunks, as `make bench` measured on 2 CPUs (docs/performance.md: smaller chunks cost more; bins and "
            "check less). Before a heap of a GiB or more heapwalk says what it expects, and it refuses a command "
            "this machine has not the memory for, naming what needs less ('set heapwalk memory-check off' in gdb, or "
            "the command line's --no-memory-check, runs it anyway).")


def add_memory_check(parser: argparse.ArgumentParser) -> None:
    """--no-memory-check: the command run even where this machine has not the memory heapwalk expects."""
    parser.add_argument("--no-memory-check", action="store_true", help="run it even when this machine has less "
                        "memory than heapwalk expects it to need (it may then be killed for want of memory)")


def add_no_leaks(parser: argparse.ArgumentParser) -> None:
    """--no-leaks: the report without its leak scan."""
    parser.add_argument("--no-leaks", action="store_true", help="skip the leak scan and the tables of in-use "
                        "chunks (faster on big heaps; with 'capture --live', a shorter stop): the verdict then "
                        "cannot tell live data from a leak")
