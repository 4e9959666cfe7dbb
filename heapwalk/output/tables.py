"""The text every allocator's commands share: findings, a check's summary, partial-result notes, the sentence
of a process with several allocators.  Nothing here prints during a walk; commands decode, then render.
Interactive terminals get rounded boxes and colour; logs (``gdb -batch``, pipes) get plain ASCII rules."""

from __future__ import annotations

from typing import Iterable

from rich.text import Text

from heapwalk.output.consoles import box_for, make_console
from heapwalk.common.findings import Finding, Severity
from heapwalk.analysis.report import human


__all__ = ["make_console", "box_for", "human", "findings_text", "check_text", "partial_text", "several_text"]


def findings_text(findings: Iterable[Finding], limit: int = 50) -> Text | None:
    """The findings, errors first, as lines; None when there are none."""
    findings = sorted(findings, key=lambda f: (f.severity is not Severity.ERROR, f.severity is not Severity.WARNING))
    if not findings:
        return None
    text = Text(f"{len(findings)} finding(s):\n")
    for f in findings[:limit]:
        text.append(f"  {f}\n", style="red" if f.severity is Severity.ERROR else "yellow")
    if len(findings) > limit:
        text.append(f"  ... and {len(findings) - limit} more ('heapwalk ... --json FILE' has them all)\n")
    return text


def check_text(result, limit: int, subject: str, scope: str) -> Text:
    """`heapwalk check`: a summary line on SUBJECT ("heap", "jemalloc") and what was checked (SCOPE, in words),
    then each finding with its kind, address, place, expected and found (the first LIMIT)."""
    errors, warnings = len(result.errors), len(result.warnings)
    text = Text()
    if result.clean and not warnings:
        text.append(f"{subject} consistent: no violations in {scope}\n", style="green")
        return text
    verdict = f"{subject} DAMAGED" if errors else f"{subject} consistent, with warnings"
    text.append(f"{verdict}: {errors} error(s), {warnings} warning(s) in {scope}\n",
                style="bold red" if errors else "yellow")
    for f in result.findings[:limit]:
        style = "red" if f.severity is Severity.ERROR else "yellow"
        text.append(f"{f.severity.value.upper():7} {f.kind.ident:20} {f.address:#x}  {f.structure}\n", style=style)
        text.append(f"        {f.message}\n")
        if f.expected:
            text.append(f"        expected {f.expected}, found {f.found or '?'}\n")
    if len(result.findings) > limit:
        text.append(f"... and {len(result.findings) - limit} more ('heapwalk check --json FILE' has them all)\n")
    return text


def partial_text(sentences: Iterable[str]) -> Text | None:
    """Which numbers rest on damaged structures (the allocator's SENTENCES); None when all were walked."""
    sentences = list(sentences)
    if not sentences:
        return None
    text = Text("partial results:\n", style="bold yellow")
    for sentence in sentences:
        text.append(f"  - {sentence}\n", style="yellow")
    return text


def several_text(clauses: list[str]) -> str:
    """The sentence a report of a process with more than one allocator ends with, from what each holds."""
    listed = ", and ".join(clauses) if len(clauses) == 2 else ", ".join(clauses[:-1]) + f", and {clauses[-1]}"
    many = "both" if len(clauses) == 2 else f"{len(clauses)} allocators"
    return f"This process allocates with {many}: {listed}; each verdict above is about its own allocator."
