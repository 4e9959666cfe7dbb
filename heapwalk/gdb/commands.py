"""gdb commands: ``heapwalk report|arenas|threads|check`` for every allocator, the commands only some
allocators have (`heapwalk.face.Verb`), and ``set/show heapwalk ...``.

Commands parse their arguments, decode every allocator of the target through the registry, and print what
each decoded allocator says of itself; no heap logic lives here.  Errors the user can cause are one line;
internal errors show a traceback only with ``set heapwalk debug on``.
"""

from __future__ import annotations

import dataclasses

import textwrap

import gdb  # type: ignore[import-not-found]

from heapwalk import registry
from heapwalk.face import NotMine
from heapwalk.common.errors import PARTIAL, UNCHECKED
from heapwalk.common.findings import Kind
from heapwalk.registry import described
from heapwalk.gdb.leakcommands import LeaksCommand, pages_seen_of, reach_text, report_scans, scan_leaks
from heapwalk.gdb.mapcommands import MapCommand, write_report_html
from heapwalk.gdb.console import (console_with_header, gdb_console, interactive, print_damage, write_json)
from heapwalk.gdb.session import (BoolParameter, SetPrefix, Settings, StringParameter, UserError,
                                  load_allocators, parse_int, reload)
from heapwalk.gdb.subcommand import Parser, Subcommand, json_option
from heapwalk.output.jsondoc import words_json
from heapwalk.output.options import add_no_leaks, add_report_files, cost_epilog
from heapwalk.output.tables import several_text
from heapwalk.output.rsstext import rss_document, rss_sentence, rss_table, rss_verdict
from heapwalk.analysis.pages import PagesSeen
from heapwalk.analysis.rss import rss_of_target

__all__ = ["register"]


class ArenasCommand(Subcommand):
    name = "arenas"

    def make_parser(self):
        p = Parser(prog="heapwalk arenas", description=described(
            "List every arena of every allocator with its memory and where it is", "arenas"))
        json_option(p)
        return p

    def run(self, args) -> None:
        _show_each(load_allocators(walk_chunks=True), lambda d: d.arenas(interactive(), bool(args.json)), args.json,
                   damage=True)


def _each(found):
    """Each decoded allocator with the one printed first when it is not the first (None for the first)."""
    first = found.decoded[0]
    return [(d, None if d is first else first) for d in found.decoded]


def _show_each(found, shown_of, json_path, damage: bool = False) -> None:
    """Prints what SHOWN_OF says of each decoded allocator of FOUND under its header (and, with DAMAGE, its
    partial notes and findings), then writes their documents to JSON_PATH."""
    documents = []
    for decoded, beside in _each(found):
        shown = shown_of(decoded)
        console = console_with_header(decoded, beside)
        for part in shown.parts:
            console.print(part)
        if damage:
            print_damage(console, decoded, decoded.findings())
        documents.append((decoded, shown.document))
    write_json(json_path, documents)


class ThreadsCommand(Subcommand):
    name = "threads"

    def make_parser(self):
        p = Parser(prog="heapwalk threads", description=described(
            "Every thread: its name, its arena and what its thread cache holds; every arena: how many threads use "
            "it; the arena limit", "threads"))
        json_option(p)
        return p

    def run(self, args) -> None:
        _show_each(load_allocators(), lambda d: d.threads(interactive(), bool(args.json)), args.json)


