"""Stopping every thread of a process for a moment with ptrace(2), reading their registers, and letting them go:
what `heapwalk capture` needs to take a core without gdb's attach.

Each thread is seized (PTRACE_SEIZE, which sends no signal) and interrupted; the list of threads is read again
until no new one appears, so a thread being created is caught too.  A thread may report a signal sent to it
meanwhile before it reports the interrupt: it then stays stopped there, and the signal is handed back to it
when it is let go, so that none is lost.  Detaching lets each go on where it was; a system call it was in
is restarted by the kernel (but see signal(7): epoll_wait and a few others return EINTR after any stop).
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass

from heapwalk.arch import DEFAULT, Architecture, host
from heapwalk.common.errors import HeapwalkError

__all__ = ["PtraceError", "StoppedThread", "Stopped", "stop"]

_PTRACE_DETACH, _PTRACE_GETREGSET = 17, 0x4204
_PTRACE_SEIZE, _PTRACE_INTERRUPT = 0x4206, 0x4207
_WALL = 0x40000000
_PTRACE_EVENT_STOP = 128
_NT_PRSTATUS, _NT_FPREGSET = 1, 2
_REGSET_MAX = 4096        # bytes of room for a register set (the kernel says how many it wrote)


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class PtraceError(HeapwalkError):
    """The process could not be stopped (no permission, gone, not ptrace-able)."""


@dataclass(frozen=True)
class StoppedThread:
    """A stopped thread: its id, its general registers (the architecture's user_regs_struct as the kernel gives
    them), its floating-point registers (empty when they cannot be read) and the other register sets a kernel
    core holds for it, (note type, bytes) (`Architecture.thread_notes`)."""

    tid: int
    regs: bytes
    fpregs: bytes
    more: tuple[tuple[int, bytes], ...] = ()


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    return libc


class Stopped:
    """PID with every thread stopped, as a context manager: `threads` holds them (the thread group leader
    first) with the register sets ARCH's kernel core holds (this machine's architecture by default); leaving
    the context lets them all go on."""

    def __init__(self, pid: int, arch: Architecture | None = None):
        self.pid, self.arch = pid, arch or host() or DEFAULT
        self.threads: list[StoppedThread] = []
        self._seized: list[int] = []
        self._signals: dict[int, int] = {}     # tid -> the signal it stopped with, to hand back
        self._libc = _libc()

    def _call(self, request: int, tid: int, addr=None, data=None) -> int:
        ctypes.set_errno(0)
        result = self._libc.ptrace(request, tid, addr, data)
        if result == -1 and ctypes.get_errno():
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return result

    def __enter__(self) -> "Stopped":
        try:
            self._stop_all()
            self.threads = [self._registers(tid) for tid in sorted(self._seized, key=lambda t: t != self.pid)]
        except OSError as exc:
            self._release()
            raise PtraceError(f"cannot stop process {self.pid}: {exc.strerror}") from None
        except BaseException:
            self._release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._release()

    def _stop_all(self) -> None:
        while True:
            try:
                tids = {int(t) for t in os.listdir(f"/proc/{self.pid}/task")}
            except FileNotFoundError:
                raise PtraceError(f"no process {self.pid}") from None
            new = sorted(tids - set(self._seized))
            if not new:
                return
            for tid in new:
                try:
                    self._call(_PTRACE_SEIZE, tid)
                except OSError as exc:
                    if exc.errno == errno.ESRCH:
                        continue         # the thread has just exited
                    raise PtraceError(f"cannot stop thread {tid} of process {self.pid}: {exc.strerror}") from None
                self._seized.append(tid)
                self._call(_PTRACE_INTERRUPT, tid)
                self._signals[tid] = _wait_stopped(tid)

    def _regset(self, tid: int, kind: int, size: int = _REGSET_MAX) -> bytes:
        """Register set KIND (a core note's type) of thread TID, as many bytes as the kernel gives."""
        buffer = ctypes.create_string_buffer(size)
        vector = _IoVec(ctypes.addressof(buffer), size)
        self._call(_PTRACE_GETREGSET, tid, kind, ctypes.addressof(vector))
        return buffer.raw[:vector.iov_len]

    def _registers(self, tid: int) -> StoppedThread:
        regs = self._regset(tid, _NT_PRSTATUS)
        more = []
        for kind, size in self.arch.thread_notes:
            try:
                more.append((kind, self._regset(tid, kind, size)))
            except OSError:
                continue
        try:
            fp = self._regset(tid, _NT_FPREGSET)
        except OSError:
            fp = b""
        return StoppedThread(tid, regs, fp, tuple(more))

    def _release(self) -> None:
        for tid in self._seized:
            try:
                self._call(_PTRACE_DETACH, tid, None, self._signals.get(tid, 0) or None)
            except OSError:
                pass                     # gone meanwhile
        self._seized = []
        self._signals = {}


def _wait_stopped(tid: int) -> int:
    """Waits until TID reports a ptrace stop (or has exited); the signal it stopped to deliver, which it must
    be given back, or 0 (the interrupt, or a group stop: PTRACE_EVENT_STOP)."""
    while True:
        try:
            _, status = os.waitpid(tid, _WALL)
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            return 0
        if os.WIFSTOPPED(status):
            return 0 if status >> 16 == _PTRACE_EVENT_STOP else os.WSTOPSIG(status)


def stop(pid: int) -> Stopped:
    """PID's threads, stopped while the returned context is open."""
    return Stopped(pid)
