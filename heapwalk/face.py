"""The one face every allocator shows heapwalk's front ends: `Allocator` finds and decodes it in a target,
`Decoded` is what was decoded, and says everything a command prints or writes about it, in the allocator's
own words.  The gdb commands, the command line and `heapwalk diff` loop over the decoded allocators of a
target (`heapwalk.registry` lists the allocators); none of them names one.

A new allocator is a folder with a subclass of each (docs/architecture.md lists what it provides), and one
line in the registry.  What a `Decoded` does not override has a plain default: no thread table, no checks,
no leak scan, no heap map.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text

from heapwalk.analysis.inuse import InUse, LeakTotals
from heapwalk.analysis.report import Report, build_report, human
from heapwalk.common.errors import HeapwalkError, UsageError
from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.output import htmlreport, tables
from heapwalk.output.htmlpage import e as escape
from heapwalk.output.jsondoc import SCHEMA_VERSION, report_json
from heapwalk.output.reporttext import arena_table, plain_lines, report_group
from heapwalk.common.view import Blocks, HeapStrip, HeapView, Words

__all__ = ["Allocator", "Checked", "Decoded", "NotUsed", "NotMine", "CannotDraw", "Setting", "Shown", "Verb", "Wants",
           "Context"]


class NotUsed(HeapwalkError):
    """The allocator is not in the target, or holds nothing there: there is nothing to say of it."""


class CannotDraw(HeapwalkError):
    """The allocator's heaps cannot be drawn; the message says why."""


@dataclass(frozen=True)
class Wants:
    """What a command needs decoded: every piece walked (figures by kind), the blocks in use kept for the
    leak scan, every piece kept for the heap maps; PROGRESS hears a long walk (done, total)."""

    walk: bool = False
    keep_used: bool = False
    keep_all: bool = False
    progress: Callable[[int, int], None] | None = None
    keep_pages: bool = False     # which pages the walk read hold anything, for a plain core's contents


@dataclass(frozen=True)
class Setting:
    """A setting the user may give an allocator's decoder (``set heapwalk NAME VALUE`` in gdb): its name and
    what it overrides."""

    name: str
    what: str
    value: str = "VALUE"       # what its value looks like, for the help ("X.Y", "ADDRESS")


@dataclass(frozen=True)
class Context:
    """What an allocator is decoded from: the target as the debugger shows it, what the command WANTS, the
    SETTINGS the user gave (name -> text, empty when not given), EVALUATE (an expression of the debugger's
    -> an address), the allocators decoded before it (BESIDE) and the names of those looked for before it
    that are there but could not be decoded (FAILED); OTHER_LIBC: one of those is a C library's own malloc."""

    target: Any
    wants: Wants = Wants()
    settings: Mapping[str, str] = field(default_factory=dict)
    evaluate: Callable[[str], int] = lambda text: int(text, 0)
    beside: tuple["Decoded", ...] = ()
    failed: tuple[str, ...] = ()
    other_libc: bool = False      # a C library's own malloc was found before it (decoded, or there and not decodable)


@dataclass
class Shown:
    """What a command prints of one allocator (rich renderables, after its header) and the JSON it writes."""

    parts: list
    document: dict | None = None


@dataclass
class Checked:
    """'heapwalk check' of one allocator: what it prints, how many errors and warnings, its JSON."""

    parts: list
    errors: int
    warnings: int
    document: dict | None = None


class NotMine(UsageError):
    """What a command of several allocators raises when what it was asked about (an address) is not this
    allocator's: the next allocator that has the command is asked."""


@dataclass(frozen=True)
class Verb:
    """A command only some allocators have (glibc's 'bins', 'tcache', 'chunks', 'chunk'): its name, a
    one-line summary for 'help heapwalk', how it reads its arguments (PARSER(parser) adds them), and RUN
    (decoded, arguments, front) -> None, which prints through FRONT (`Front`)."""

    name: str
    summary: str
    description: str
    parser: Callable[[Any], None]
    run: Callable[[Any, Any, Any], None]
    walk: bool = False        # does it need every piece walked
    accepts: Callable[[Any], bool] = lambda args: True    # are these arguments its (another allocator's if not)


def chunk_arguments(p) -> None:
    """The arguments of every allocator's 'heapwalk chunk': the address, and --json."""
    p.add_argument("address", metavar="ADDRESS")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON (schema: docs/json.md)")


