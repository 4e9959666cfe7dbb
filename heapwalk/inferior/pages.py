"""Reading a running process without making its kernel allocate or map a page in it.

Every read of another process's memory through /proc/PID/mem (gdb's, and the capture's) faults in the pages it
touches, as if the process had read them itself:
- a page of private anonymous memory it never wrote gets the kernel's zero page mapped, and the page map then
  calls it present (a later report would count it as resident);
- a page of shared memory (MAP_SHARED|MAP_ANONYMOUS, memfd, tmpfs, System V segments) nobody touched gets RAM
  allocated to it: the process's RssShmem and the machine's Shmem grow, and stay grown;
- a page of a file not in its page tables is mapped (RSS grows); a device's may have side effects.

So a page is read from the process only where /proc/PID/pagemap says it is present or swapped out (its bytes
are the process's own; a swapped-out page comes back into RAM as when the process touches it).  Any other page
is never read from the process (`classify`):
- private anonymous memory: zeros, which is what the process would read (`Page.ZEROS`);
- a private mapping of a regular file: the file's bytes at the mapping's offset, read from the file itself
  (/proc/PID/map_files, or the path when its device and inode are the mapped ones): what the process would
  read, since it never wrote the page (`Page.FILE`);
- shared memory, devices, a file that cannot be opened, pages past a file's end: not read at all
  (`Page.ABSENT`, with the reason).
The kernel's zero page mapped where the process (or an older tool) only read untouched memory is present but
holds nothing: `Page.ZERO_PAGE`, known from /proc/kpageflags where this user may read it (root).

`LivePages` answers these for a process and reads through the rules (`LivePages.read`), and lists what no
read gives (`LivePages.absent`) so that a reader leaves it out at once; the capture's core writer
(`heapwalk.capture.corewriter`) plans its segments with the same classes.  Pure Python and numpy, no gdb.
"""

from __future__ import annotations

import bisect
import enum
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heapwalk.common.errors import HeapwalkError
from heapwalk.inferior.memory import ReadError

__all__ = ["Page", "MapsLine", "parse_maps", "read_maps", "classify", "LivePages", "PagesUnknown", "ZeroPages",
           "PAGE", "PRESENT", "SWAPPED", "FILE_PAGE", "EXCLUSIVE", "PFN_MASK"]

PAGE = os.sysconf("SC_PAGE_SIZE")     # this machine's (a live process and its page map are this kernel's)
PRESENT, SWAPPED, FILE_PAGE, EXCLUSIVE = 1 << 63, 1 << 62, 1 << 61, 1 << 56
PFN_MASK = (1 << 55) - 1
#: the kernel's code every process maps: the same image in each, so a page of it the target has not touched is
#: read from this process's own (reading the target's would map the page in it)
VDSO = "[vdso]"
#: special mappings: [vvar] and friends are the kernel's and cannot be read; [vdso] and [vsyscall] are code
SPECIAL = ("[vvar]", "[vvar_vclock]", "[vsyscall]")
#: names the kernel gives anonymous memory that has an inode: private mappings of these are anonymous memory
_ANONYMOUS_FILES = ("/dev/zero (deleted)", "/anon_hugepage (deleted)", "/dev/zero")


class Page(enum.IntEnum):
    """What a page of a mapping is to a reader that must not fault anything in."""

    OWN = 0          # present, the process's own bytes (anonymous, or a private file page it wrote)
    FILE_PAGE = 1    # present, still the file's page (or a shared page): reading it maps nothing new
    SWAPPED = 2      # swapped out: the process's bytes, brought back by a read
    ZEROS = 3        # private anonymous, never written: zeros without a read
    ZERO_PAGE = 4    # present, but the kernel's zero page: zeros, not resident
    FILE = 5         # private file mapping, not in the page tables: the file's bytes, read from the file
    ABSENT = 6       # not read: shared memory or a device not in the page tables, or no way to read it

    @property
    def from_process(self) -> bool:
        """Is this page read from the process's memory (present or swapped)?"""
        return self in (Page.OWN, Page.FILE_PAGE, Page.SWAPPED)


