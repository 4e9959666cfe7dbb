"""Debian chroots with the gdb and Python that other distributions ship, for the test that heapwalk gives the
same output there as on this machine (tests/matrix/test_chroots.py):

    bullseye  gdb 10.1, Python 3.9   (as RHEL 9 and Debian 11 hosts have)
    trixie    gdb 16,   Python 3.13
    sid       gdb 18,   Python 3.14

Each is made once with debootstrap from the mirror this machine's apt uses, then gdb, Python, gcc and libc's
debug symbols installed in it with its own apt, and kept in ~/.cache/heapwalk/chroots/SUITE (made under a
temporary name and renamed when complete, so an interrupted set-up is started again).  heapwalk is set up in it
as README says: its tracked files copied in (to /opt/heapwalk-src, the project's own path a link to it, so
that a clone elsewhere finds what an earlier one set up), a virtualenv made with the suite's python3 and
heapwalk installed into it by pip, editable, with its C libraries built by the suite's gcc (kept between runs
while pyproject.toml, setup.py and the C sources are unchanged).  Commands run inside it through unshare and
chroot, with /proc mounted for them only.  Needs root.

    python3 cores/scripts/chroots.py SUITE...     # make (or check) the chroots
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sysroots  # noqa: E402

__all__ = ["SUITES", "Chroot", "ChrootError", "prepare", "cache_dir"]

SUITES = ("bullseye", "trixie", "sid")
PACKAGES = ("gdb", "python3", "python3-venv", "gcc", "libc6-dev", "libc6-dbg", "procps")
#: where the project's copy lives inside (its own path there links to it)
SOURCE = Path("/opt/heapwalk-src")
ROOT = Path(__file__).resolve().parents[2]


class ChrootError(RuntimeError):
    """A chroot could not be made or a command in it failed to start."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "heapwalk" / "chroots"


def _run(cmd: list[str], log: Path) -> None:
    with open(log, "a") as out:
        result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise ChrootError(f"{' '.join(cmd[:3])} failed (exit {result.returncode}); see {log}")