def show_chunk(front, heap, args, address: int, where: dict, text: str, held: int | None, allocator: str) -> None:
    """What every allocator's 'heapwalk chunk' ends with: TEXT (what holds ADDRESS), what reaches HELD (the block
    the program holds there, or None), and with --json the document of WHERE, its ALLOCATOR named."""
    console = front.console()
    console.print(text)
    reach = front.print_reach(console, heap, held)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"allocator": allocator, "address": address, **where, "reach": reach}, fh, indent=1)


class Decoded:
    """One allocator as decoded in one target."""

    #: the registry's name of the allocator (the JSON's "allocator"), and how sentences name it
    name = ""
    title = ""
    #: the key another allocator's JSON holds this one's document under, when a process has both
    beside_key = ""
    #: what 'heapwalk check' calls this allocator's memory when it is damaged
    damaged_subject = "the heap is"
    #: does the leak scan read its blocks (`blocks`)?
    scans_leaks = False
    #: is it the C library's own malloc (no other C library's malloc is then in the process)?
    serves_libc = False
    #: what the leak scan's tables call one of its blocks
    block_noun = "chunk"

    target: str = ""
    #: what its report calls its parts
    words = Words(holds="its arenas hold")

    def header(self, with_target: bool = True) -> Text:
        """The lines every command starts with: the target (WITH_TARGET), the allocator's version and how
        its structures were found."""
        text = Text(f"{self.target}\n" if self.target and with_target else "")
        text.append(f"{self.title}\n")
        return text

    #: findings the front end added (`with_finding`)
    added: tuple[Finding, ...] = ()

    def findings(self) -> list[Finding]:
        """What the decoder found, and what was added to it."""
        return list(self.added)

    def with_finding(self, finding: Finding) -> "Decoded":
        """This allocator with one more finding (another allocator could not be decoded beside it)."""
        other = copy.copy(self)
        other.added = self.added + (finding,)
        return other

    def partial(self) -> tuple[str, ...]:
        """Which figures rest on damaged structures, as sentences."""
        return ()

    # the report
    def view(self) -> HeapView:
        raise NotImplementedError

    def verdict(self, rep: Report) -> list[str]:
        """The verdict's sentences on REP, each backed by its numbers."""
        return []

    def report(self, in_use: InUse | None = None, leaks: LeakTotals | None = None,
               process_rss: int | None = None) -> Report:
        """The report: this allocator's view, the blocks in use and the leak scan (when given), and the verdict,
        whose remedies are weighed against the PROCESS_RSS when it is known."""
        return build_report(self.view(), in_use, leaks, self.verdict, process_rss)

    def not_decoded(self) -> list[str]:
        """The verdict's first sentences when another allocator in the process could not be decoded: what this
        report then leaves out."""
        return [f"{f.message}. The memory it serves is not in this report, whose figures are {self.title}'s alone."
                for f in self.findings() if f.kind is Kind.NOT_DECODED]

    def report_parts(self, rep: Report, interactive: bool) -> list:
        """What 'heapwalk report' prints of REP, after the header."""
        return [report_group(rep, interactive, self.words, plain_lines(rep, self.words))]

    def document(self) -> dict:
        """The fields every JSON document of this allocator starts with."""
        return {"schema_version": SCHEMA_VERSION, "target": self.target, "allocator": self.name,
                "findings": [{"severity": f.severity.value, "kind": f.kind.ident, "address": f.address,
                              "structure": f.structure, "message": f.message} for f in self.findings()]}

    def report_document(self, rep: Report) -> dict:
        """'heapwalk report --json': the document with the report in it (which 'heapwalk diff' reads)."""
        return {**self.document(), "report": {**report_json(rep), "partial": []}}

    def holds(self, rep: Report) -> str:
        """What this allocator holds, as the clause of the sentence a report of several allocators ends with."""
        return f"{self.title} holds {human(rep.system)} ({human(rep.in_use)} in use, {human(rep.free)} free)"

    def native_xml(self) -> str | None:
        """The allocator's own XML statistics (None: it has none)."""
        return None

    # the other commands
    def arenas(self, interactive: bool, json: bool = False) -> Shown:
        """'heapwalk arenas': the report's arena table."""
        rep = self.report()
        return Shown([arena_table(rep, interactive, self.words)], self.report_document(rep) if json else None)

    def threads(self, interactive: bool, json: bool = False) -> Shown:
        return Shown([Text(f"{self.title}: heapwalk shows no threads of it\n")], self.document() if json else None)

    def check(self, limit: int, interactive: bool, json: bool = False) -> Checked:
        """'heapwalk check': the findings the decoder made (an allocator without checks of its own)."""
        return self.checked(self.findings(), limit, f"{self.title}: no findings\n", (), json)

    def checked(self, findings: list[Finding], limit: int, consistent: str, checked: Sequence[str],
                json: bool) -> Checked:
        """'heapwalk check''s answer on FINDINGS: the first LIMIT of them (all: 0), or the CONSISTENT line when there
        are none; its document says what was CHECKED."""
        errors = sum(1 for f in findings if f.severity is Severity.ERROR)
        warnings = sum(1 for f in findings if f.severity is Severity.WARNING)
        text = tables.findings_text(findings[:limit or len(findings)]) or Text(consistent)
        doc = {**self.document(), "clean": not errors, "errors": errors, "warnings": warnings,
               **({"checked": list(checked)} if checked else {})} if json else None
        return Checked([text], errors, warnings, doc)

    def claims(self) -> list:
        """The memory this allocator holds (its heaps, its own mappings for large blocks, its metadata), as
        `heapwalk.analysis.rss.Claim`s, for the process's RSS by owner; none by default."""
        return []

    def strips(self, reserved: bool = False, leaked=None) -> list[HeapStrip]:
        """The heap maps' strips (LEAKED: the leak scan's leaked blocks); CannotDraw when they cannot be."""
        raise CannotDraw(f"{self.title}'s heaps are not drawn")

    def blocks(self) -> Blocks | None:
        """The blocks in use for the leak scan (None: not scanned)."""
        return None

    def pages_seen(self):
        """The whole pages the decode read (merged) and the runs of them that hold anything but zeros, for a
        core's contents (`residency.in_core`); None: none noted."""
        return None

    @property
    def memory(self):
        """The target's memory the decoder read (the leak scan reads through it)."""
        raise NotImplementedError

    def leaks_header(self) -> dict:
        """The fields 'heapwalk leaks --json' starts with."""
        return {"target": self.target, "allocator": self.name}

    def html(self, document: dict, strips: Sequence[HeapStrip]) -> list[str]:
        """The report page's sections for DOCUMENT (this allocator's report document) and its STRIPS."""
        return htmlreport.plain_sections(document, strips, self.words, self.name)

    def html_header(self, document: dict) -> list[tuple[str, str]]:
        """The page header's rows (name, HTML) of this allocator."""
        return [("allocator", escape(self.title))]


