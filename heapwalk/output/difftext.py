"""`heapwalk diff`'s text: each arena's growth in MiB, the totals, the free-piece size classes that grew
most, and which arenas grew."""

from __future__ import annotations

from heapwalk.analysis.diff import Diff

__all__ = ["diff_text"]

_MIB = 1 << 20


def _signed(n: int) -> str:
    return f"{n / _MIB:+.1f}"


def diff_text(d: Diff) -> str:
    """The table of arenas (largest growth of system memory first), then what grew."""
    lines = [f"{'arena':>6} {'address':>16} {'system MiB':>16} {'in use MiB':>16} {'free MiB':>16}  status"]
    for e in d.arenas:
        lines.append(f"{e.number:>6} {e.address:#16x} {_signed(e.growth('system')):>16} "
                     f"{_signed(e.growth('in_use')):>16} {_signed(e.growth('free')):>16}  {e.status}")
    g = d.growth
    lines.append(f"{'total':>6} {'':16} {_signed(g['system']):>16} {_signed(g['in_use']):>16} "
                 f"{_signed(g['free']):>16}")
    for e in d.arenas:
        grown = sorted((c for c in e.free_classes if c.bytes_growth > 0), key=lambda c: -c.bytes_growth)
        if grown:
            lines.append(f"arena {e.number}: free chunks grew in " + ", ".join(
                f"{c.low}-{c.high} B ({c.count[0]} -> {c.count[1]} chunks, {c.bytes_growth / 1024:+,.0f} KiB)"
                for c in grown[:4]))
    if d.grew:
        lines.append("grew: arena " + ", ".join(map(str, d.grew)) + " (system memory or in-use bytes)")
    else:
        lines.append("no arena grew")
    return "\n".join(lines) + "\n"
