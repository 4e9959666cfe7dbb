"""The command line's exit status says what the report could not: 3 when an allocator in the process is not
decoded (the report is partial), 1 when --check finds damage, whichever gdb said it in its error line."""

from __future__ import annotations

import contextlib

from heapwalk.cli import main as cli
from heapwalk.cli.gdbmi import CliError
from heapwalk.common.errors import PARTIAL


class _Gdb(contextlib.AbstractContextManager):
    """gdb as the command line drives it: each command's output, or its error."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors

    def __exit__(self, *exc):
        return None

    def run(self, command: str) -> str:
        word = command.split()[1]
        if word in self.errors:
            raise CliError(self.errors[word], output=f"{word} output\n")
        return f"{word} output\n"


def _status(monkeypatch, capsys, errors: dict[str, str], *options: str) -> tuple[int, str, str]:
    monkeypatch.setattr(cli, "open_core", lambda args, core, exe: (_Gdb(errors), []))
    status = cli.main(["report", "core", "exe", *options])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_a_partial_report_exits_3_and_says_why(monkeypatch, capsys):
    said = f"heapwalk report: {PARTIAL} jemalloc is in this process, but heapwalk could not decode it: no arenas"
    status, out, err = _status(monkeypatch, capsys, {"report": said})
    assert status == 3 and "report output" in out and said in err


def test_damage_found_by_check_outweighs_a_partial_report(monkeypatch, capsys):
    status, _, err = _status(monkeypatch, capsys, {"report": f"heapwalk report: {PARTIAL} x",
                                                   "check": "heapwalk check: 2 errors"}, "--check")
    assert status == 1 and "2 errors" in err


def test_a_whole_report_exits_0_and_another_error_2(monkeypatch, capsys):
    assert _status(monkeypatch, capsys, {})[0] == 0
    assert _status(monkeypatch, capsys, {"report": "heapwalk: cannot read the core"})[0] == 2