@dataclass(frozen=True)
class MapsLine:
    """One line of /proc/PID/maps: [start, end), perms ("rw-p"), offset in the file, device ("fd:01"),
    inode and name."""

    start: int
    end: int
    perms: str
    offset: int
    device: str
    inode: int
    name: str

    @property
    def shared(self) -> bool:
        return self.perms[3:4] == "s"

    @property
    def file_backed(self) -> bool:
        """A mapping of a file, shared memory object or device (not anonymous memory)?"""
        return self.inode != 0 and self.name.startswith("/")

    @property
    def anonymous(self) -> bool:
        """Private memory whose untouched pages read as zeros (not the vDSO: the kernel's code)."""
        return not self.shared and self.name != VDSO and (not self.file_backed or self.name in _ANONYMOUS_FILES)


def parse_maps(text: str) -> list[MapsLine]:
    """The lines of a /proc/PID/maps text."""
    out = []
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5:
            continue
        start, _, end = fields[0].partition("-")
        try:
            out.append(MapsLine(int(start, 16), int(end, 16), fields[1], int(fields[2], 16), fields[3],
                                int(fields[4]), fields[5].strip() if len(fields) > 5 else ""))
        except ValueError:
            continue
    return out


def read_maps(pid: int) -> list[MapsLine]:
    """PID's mappings (/proc/PID/maps)."""
    return parse_maps(Path(f"/proc/{pid}/maps").read_text(errors="replace"))


class PagesUnknown(HeapwalkError):
    """The process's page map cannot be read: nothing can be read from it without risking a fault."""


def classify(entries: np.ndarray, m: MapsLine, file_ok: bool, zero: ZeroPages | None = None,
             file_pages: int | None = None, device: bool = False) -> np.ndarray:
    """The `Page` of each page of mapping M from its page map ENTRIES (uint64, one a page, from M.start or
    wherever the caller's range begins); FILE_OK says M's file can be read (for a private file mapping);
    ZERO tells the kernel's zero pages (`ZeroPages`); FILE_PAGES, the pages of M's file
    from the range's first page on, where pages past the file's end are absent; DEVICE, M maps a device,
    which is never read."""
    present = (entries & np.uint64(PRESENT)) != 0
    swapped = (entries & np.uint64(SWAPPED)) != 0
    file_page = (entries & np.uint64(FILE_PAGE)) != 0
    out = np.full(len(entries), int(Page.ABSENT), dtype=np.int8)
    if m.name in SPECIAL or device:
        return out
    out[present] = int(Page.OWN)
    out[present & file_page] = int(Page.FILE_PAGE)
    out[swapped & ~present] = int(Page.SWAPPED)
    untouched = ~present & ~swapped
    if m.anonymous:
        out[untouched] = int(Page.ZEROS)
        if zero is not None:
            shared = present & ~file_page & ((entries & np.uint64(EXCLUSIVE)) == 0)
            out[zero.mask(entries, shared)] = int(Page.ZERO_PAGE)
    elif not m.shared and file_ok:
        out[untouched] = int(Page.FILE)
        if file_pages is not None and file_pages < len(out):
            past = np.zeros(len(out), dtype=bool)
            past[max(file_pages, 0):] = True
            out[past & untouched] = int(Page.ABSENT)
    return out


def absent_reason(m: MapsLine | None) -> str:
    """Why the untouched pages of M (None: no mapping) are not read, in a few words."""
    if m is None:
        return "not mapped"
    if m.name in SPECIAL:
        return f"{m.name}, the kernel's"
    if _is_device(m):
        return f"memory of the device {m.name}, never read"
    if m.shared:
        return "shared memory the process has not touched (reading it would allocate it)"
    return f"a page of {m.name} that cannot be read from its file"


def _is_device(m: MapsLine) -> bool:
    """Is M a mapping of a character or block device (other than /dev/zero)?"""
    if not m.file_backed or m.name in _ANONYMOUS_FILES or not m.name.startswith("/dev/"):
        return False
    try:
        mode = os.stat(m.name).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode)


_KPF_ZERO_PAGE = 24
#: the most distinct frames looked up in /proc/kpageflags for one range (pages shared since a fork)
_KPAGEFLAGS_MAX = 1 << 16


