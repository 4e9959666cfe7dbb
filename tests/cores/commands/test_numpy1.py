"""The unit tier under numpy 1, as the gdb of Debian bookworm (python3-numpy 1.24: the arm64 machine's gdb runs
on it) and bullseye loads it.  numpy 2 takes a Python int beside a uint64 array as a uint64 (NEP 50); numpy 1
makes both float64 and refuses a shift of them, so an expression the venv's numpy 2 passes can fail every
command on those machines (it did: `uint64 << 3` in the blocks' ends)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT

pytestmark = pytest.mark.cores

#: what the unit tier needs besides numpy (pyproject's dependencies), in a virtualenv of this interpreter kept in
#: the build folder (the C libraries built beside the sources are this interpreter's)
_PACKAGES = ("numpy<2", "rich", "pygdbmi", "pytest")


def _venv() -> str:
    """The virtualenv's Python, made once (pip from the package registry)."""
    venv = BUILD / "venv-numpy1"
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *_PACKAGES], check=True, timeout=900,
                       stdout=subprocess.DEVNULL)
        marker.write_text(" ".join(_PACKAGES) + "\n")
    return str(python)


def test_the_unit_tier_passes_under_numpy_1():
    python = _venv()
    version = subprocess.run([python, "-c", "import numpy; print(numpy.__version__)"], capture_output=True,
                             text=True, check=True).stdout.strip()
    assert version.startswith("1."), version
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    # the house rules read the sources' text, the same under any numpy: not run again
    result = subprocess.run([python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/unit",
                             "--ignore=tests/unit/house"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.splitlines()[-1]