class Allocator:
    """An allocator heapwalk decodes: its name, its settings, its commands of its own, and LOAD."""

    name = ""
    title = ""
    settings: tuple[Setting, ...] = ()
    verbs: tuple[Verb, ...] = ()
    #: the XML statistics it writes (report --xml), named for the help text ("" when none)
    xml_name = ""
    #: does the leak scan read its blocks?
    scans_leaks = False
    #: is it a C library's own malloc (where it is, no other C library's malloc is)?
    serves_libc = False
    #: the environment variables that set it (a name, or a prefix ending in "_"), which a capture records
    variables: tuple[str, ...] = ()
    #: what each common command shows of it, for that command's help (command -> a clause: "its active, dirty,
    #: muzzy and retained pages")
    describes: dict = {}

    def settings_in(self, document: dict) -> str:
        """The settings the allocator's own state holds, from its report DOCUMENT, as 'heapwalk capture' says
        them beside the process's environment ("" when it has none to say)."""
        return ""

    def load(self, context: Context) -> Decoded:
        """The allocator decoded in CONTEXT's target; NotUsed when it is not there, or holds nothing; another
        HeapwalkError, naming why, when it is there and cannot be decoded."""
        raise NotImplementedError

    def beside_failure(self, error: Exception, first: Decoded) -> Finding:
        """The finding FIRST carries when this allocator is in the process but could not be decoded."""
        reason = str(error).removeprefix("heapwalk: ")
        return Finding(Severity.WARNING, 0, self.title, f"{self.title} is in this process, but heapwalk could "
                       f"not decode it: {reason}", Kind.NOT_DECODED)
