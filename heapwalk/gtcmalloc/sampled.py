"""Google's tcmalloc's sampled allocations: each has a span of its own (in the sampled page heap) whose Span
points at a SampledAllocation, which holds what the program asked for and the object of the size class that
stands in for the sample (its proxy: tcmalloc keeps it allocated while the sample lives)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.gtcmalloc.layout import PAGE, GtcLayout
from heapwalk.gtcmalloc.pagemap import Spans
from heapwalk.inferior.memory import Memory, ReadError, u64

__all__ = ["Sampled", "read_sampled"]


@dataclass(frozen=True)
class Sampled:
    """One sampled allocation: where it is, its span's bytes, what the program asked for, its proxy (0: none)."""

    address: int
    bytes: int
    requested: int
    proxy: int
    record: int                 # its SampledAllocation


def read_sampled(mem: Memory, layout: GtcLayout, spans: Spans | None) -> tuple[list[Sampled], list[Finding]]:
    """Every live sampled span's allocation, and a finding for each whose SampledAllocation cannot be read."""
    out, findings = [], []
    if spans is None:
        return out, findings
    for row in np.nonzero(spans.sampled)[0].tolist():
        holder = int(spans.address[row]) + layout.span_sampled
        try:
            record = u64(mem, holder)
            proxy, requested = u64(mem, record + layout.sampled_proxy), u64(mem, record + layout.sampled_requested)
        except ReadError:
            findings.append(Finding(Severity.ERROR, holder, "a sampled span", "its SampledAllocation cannot be read",
                                    Kind.UNMAPPED))
            continue
        out.append(Sampled(int(spans.first_page[row]) * PAGE, int(spans.pages[row]) * PAGE, requested, proxy, record))
    return out, findings
