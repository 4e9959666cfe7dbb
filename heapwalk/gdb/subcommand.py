"""The base of heapwalk's gdb subcommands: arguments parsed with argparse (its errors and help as gdb's),
each command run with gdb's permissions to change the target off, and errors shown in one line."""

from __future__ import annotations

import argparse
import traceback

import gdb  # type: ignore[import-not-found]

from heapwalk.gdb.console import read_only
from heapwalk.common.errors import CannotDecode, UsageError
from heapwalk.gdb.session import Settings, UserError
from heapwalk.inferior.gcpause import gc_paused
from heapwalk.inferior.ownmemory import freed_memory_kept
from heapwalk.inferior.pages import PagesUnknown

__all__ = ["Parser", "Subcommand", "json_option"]


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would exit gdb
        raise UserError(f"{self.prog}: {message} (see 'help {self.prog}')")

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            gdb.write(message)
        raise _HelpShown()


class _HelpShown(Exception):
    pass


class Subcommand(gdb.Command):
    """Base: argparse-based subcommand of ``heapwalk``."""

    name = ""

    def __init__(self):
        self.parser = self.make_parser()
        self.__doc__ = self.parser.format_help()
        super().__init__(f"heapwalk {self.name}", gdb.COMMAND_DATA)

    def make_parser(self) -> argparse.ArgumentParser:
        raise NotImplementedError

    def run(self, args) -> None:
        raise NotImplementedError

    def parse(self, argv: list[str]):
        """The arguments ARGV say, as `run` takes them."""
        return self.parser.parse_args(argv)

    def invoke(self, argument: str, from_tty: bool) -> None:
        try:
            args = self.parse(gdb.string_to_argv(argument))
            with read_only(), gc_paused(), freed_memory_kept():
                self.run(args)
        except _HelpShown:
            return
        except PagesUnknown as exc:
            raise gdb.GdbError(f"heapwalk {self.name}: {exc}: heapwalk reads a running process only where its "
                               "page map says a read allocates nothing in it; run gdb as the process's user "
                               "or as root") from None
        except (UsageError, CannotDecode) as exc:
            raise gdb.GdbError(str(exc)) from None
        except OSError as exc:  # a --json/--xml FILE that cannot be written, mostly
            where = f"cannot write {exc.filename}" if exc.filename else "system error"
            raise gdb.GdbError(f"heapwalk {self.name}: {where}: {exc.strerror or exc}") from None
        except gdb.GdbError:
            raise
        except Exception as exc:  # an internal error: one line unless debugging
            if Settings.debug is not None and Settings.debug.value:
                traceback.print_exc()
            raise gdb.GdbError(f"heapwalk {self.name}: internal error: {type(exc).__name__}: {exc} "
                               "('set heapwalk debug on' shows a traceback)") from None


def json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="also write the result as JSON (schema: docs/json.md)")