class ReportCommand(Subcommand):
    name = "report"

    def make_parser(self):
        p = Parser(prog="heapwalk report", description=described(
            "Where every byte of every arena is: per arena the memory it holds, in-use bytes, free bytes by kind "
            "and the allocator's own, which add up to what it holds; a histogram of the free pieces; what the "
            "allocator would give back; and a verdict (leak or fragmentation, and the remedies the numbers "
            "support). When an allocator in the process is not decoded, the verdict says so first and the "
            "command ends with an error that names it, so 'gdb -batch' exits with status 1 when it is the last "
            "command", "report"))
        add_report_files(p, registry.xml_help())
        add_no_leaks(p)
        p.epilog = cost_epilog()
        return p

    def run(self, args) -> None:
        found = load_allocators(walk_chunks=True, keep_used=not args.no_leaks, keep_chunks=bool(args.html),
                                keep_pages=True)
        xml = next((d for d in found.decoded if d.native_xml is not None and d.native_xml() is not None), None) \
            if args.xml else None
        if args.xml and xml is None:
            writers = ", ".join(a.xml_name for a in registry.allocators() if a.xml_name)
            raise UserError(f"heapwalk report: --xml writes {writers}, and this process allocates with "
                            f"{' and '.join(d.title for d in found.decoded)} (--json has its statistics)")
        documents, pages, clauses = [], [], []
        target = found.target
        judged = pages_seen_of(found)                  # the decoders' own: the scan need not judge them again
        seen = PagesSeen(judged[0] if judged else ()) if target.residency is None and target.present is not None \
            else None
        scans, refused = report_scans(found, args.no_leaks, seen)
        rss = rss_of_target(target, [c for d in found.decoded for c in d.claims()], pages_seen_of(found, seen))
        for (decoded, beside), scanned in zip(_each(found), scans):
            in_use, leaks = scanned[:2] if scanned else (None, None)
            known = rss is not None and rss.measure == "resident"      # a plain core's bytes are not its RSS
            rep = decoded.report(in_use, leaks, rss.total if known else None)
            rep.verdict = decoded.not_decoded() + (rss_verdict(rss) if not documents else []) + rep.verdict
            console = console_with_header(decoded, beside)
            if rss is not None and not documents:     # the process's RSS by owner, once, under the first header
                console.print(rss_table(rss, interactive()))
                console.print(rss_sentence(rss) + "\n")
            for part in decoded.report_parts(rep, interactive()):
                console.print(part)
            print_damage(console, decoded, decoded.findings())
            clauses.append(decoded.holds(rep))
            doc = decoded.report_document(rep) if args.json or args.html else None
            if doc is not None:
                doc["report"]["rss_by_owner"] = rss_document(rss) if rss is not None else None
                doc["report"]["words"] = words_json(decoded.title, decoded.words)
            documents.append((decoded, doc))
            pages.append((decoded, doc, scanned[2] if scanned else None))
        console = gdb_console()
        both = several_text(clauses) if len(clauses) > 1 else ""
        if both:
            console.print(f"\n{both}")
        if args.html:
            write_report_html(args.html, pages, console, both)
        if xml is not None:
            with open(args.xml, "w", encoding="utf-8") as fh:
                fh.write(xml.native_xml())
        write_json(args.json, documents)
        if refused:       # said last: the report holds no leak scan
            raise UserError(f"heapwalk report: {PARTIAL} {refused[0]}")
        left_out = [f.message for d in found.decoded for f in d.findings() if f.kind is Kind.NOT_DECODED]
        if left_out:   # the last line, and gdb -batch's exit status, say it: never read as the process's all-clear
            more = f" (and {len(left_out) - 1} more: see the findings)" if len(left_out) > 1 else ""
            raise UserError(f"heapwalk report: {PARTIAL} {left_out[0]}{more}")


class CheckCommand(Subcommand):
    name = "check"

    def make_parser(self):
        p = Parser(prog="heapwalk check", description=described(
            "Validate every invariant the allocator relies on, and list each violation: kind, address, structure, "
            "what was expected and what was found. Sets $heapwalk_errors and $heapwalk_warnings; when the heap is "
            "damaged, or when an allocator in the process could not be decoded and so was not checked, the command "
            "ends with an error, so 'gdb -batch' exits with status 1 when it is the last command (see "
            "docs/forensics.md)", "check"))
        p.add_argument("--limit", metavar="N", type=int, default=200,
                       help="print at most N findings (default 200; 0: all); --json has them all")
        json_option(p)
        return p

    def run(self, args) -> None:
        for name in ("heapwalk_errors", "heapwalk_warnings"):
            gdb.set_convenience_variable(name, None)
        found = load_allocators(walk_chunks=True)
        errors = warnings = 0
        documents, damaged = [], []
        for decoded, beside in _each(found):
            checked = decoded.check(args.limit, interactive(), bool(args.json))
            console = console_with_header(decoded, beside)
            for part in checked.parts:
                console.print(part, end="")
            errors, warnings = errors + checked.errors, warnings + checked.warnings
            if checked.errors:
                damaged.append(decoded)
            documents.append((decoded, checked.document))
        write_json(args.json, documents)
        gdb.set_convenience_variable("heapwalk_errors", errors)
        gdb.set_convenience_variable("heapwalk_warnings", warnings)
        if errors:
            what = damaged[0].damaged_subject if len(damaged) == 1 else "the heap is"
            raise UserError(f"heapwalk check: {what} damaged ({errors} error(s))")
        left_out = [f.message for d in found.decoded for f in d.findings() if f.kind is Kind.NOT_DECODED]
        if left_out:   # a consistent heap beside an allocator never checked is no all-clear
            more = f" (and {len(left_out) - 1} more: see the findings)" if len(left_out) > 1 else ""
            raise UserError(f"heapwalk check: {UNCHECKED} {left_out[0]}{more}")