@dataclass(frozen=True)
class Chroot:
    """A Debian SUITE's root file system at PATH, with gdb, Python and gcc."""

    suite: str
    path: Path

    def run(self, command: str, timeout: float = 1800, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess:
        """COMMAND (a shell command line) run inside the chroot as root, with /proc mounted for it."""
        inner = f"mount -t proc proc {self.path}/proc && exec chroot {self.path} /bin/sh -c {_quote(command)}"
        full = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
                "HOME": "/root", **(env or {})}
        return subprocess.run(["unshare", "--mount", "--fork", "sh", "-c", inner], capture_output=True, text=True,
                              timeout=timeout, env=full)

    def inside(self, path: Path) -> Path:
        """Where PATH of this machine lies inside the chroot (at the same absolute path)."""
        return self.path / os.path.abspath(path).lstrip("/")

    def copy_in(self, *paths: Path) -> None:
        """PATHS (files or folders) copied into the chroot at their own absolute paths, sparse files kept
        sparse, and the symbolic links on the way to each made there too, so that a path names inside what
        it names here."""
        for p in paths:
            self._links_to(Path(os.path.abspath(p)))
            real = Path(os.path.realpath(p))
            dest = self.path / str(real).lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if real.is_dir():
                subprocess.run(["cp", "-a", "--sparse=always", "-T", str(real), str(dest)], check=True)
            else:
                subprocess.run(["cp", "-a", "--sparse=always", str(real), str(dest)], check=True)

    def _links_to(self, path: Path) -> None:
        """The symbolic links among PATH's leading folders and PATH itself, made inside as they are here."""
        at = Path("/")
        for part in path.parts[1:]:
            at = at / part
            if at.is_symlink():
                inside = self.path / str(at).lstrip("/")
                inside.parent.mkdir(parents=True, exist_ok=True)
                if not inside.is_symlink():
                    if inside.is_dir():
                        shutil.rmtree(inside)
                    elif inside.exists():
                        inside.unlink()
                    inside.symlink_to(os.readlink(at))
                self._links_to(Path(os.path.realpath(at)))

    def versions(self) -> dict[str, str]:
        """The gdb and Python versions inside."""
        out = self.run("gdb --version | head -1; python3 -c 'import sys; print(sys.version.split()[0])'")
        lines = out.stdout.splitlines()
        return {"gdb": lines[0] if lines else "?", "python": lines[1] if len(lines) > 1 else "?"}

    def venv(self, project: Path = ROOT) -> Path:
        """heapwalk set up inside as README says (its source copied in, `copy_project`, a virtualenv of the
        suite's python3 beside it, made once per pyproject.toml, setup.py and C sources); the virtualenv's path
        inside."""
        self.copy_project(project)
        sources = [project / "pyproject.toml", project / "setup.py", *sorted(project.glob("heapwalk/*/_*.c"))]
        # the install is editable: it points at SOURCE, the same for every clone
        stamp = hashlib.sha256(b"".join(p.read_bytes() for p in sources) + self.suite.encode() +
                               str(SOURCE).encode()).hexdigest()[:16]
        venv = Path("/opt/heapwalk-venv")
        marker = self.path / str(venv).lstrip("/") / f".made-{stamp}"
        if not marker.exists():
            shutil.rmtree(self.path / str(venv).lstrip("/"), ignore_errors=True)
            made = self.run(f"python3 -m venv {venv} && {venv}/bin/pip install -q --upgrade pip && "
                            f"cd {SOURCE} && {venv}/bin/pip install -q -e '.[test]' && touch {venv}/.made-{stamp}",
                            env=self._pip_env())
            if made.returncode != 0:
                raise ChrootError(f"setting heapwalk up in the {self.suite} chroot failed: "
                                  f"{(made.stderr or made.stdout)[-2000:]}")
        return venv

    def _pip_env(self) -> dict[str, str]:
        """pip's settings inside: this machine's certificate bundle (a network that inspects TLS signs with a
        certificate only this machine's bundle holds), copied in."""
        bundle = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")
        if not bundle.is_file():
            return {}
        inside = self.path / "etc" / "ssl" / "heapwalk-host-ca.crt"
        inside.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundle, inside)
        return {"PIP_CERT": "/etc/ssl/heapwalk-host-ca.crt", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}

    def copy_project(self, project: Path = ROOT) -> None:
        """The project's tracked files copied to SOURCE inside, over what an earlier run left there (the C
        libraries the editable install built in place stay), and PROJECT's own path inside made a link to it."""
        files = subprocess.run(["git", "ls-files", "-z"], cwd=project, capture_output=True, check=True).stdout
        dest = self.inside(SOURCE)
        link = self.inside(project)
        if not link.is_symlink():
            if link.is_dir():
                shutil.rmtree(link)           # a copy an earlier scheme made at the project's own path
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(dest, link.parent))     # relative: it stays inside from here too
        for name in files.decode().split("\0"):
            if not name or not (project / name).is_file():
                continue
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(project / name, target)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def prepare(suite: str, cache: Path | None = None) -> Chroot:
    """SUITE's chroot: the cached one, else made now (see the module)."""
    if os.geteuid() != 0:
        raise ChrootError("making a chroot needs root (debootstrap, chroot)")
    cache = cache or cache_dir()
    path = cache / suite
    if (path / ".complete").exists():
        return Chroot(suite, path)
    cache.mkdir(parents=True, exist_ok=True)
    building = cache / f"{suite}.new"
    log = cache / f"{suite}.log"
    shutil.rmtree(building, ignore_errors=True)
    log.write_text("")
    if shutil.which("debootstrap") is None:
        raise ChrootError("debootstrap is not installed (make deps installs it)")
    _run(["debootstrap", "--variant=minbase", f"--keyring={sysroots.KEYRING}", suite, str(building),
          sysroots._mirror()], log)
    chroot = Chroot(suite, building)
    # a mirror may serve a suite (sid) whose index is older than its Valid-Until date: apt would refuse it
    install = chroot.run("apt-get -o Acquire::Check-Valid-Until=false update -qq && "
                         "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                         f"--no-install-recommends {' '.join(PACKAGES)}")
    with open(log, "a") as out:
        out.write(install.stdout + install.stderr)
    if install.returncode != 0:
        raise ChrootError(f"installing {', '.join(PACKAGES)} in the {suite} chroot failed; see {log}")
    (building / ".complete").write_text(suite + "\n")
    shutil.rmtree(path, ignore_errors=True)
    building.rename(path)
    return Chroot(suite, path)


def main(argv: list[str] | None = None) -> int:
    for suite in (argv if argv is not None else sys.argv[1:]) or SUITES:
        try:
            chroot = prepare(suite)
        except ChrootError as exc:
            print(f"chroot {suite}: {exc}", file=sys.stderr)
            return 1
        print(f"chroot {suite}: {chroot.path} ({', '.join(f'{k} {v}' for k, v in chroot.versions().items())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
