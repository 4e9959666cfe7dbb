"""One gdb under its machine interface (pygdbmi), with heapwalk loaded into its Python: the command line runs
the same commands a gdb user would, so text and JSON are the same as inside gdb; and the errors it reports."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

from heapwalk.arch import known
from heapwalk.common.errors import HeapwalkError
from heapwalk.common.relay import PROGRESS, RELAY, SAY


EXIT_DAMAGED, EXIT_ERROR, EXIT_PARTIAL = 1, 2, 3


class CliError(HeapwalkError):
    """A message for the user and the exit status that goes with it."""

    def __init__(self, message: str, status: int = EXIT_ERROR, output: str = ""):
        super().__init__(message)
        self.status = status
        self.output = output      # what a failed gdb command printed before its error


def _mi_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Gdb:
    """One gdb process under pygdbmi, with heapwalk loaded; `run` gives a console command's output."""

    def __init__(self, gdb: str, sysroot: Path | None = None, symbols: bool = True):
        from pygdbmi.gdbcontroller import GdbController

        path = shutil.which(gdb)
        if path is None:
            raise CliError(f"heapwalk: gdb not found ({gdb}): install it (Debian: apt install gdb) or give --gdb PATH")
        relay = sys.stderr.isatty()           # its progress and the costs it says, shown as they come
        if relay:
            os.environ[RELAY] = "1"
        try:
            self._ctl = GdbController(command=[path, "--nx", "--quiet", "--interpreter=mi3"],
                                      time_to_check_for_additional_output_sec=0.05)
        finally:
            os.environ.pop(RELAY, None)
        self._shown = ""
        self.warnings: list[str] = []
        self.keep = None  # whatever must live as long as this gdb (a padded copy of a truncated core)
        for setting in ["set pagination off", "set confirm off", "set width 0", "set height 0",
                        "set print thread-events off"]:
            self.run(setting)
        if not symbols:
            self.run("set debug-file-directory /nonexistent")
        if sysroot is not None:
            self.run(f"set sysroot {sysroot}")
            multiarch = [folder / a.multiarch for a in known() for folder in (sysroot / "lib", sysroot / "usr" / "lib")]
            libdirs = [d for d in (*multiarch, sysroot / "lib64", sysroot / "lib") if d.is_dir()]
            if libdirs:
                self.run("set solib-search-path " + ":".join(map(str, libdirs)))
                self.run(f"set libthread-db-search-path {libdirs[0]}")
            if (sysroot / "usr" / "lib" / "debug").is_dir() and symbols:
                self.run(f"set debug-file-directory {sysroot / 'usr' / 'lib' / 'debug'}")
        self._load_heapwalk()

    def _load_heapwalk(self) -> None:
        """heapwalk and its dependencies on gdb's sys.path (gdb embeds the system Python, not ours); CliError
        naming the module gdb's Python cannot import, and that Python, when it cannot load them."""
        import rich

        paths = [str(Path(__file__).resolve().parents[2]), str(Path(rich.__file__).resolve().parent.parent)]
        code = ("import sys\n"
                "sys.path[:0] = [p for p in %r if p not in sys.path]\n"
                "try:\n"
                "    import heapwalk\n"
                "    refused = heapwalk.load()\n"
                "    print('heapwalk-refused|' + refused if refused else 'heapwalk-loaded')\n"
                "except ImportError as exc:\n"
                "    print('heapwalk-missing %%s|%%d.%%d|%%s' %% (exc.name or exc, sys.version_info[0], "
                "sys.version_info[1], sys.executable))\n" % (paths,))
        out = self.run(f"python exec({code!r})")
        if "heapwalk-loaded" in out:
            return
        refused = re.search(r"heapwalk-refused\|(.*)", out)
        if refused:
            raise CliError(refused.group(1))
        missing = re.search(r"heapwalk-missing (.*)\|(\d+\.\d+)\|(.*)", out)
        if missing:
            module, version, executable = missing.groups()
            ours = "%d.%d" % sys.version_info[:2]
            raise CliError(f"heapwalk: gdb's Python {version} ({executable}) cannot import {module}: the heapwalk "
                           f"command line runs on Python {ours} ({sys.executable}), and its packages do not load "
                           f"into gdb's; install heapwalk with gdb's Python ('{executable} -m venv ...', or "
                           "'make venv', which does)")
        raise CliError(f"heapwalk: cannot load heapwalk into gdb's Python: {out.strip()}")

    def run(self, command: str, timeout: float = 3600.0) -> str:
        """COMMAND's console output; CliError with gdb's message when it fails."""
        self._ctl.write(f"-interpreter-exec console {_mi_quote(command)}", read_response=False)
        out: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in self._ctl.get_gdb_response(timeout_sec=0.5, raise_error_on_timeout=False):
                kind, payload = record.get("type"), record.get("payload")
                if kind in ("console", "target", "output") and isinstance(payload, str):
                    out.append(payload)
                elif kind == "log" and isinstance(payload, str):
                    if payload.startswith((f"{PROGRESS}|", f"{SAY}|")):
                        self._relayed(payload.strip())
                    elif payload.startswith("warning:"):
                        self.warnings.append(payload.strip())
                elif kind == "result":
                    if record.get("message") == "error":
                        message = (payload or {}).get("msg", "error") if isinstance(payload, dict) else str(payload)
                        raise CliError(message, EXIT_ERROR, "".join(out))
                    return "".join(out)
        raise CliError(f"heapwalk: gdb did not finish '{command}' within {timeout:.0f} s")

    def _relayed(self, line: str) -> None:
        """A line heapwalk in gdb relays to a user at a terminal (`console.say_now`, `console.progress_bar`), shown
        on our standard error at once: a progress line is written over the last one, and wiped when it ends."""
        kind, _, rest = line.partition("|")
        wipe = "\r" + " " * len(self._shown) + "\r" if self._shown else ""
        if kind == SAY:
            sys.stderr.write(f"{wipe}{rest}\n")
            self._shown = ""
        else:
            label, done, total = (rest.split("|") + ["", ""])[:3]
            self._shown = "" if done == "end" or not total.isdigit() else \
                f"{label}: {int(done) / (1 << 30):.1f} of {int(total) / (1 << 30):.1f} GiB" \
                f" ({100 * int(done) // max(int(total), 1)}%)"
            sys.stderr.write(wipe + self._shown)
        sys.stderr.flush()

    def close(self) -> None:
        try:
            self._ctl.exit()
        except Exception:
            pass
        if self.keep is not None:
            self.keep.cleanup()
            self.keep = None

    def __enter__(self) -> "Gdb":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