class VerbCommand(Subcommand):
    """A command only some allocators have (`heapwalk.face.Verb`): run on the first decoded allocator
    that has it and whose own verb takes the arguments, each read by that allocator's own parser."""

    def __init__(self, verb, owners, own: dict | None = None):
        self.verb, self.owners, self.name = verb, owners, verb.name
        self.own = own or {}
        super().__init__()

    def make_parser(self):
        return self._parser_of(self.verb)

    def _parser_of(self, verb):
        """The parser of VERB's arguments (an owner's own, or the command's, whose description is every one's)."""
        p = Parser(prog=f"heapwalk {self.verb.name}", description=verb.description)
        verb.parser(p)
        return p

    def parse(self, argv: list[str]):
        """ARGV as every owner's parser reads it: allocator -> its arguments, or the error its parser gave
        (the command's whole help when asked; the first error when no owner's parser can read them)."""
        if "-h" in argv or "--help" in argv:
            self.parser.parse_args(argv)
        read = {}
        for name in self.owners:
            try:
                read[name] = self._parser_of(self.own.get(name, self.verb)).parse_args(argv)
            except UserError as exc:
                read[name] = exc
        errors = [v for v in read.values() if isinstance(v, UserError)]
        if len(errors) == len(read):
            raise errors[0]
        return read

    def run(self, read) -> None:
        found = load_allocators(walk_chunks=self.verb.walk)
        having = [d for d in found.decoded if d.name in read]
        wrong = [read[d.name] for d in having if isinstance(read[d.name], UserError)]
        having = [d for d in having if not isinstance(read[d.name], UserError)]
        if not having and wrong:
            raise wrong[0]
        if not having:
            owners = " and ".join(a.title for a in registry.allocators() if a.name in self.owners)
            raise UserError(f"heapwalk {self.verb.name}: a command of {owners} only, and this process allocates "
                            f"with {' and '.join(d.title for d in found.decoded)}")
        # the allocators whose command takes these arguments (glibc's 'bins small' beside jemalloc) first; one
        # that says what was asked is not its (an address) hands it to the next
        ordered = sorted(having, key=lambda d: not self.own.get(d.name, self.verb).accepts(read[d.name]))
        for decoded in ordered:
            try:
                self.own.get(decoded.name, self.verb).run(decoded, read[decoded.name], Front(found))
                return
            except NotMine as exc:
                last = exc
        raise last


class Front:
    """What a `Verb` prints through, and asks of the debugger."""

    def __init__(self, found):
        self.found = found
        self.interactive = interactive()

    @staticmethod
    def console():
        return gdb_console()

    @staticmethod
    def console_with_header(decoded):
        return console_with_header(decoded)

    @staticmethod
    def print_damage(console, decoded, findings) -> None:
        print_damage(console, decoded, findings)

    @staticmethod
    def evaluate(text: str) -> int:
        return parse_int(text)

    @staticmethod
    def reload(decoded, wants):
        return reload(decoded, wants)

    @staticmethod
    def reach(decoded, block: int) -> str | None:
        """Whether the block at BLOCK of DECODED's allocator is reached from a root, and how (a scan of the
        whole heap)."""
        found = load_allocators(walk_chunks=True, keep_used=True)
        again = next((d for d in found.decoded if d.name == decoded.name), None)
        return reach_text(scan_leaks(found, again, paths=True), block, found.target.threads) if again is not None else None

    def print_reach(self, console, decoded, block: int | None) -> str | None:
        """`reach` of the block at BLOCK (None: not one the program holds) in DECODED's words (its block_noun),
        printed under what CONSOLE printed of it; None when it is not scanned."""
        said = self.reach(decoded, block) if block is not None and decoded.scans_leaks else None
        if said is not None:
            said = said.replace("chunk", decoded.block_noun)
            console.print(f"  {said}")
        return said