class ZeroPages:
    """Which frames are the kernel's zero pages (the small one, or part of the huge one), from
    /proc/kpageflags (root only: elsewhere the page map shows no frame numbers and nothing is known)."""

    def __init__(self):
        self._known: dict[int, bool] = {}
        try:
            self._fd: int | None = os.open("/proc/kpageflags", os.O_RDONLY)
        except OSError:
            self._fd = None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def mask(self, entries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """For the page map ENTRIES, true where a CANDIDATE page (present, anonymous, shared) maps a zero
        page."""
        out = np.zeros(len(entries), dtype=bool)
        if self._fd is None or not candidates.any():
            return out
        frames = entries & np.uint64(PFN_MASK)
        unique = np.unique(frames[candidates])
        if len(unique) > _KPAGEFLAGS_MAX:
            return out
        zero = []
        for pfn in unique.tolist():
            if pfn not in self._known:
                try:
                    flags = int.from_bytes(os.pread(self._fd, 8, pfn * 8), "little")
                except OSError:
                    flags = 0
                self._known[pfn] = pfn != 0 and bool(flags >> _KPF_ZERO_PAGE & 1)
            if self._known[pfn]:
                zero.append(pfn)
        if zero:
            out = candidates & np.isin(frames, np.array(zero, dtype=np.uint64))
        return out


class LivePages:
    """A running process's pages: which may be read (`pages`), and reads that never fault one in (`read`).
    PagesUnknown when its page map cannot be read."""

    def __init__(self, pid: int, maps: list[MapsLine] | None = None):
        self.pid = pid
        try:
            self._pagemap = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
            os.pread(self._pagemap, 8, 0)
        except OSError as exc:
            raise PagesUnknown(f"cannot read /proc/{pid}/pagemap ({exc.strerror})") from None
        try:
            self.maps = maps if maps is not None else read_maps(pid)
        except OSError as exc:
            os.close(self._pagemap)
            raise PagesUnknown(f"cannot read /proc/{pid}/maps ({exc.strerror})") from None
        self._starts = [m.start for m in self.maps]
        self._files: dict[int, int | None] = {}     # mapping start -> an open descriptor of its file
        self._sizes: dict[int, int] = {}
        self._shift: dict[int, int] = {}            # mapping start -> where its bytes are read from, less address
        self._devices: dict[int, bool] = {}
        self._zero = ZeroPages()

    def close(self) -> None:
        os.close(self._pagemap)
        self._zero.close()
        for fd in self._files.values():
            if fd is not None:
                os.close(fd)
        self._files.clear()

    def __enter__(self) -> "LivePages":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def entries(self, lo: int, hi: int) -> np.ndarray:
        """The page map entries of the pages of [LO, HI) (page-aligned)."""
        n = (hi - lo) // PAGE
        data = os.pread(self._pagemap, n * 8, lo // PAGE * 8)
        if len(data) != n * 8:
            raise PagesUnknown(f"the page map of {self.pid} ends before {hi:#x}")
        return np.frombuffer(data, dtype=np.uint64)

    def mapping_at(self, address: int) -> MapsLine | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address < self.maps[i].end:
            return self.maps[i]
        return None

    def file_of(self, m: MapsLine) -> int | None:
        """An open descriptor of the regular file M maps (the very one: map_files, or the path when its
        device and inode match), or None."""
        if m.start in self._files:
            return self._files[m.start]
        fd = None
        if m.name == VDSO:
            fd = self._own_vdso(m)
        elif m.file_backed and not m.shared and not m.anonymous and not self.device(m):
            for path in (f"/proc/{self.pid}/map_files/{m.start:x}-{m.end:x}", m.name):
                try:
                    candidate = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                except OSError:
                    continue
                st = os.fstat(candidate)
                if stat.S_ISREG(st.st_mode) and st.st_ino == m.inode and \
                        f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}" == m.device:
                    fd = candidate
                    self._sizes[m.start] = st.st_size
                    break
                os.close(candidate)
        self._files[m.start] = fd
        return fd

    def _own_vdso(self, m: MapsLine) -> int | None:
        """A descriptor of this process's memory when its vDSO is as long as M (the target's): its pages are
        the target's (the kernel maps one image into every process); None otherwise."""
        mine = [x for x in read_maps(os.getpid()) if x.name == VDSO]
        if len(mine) != 1 or mine[0].end - mine[0].start != m.end - m.start:
            return None
        try:
            fd = os.open("/proc/self/mem", os.O_RDONLY)
        except OSError:
            return None
        self._sizes[m.start] = m.end - m.start
        self._shift[m.start] = mine[0].start - m.start
        return fd

    def pages(self, m: MapsLine, lo: int | None = None, hi: int | None = None) -> np.ndarray:
        """The `Page` of each page of [LO, HI) of mapping M (the whole mapping by default)."""
        lo = m.start if lo is None else lo
        hi = m.end if hi is None else hi
        fd = self.file_of(m)
        file_pages = None
        if fd is not None:
            file_pages = -(-(self._sizes[m.start] - m.offset - (lo - m.start)) // PAGE)
        return classify(self.entries(lo, hi), m, fd is not None, self._zero, file_pages, self.device(m))

    def device(self, m: MapsLine) -> bool:
        """Does M map a device (whose memory is never read: a read may have effects)?"""
        if m.start not in self._devices:
            self._devices[m.start] = _is_device(m)
        return self._devices[m.start]

    def read_file(self, m: MapsLine, address: int, size: int) -> bytes:
        """SIZE bytes of M's file where M maps them at ADDRESS, zeros past the file's end within its last
        page (as the process sees them)."""
        fd = self.file_of(m)
        if fd is None:
            raise ReadError(address, size, absent_reason(m))
        data = os.pread(fd, size, self._shift.get(m.start, m.offset - m.start) + address)
        return data + bytes(size - len(data))

    def plan(self, address: int, size: int) -> list[tuple[int, int, Page, MapsLine | None]]:
        """[ADDRESS, ADDRESS+SIZE) cut into (start, end, `Page`, mapping) pieces of one kind each."""
        out: list[tuple[int, int, Page, MapsLine | None]] = []
        at, end = address, address + size
        while at < end:
            m = self.mapping_at(at)
            if m is None:
                nxt = bisect.bisect_right(self._starts, at)
                stop = min(end, self.maps[nxt].start) if nxt < len(self.maps) else end
                out.append((at, stop, Page.ABSENT, None))
                at = stop
                continue
            stop = min(end, m.end)
            lo, hi = at // PAGE * PAGE, -(-stop // PAGE) * PAGE
            kinds = self.pages(m, lo, hi)
            bounds = [0, *(np.flatnonzero(np.diff(kinds)) + 1).tolist(), len(kinds)]
            for a, b in zip(bounds[:-1], bounds[1:]):
                out.append((max(at, lo + a * PAGE), min(stop, lo + b * PAGE), Page(int(kinds[a])), m))
            at = stop
        return out

    def read(self, address: int, size: int, raw, plan=None) -> bytes:
        """SIZE bytes at ADDRESS, reading through RAW(address, size) only the pages present or swapped out
        (PLAN: `plan`'s pieces of the range, when the caller has them); ReadError at the first byte no rule
        may give."""
        out = bytearray()
        for lo, hi, kind, m in plan if plan is not None else self.plan(address, size):
            n = hi - lo
            if kind.from_process:
                data = bytes(raw(lo, n))
                if len(data) != n:
                    raise ReadError(lo, n, "unreadable")
                out += data
            elif kind in (Page.ZEROS, Page.ZERO_PAGE):
                out += bytes(n)
            elif kind is Page.FILE and m is not None:
                out += self.read_file(m, lo, n)
            else:
                raise ReadError(lo, n, absent_reason(m))
        return bytes(out)

    def absent(self) -> list[tuple[int, int]]:
        """The runs of readable mappings no read gives (`Page.ABSENT`): for a reader to leave out at once."""
        out: list[tuple[int, int]] = []
        for m in self.maps:
            if m.perms[0] != "r" or m.anonymous:
                continue
            kinds = self.pages(m)
            bounds = [0, *(np.flatnonzero(np.diff(kinds)) + 1).tolist(), len(kinds)]
            out += [(m.start + a * PAGE, m.start + b * PAGE) for a, b in zip(bounds[:-1], bounds[1:])
                    if kinds[a] == Page.ABSENT]
        return out
