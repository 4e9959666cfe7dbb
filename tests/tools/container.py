"""A program run as a container runs it: in a mount and a pid namespace of its own, its root a folder made the
root by pivot_root (the old root unmounted), so that /proc/PID/maps on this machine names its files by the
container's paths, which here name other files or none.

    python tests/tools/container.py ROOT PROGRAM [ARGS...]

Run as root.  The namespace's first process (its pid 1, as a container's init) starts the program (pid 2 there:
the first process of a pid namespace ignores the signals it has no handler for, its own SIGSTOP among them) and
waits for it; this process waits for both, and exits with the program's status."""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enter(root: str) -> None:
    """Makes ROOT this process's root in a mount namespace of its own, the old root gone, its /proc the pid
    namespace's."""
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
    _check(_libc.mount(root.encode(), root.encode(), None, MS_BIND | MS_REC, None), "binding the root")
    os.chdir(root)
    os.makedirs("old-root", exist_ok=True)
    _check(_libc.syscall(SYS_PIVOT_ROOT[os.uname().machine], b".", b"old-root"), "pivot_root")
    os.chroot(".")
    os.chdir("/")
    _check(_libc.umount2(b"/old-root", MNT_DETACH), "unmounting the old root")
    os.rmdir("/old-root")
    os.makedirs("/proc", exist_ok=True)
    _check(_libc.mount(b"proc", b"/proc", b"proc", 0, None), "mounting the namespace's /proc")


def main(argv: list[str]) -> int:
    root, program = os.path.abspath(argv[1]), argv[2:]
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWPID), "unshare")
    child = os.fork()                     # the pid namespace's first process
    if child == 0:
        try:
            _enter(root)
            work = os.fork()
            if work == 0:
                os.execv(program[0], program)
            _, status = os.waitpid(work, 0)
            os._exit(os.waitstatus_to_exitcode(status))
        except OSError as exc:
            sys.stderr.write(f"container: {exc}\n")
            os._exit(127)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
