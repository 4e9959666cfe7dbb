"""CPython's obmalloc behind heapwalk's allocator interface (`heapwalk.face`): an allocator above malloc,
looked for after the allocators that serve malloc, in the anonymous memory they do not claim."""

from __future__ import annotations

from rich.text import Text

from heapwalk.face import Allocator, Context, Decoded, NotUsed, Shown
from heapwalk.analysis.report import Report, human
from heapwalk.analysis.rss import Claim
from heapwalk.cpython.load import NoObmalloc, load_obmalloc
from heapwalk.cpython.model import ObState
from heapwalk.cpython.shown import WORDS, class_table, heap_view, obmalloc_document, summary_lines
from heapwalk.cpython.verdict import advice
from heapwalk.common.findings import Finding
from heapwalk.output.consoles import box_for
from heapwalk.output.jsondoc import report_json
from heapwalk.output.reporttext import arena_table, report_group

__all__ = ["CPYTHON", "Obmalloc"]


class Obmalloc(Decoded):
    """CPython's obmalloc decoded: its arenas, pools and size classes."""

    name = "cpython"
    title = "CPython's obmalloc"
    beside_key = "cpython_obmalloc"
    damaged_subject = "CPython's obmalloc is"
    words = WORDS
    block_noun = "block"

    def __init__(self, state: ObState):
        self.state = state
        self.target = state.target

    def header(self, with_target: bool = True) -> Text:
        text = Text(f"{self.target}\n" if self.target and with_target else "")
        text.append(f"CPython's obmalloc: {self.state.python}\n")
        return text

    def findings(self) -> list[Finding]:
        return list(self.state.findings) + list(self.added)

    def view(self):
        return heap_view(self.state)

    def verdict(self, rep: Report) -> list[str]:
        return advice(self.state, rep)

    def report_parts(self, rep: Report, interactive: bool) -> list:
        *parts, verdict = report_group(rep, interactive, WORDS, summary_lines(rep, self.state)).renderables
        return [*parts, class_table(self.state, box_for(interactive)), verdict]

    def report_document(self, rep: Report) -> dict:
        return {**self.document(), "report": {**report_json(rep), "partial": []},
                "obmalloc": obmalloc_document(self.state)}

    def holds(self, rep: Report) -> str:
        return (f"CPython's obmalloc maps {human(rep.system)} ({human(rep.in_use)} in blocks in use, "
                f"{human(rep.free)} free)")

    def arenas(self, interactive: bool, json: bool = False) -> Shown:
        rep = self.report()
        return Shown([arena_table(rep, interactive, WORDS), class_table(self.state, box_for(interactive))],
                     self.report_document(rep) if json else None)

    def claims(self) -> list[Claim]:
        """Every arena, from its start as mmap returned it to its end."""
        return [Claim(a.address, a.end, "heap", "CPython's obmalloc: arenas") for a in self.state.arenas]


class Cpython(Allocator):
    """CPython's obmalloc, where an interpreter is mapped and its arenas hold pools."""

    name = "cpython"
    title = "CPython's obmalloc"
    variables = ("PYTHONMALLOC",)
    describes = {
        "arenas": "its arenas with their blocks in use, free blocks and unused pools; its size classes",
        "report": "the arenas Python maps for its small objects, by size class, and what they keep free",
    }

    def load(self, context: Context) -> Obmalloc:
        claimed = [(c.start, c.end) for d in context.beside for c in d.claims()]
        try:
            return Obmalloc(load_obmalloc(context.target, claimed))
        except NoObmalloc as exc:
            raise NotUsed(str(exc)) from None


CPYTHON = Cpython()
