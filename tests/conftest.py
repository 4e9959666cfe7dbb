"""Shared fixtures: reproducer cores (captured once per session) and gdb runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "cores"))
sys.path.insert(0, str(ROOT / "tests"))

import harness  # noqa: E402

CORES = Path(os.environ.get("HEAPWALK_CORES", ROOT / "build" / "cores" / "system"))
BINDIR = ROOT / "build" / "bin"
GDBINIT = ROOT / "gdbinit"


def _fresh(name: str) -> bool:
    d = CORES / name
    needed = [d / "core", d / "malloc_info.xml", d / "ledger.json", d / "meta.json"]
    if not all(p.exists() for p in needed):
        return False
    sources = [ROOT / "cores" / f"{name}.c", ROOT / "cores" / "hw.c", ROOT / "cores" / "hw.h"]
    return min(p.stat().st_mtime for p in needed) >= max(p.stat().st_mtime for p in sources)


@pytest.fixture(scope="session")
def cores() -> dict[str, harness.Capture]:
    """Every reproducer's capture (taken now unless 'make cores' left fresh ones)."""
    out = {}
    for name in harness.REPRODUCERS:
        if not _fresh(name):
            harness.capture(name, CORES, BINDIR)
        meta = json.loads((CORES / name / "meta.json").read_text())
        out[name] = harness.Capture(name=name, directory=CORES / name, exe=Path(meta["exe"]), pid=meta["pid"])
    return out


def run_gdb(target_args: list[str], commands: list[str], iex: list[str] = (), timeout: float = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs gdb -batch with heapwalk loaded and COMMANDS, on TARGET_ARGS (exe core, or -p PID)."""
    cmd = ["gdb", "-nx", "-batch", "-q"]
    for c in iex:
        cmd += ["-iex", c]
    cmd += ["-x", str(GDBINIT)]
    for c in commands:
        cmd += ["-ex", c]
    cmd += target_args
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)


def heapwalk_json(target_args: list[str], tmp_path: Path, iex: list[str] = ()) -> dict:
    """heapwalk's full JSON document for a target ('heapwalk arenas --json')."""
    out = tmp_path / f"heapwalk-{len(list(tmp_path.iterdir()))}.json"
    result = run_gdb(target_args, [f"heapwalk arenas --json {out}"], iex=iex)
    assert out.exists(), f"heapwalk wrote no JSON:\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stdout + result.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="session")
def core_json(cores, tmp_path_factory) -> dict[str, dict]:
    """heapwalk's JSON for every reproducer core, computed once."""
    tmp = tmp_path_factory.mktemp("json")
    return {name: heapwalk_json([str(c.exe), str(c.core)], tmp) for name, c in cores.items()}
