"""What heapwalk says about a target, whatever the allocator: findings (something wrong or notable at an
address, in a plain sentence, with its severity and the invariant it breaks) and facts (something discovered,
and how)."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass

__all__ = ["Severity", "Kind", "Finding", "Fact", "CheckResult"]


class Severity(enum.Enum):
    ERROR = "error"      # the structure is damaged; numbers that depend on it are partial
    WARNING = "warning"  # unexpected but decodable
    INFO = "info"


@dataclass(frozen=True)
class Kind:
    """What kind of problem a finding is: a stable name (IDENT, for JSON and scripts) and its TITLE.  The kinds
    every allocator may meet are here; each allocator adds its own in its folder (glibc's: `glibc.kinds`)."""

    ident: str
    title: str


Kind.UNMAPPED = Kind("unmapped_pointer", "pointer into unmapped memory")
Kind.LIST_CYCLE = Kind("list_cycle", "list is a cycle not through its head")
Kind.DOUBLE_FREE = Kind("double_free", "double free: chunk in two free lists")
Kind.TCACHE_SIZE = Kind("tcache_size", "tcache entry of wrong size")
Kind.TCACHE_COUNT = Kind("tcache_count", "tcache count does not match list length")
Kind.ARENA = Kind("arena", "arena unreadable or inconsistent")
Kind.ACCOUNTING = Kind("accounting", "system_mem not accounted for by the chunk walk")
Kind.TCACHE = Kind("tcache", "tcache struct unreadable or inconsistent")
Kind.DISCOVERY = Kind("discovery", "discovery")
Kind.NOT_DECODED = Kind("not_decoded", "an allocator in the process that heapwalk could not decode")
Kind.OTHER = Kind("other", "other")


@dataclass(frozen=True)
class Finding:
    """Something wrong or notable at ADDRESS, in STRUCTURE, said in a plain sentence.

    KIND names the invariant; EXPECTED and FOUND (when set) are what the allocator's
    invariant wants and what memory holds.  ADDRESS is where the bad data lives
    (the chunk or slot whose field is wrong), not where a walk noticed it.
    """

    severity: Severity
    address: int
    structure: str
    message: str
    kind: Kind = Kind.OTHER
    expected: str = ""
    found: str = ""

    def __str__(self) -> str:
        where = f" at {self.address:#x}" if self.address else ""
        return f"{self.severity.value}: {self.structure}{where}: {self.message}"


@dataclass(frozen=True)
class Fact:
    """A discovered fact and how it was found (symbol, heuristic, override)."""

    name: str
    value: object
    found_by: str


@dataclass(frozen=True)
class CheckResult:
    """What a check of an allocator found: its findings, errors first then by address, and the numbers they make
    partial."""

    findings: tuple[Finding, ...]
    partial: tuple = ()          # the allocator's notes of the numbers it makes partial

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.WARNING]

    @property
    def clean(self) -> bool:
        """No damage found (warnings, such as a held mutex, do not make a heap damaged)."""
        return not self.errors

    def by_kind(self) -> dict[str, int]:
        return dict(Counter(f.kind.ident for f in self.findings))