class HeapwalkPrefix(gdb.Command):
    """heapwalk: heap forensics for cores and live processes (its help is made by `_prefix_help`)."""

    def __init__(self):
        super().__init__("heapwalk", gdb.COMMAND_DATA, prefix=True)

    def invoke(self, argument: str, from_tty: bool) -> None:
        if argument.strip():
            raise gdb.GdbError(f"heapwalk: unknown subcommand '{argument.split()[0]}' (see 'help heapwalk')")
        gdb.execute("help heapwalk")


#: the commands every allocator has, as 'help heapwalk' lists them
_COMMON = (("report", "start here: where the memory is, what would give it back, verdict"),
           ("arenas", "every arena: the memory it holds, and where that is"),
           ("threads", "every thread's arena and cache; arenas, their users, the limit"),
           ("check", "every invariant the allocator relies on; damage with its address"),
           ("leaks", "the blocks in use nothing points to any more, by a scan from the roots"),
           ("map", "each heap as a strip, coloured by what holds each byte (--svg FILE)"))


def _prefix_help(verbs: dict) -> str:
    """'help heapwalk': the allocators, every command (those of some allocators only, with theirs), the
    settings."""
    allocators = registry.allocators()
    titles = {a.name: a.title for a in allocators}
    lines = [f"heapwalk: heap forensics ({', '.join(a.title for a in allocators)}) for cores and live processes.",
             "", "Every arena, free list and thread cache of the target, decoded read-only from memory.",
             "Subcommands:"]
    lines += [f"  heapwalk {name:8} {what}" for name, what in _COMMON]
    lines += [f"  heapwalk {verb.name:8} {verb.summary} ({', '.join(titles[o] for o in owners)})"
              for verb, owners in verbs.items()]
    settings = [f"'set heapwalk {s.name} {s.value}'" for a in allocators for s in a.settings]
    lines.append("Each takes --json FILE. 'help heapwalk SUBCOMMAND' describes its options.")
    lines += textwrap.wrap(f"Settings: 'set heapwalk debug on|off', 'set heapwalk memory-check on|off', "
                           f"{', '.join(settings)} ('show heapwalk' lists them).", 100, break_long_words=False,
                           break_on_hyphens=False)
    return "\n".join(lines)


def _verbs() -> dict:
    """Each allocator's own commands, and which allocators have each.  A name several allocators share stands
    for one command: the C library's arguments and summary (the others read the same arguments), and each
    allocator's description."""
    by_name: dict = {}
    for allocator in registry.allocators():
        for verb in allocator.verbs:
            by_name.setdefault(verb.name, []).append((allocator, verb))
    out: dict = {}
    for name, owners in by_name.items():
        verb = owners[-1][1]
        if len(owners) > 1:
            verb = dataclasses.replace(verb, description=" ".join(f"For {a.title}: {v.description}"
                                                                  for a, v in owners))
        out[verb] = [a.name for a, _ in owners]
    return out


def _own_verbs() -> dict:
    """name -> {allocator: its own verb of that name}."""
    out: dict = {}
    for allocator in registry.allocators():
        for verb in allocator.verbs:
            out.setdefault(verb.name, {})[allocator.name] = verb
    return out


def register() -> None:
    """Creates the commands and settings in gdb (idempotent enough to re-source)."""
    verbs = _verbs()
    HeapwalkPrefix.__doc__ = _prefix_help(verbs)
    HeapwalkPrefix()
    SetPrefix("set")
    SetPrefix("show")
    Settings.debug = BoolParameter("debug", "heapwalk shows tracebacks of internal errors", False)
    Settings.memory_check = BoolParameter("memory-check", "heapwalk refuses a command this machine has not the "
                                          "memory for", True)
    for allocator in registry.allocators():
        for setting in allocator.settings:
            Settings.allocators[setting.name] = StringParameter(setting.name, setting.what)
    Settings.resident_from = StringParameter(
        "resident-from", "the capture.json whose page map says which pages of this core were resident (for a "
        "gcore core taken with a capture)", "what the core itself records")
    Settings.core_missing = StringParameter(
        "core-missing", "the address ranges (hex a-b,c-d) a truncated core lacks, which its padding would read as "
        "zeros (the command line sets it)", "the core lacks nothing")
    ArenasCommand()
    own = _own_verbs()
    for verb, owners in verbs.items():
        VerbCommand(verb, owners, own[verb.name])
    ReportCommand()
    ThreadsCommand()
    CheckCommand()
    LeaksCommand()
    MapCommand()
