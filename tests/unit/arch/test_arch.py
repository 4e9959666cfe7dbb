"""The architecture seam (heapwalk/arch): each architecture found by its ELF machine and by gdb's name, an
unknown one refused in one line, and a toy architecture served through the seam to code that reads machine
code and thread control blocks, without a line of that code knowing it."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest

from heapwalk import arch
from heapwalk.arch import Architecture, CodeRef, UnknownArchitecture
from heapwalk.arch.x86_64 import X86_64
from heapwalk.common.errors import CannotDecode
from heapwalk.glibc.locate.layout import layout_for
from heapwalk.glibc.locate.discovery import Discovery
from heapwalk.glibc.locate.mainarena import trim_target
from heapwalk.glibc.walk.threads import decode_thread
from heapwalk.inferior.elf import ElfImage
from heapwalk.inferior.image import ImageMemory
from heapwalk.inferior.threads import ThreadRegs

TOY_MACHINE = 0x7777
#: the toy's one instruction that computes an address: "ADR!" then the 8-byte address itself
_ADR = b"ADR!"


class _ToyCode:
    """A CodeReader for the toy: only ``ADR!`` + address is understood."""

    def address_refs(self, code: bytes, at: int) -> list[CodeRef]:
        out, i = [], code.find(_ADR)
        while i >= 0:
            target, = struct.unpack_from("<Q", code, i + 4)
            out.append(CodeRef(i, target, True, 12, None, i + 12))
            i = code.find(_ADR, i + 12)
        return out

    def first_address(self, code: bytes, at: int) -> int | None:
        refs = self.address_refs(code, at)
        return refs[0].target if refs else None

    def __getattr__(self, name):
        return lambda *args: []


TOY = Architecture(name="toy", multiarch="toy-linux-gnu", elf_machine=TOY_MACHINE, gdb_names=("toy",),
                   thread_pointer="tp", stack_pointer="sp", page_size=16384, tls_below_thread_pointer=False,
                   reloc_tpoff64=1, reloc_dtpmod64=2, code=_ToyCode(),
                   tcb_intact=lambda word_at, tp: word_at(tp) == 0x70E, tcb_holds="the toy's mark")


@pytest.fixture()
def toy():
    arch.register(TOY)
    yield TOY
    arch._KNOWN.remove(TOY)


def _image(machine: int, base: int = 0x400000) -> tuple[ImageMemory, ElfImage]:
    """A one-segment ELF image of MACHINE at BASE in fresh memory."""
    ehdr = bytearray(64)
    ehdr[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<HH", ehdr, 16, 3, machine)
    struct.pack_into("<Q", ehdr, 32, 64)
    struct.pack_into("<HH", ehdr, 54, 56, 1)
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, 0x2000, 0x2000, 0x1000)
    mem = ImageMemory({base: bytes(ehdr) + phdr + bytes(0x2000 - 64 - len(phdr))})
    return mem, ElfImage.read(mem, base, "/lib/libc.so.6")


def test_x86_64_is_found_by_its_elf_machine_and_by_gdb_s_name():
    assert arch.by_elf_machine(62) is X86_64 and arch.by_gdb_name("i386:x86-64") is X86_64
    assert arch.DEFAULT is X86_64 and X86_64 in arch.known()
    _, image = _image(62)
    assert image.arch is X86_64 and image.code is X86_64.code


def test_an_unknown_architecture_is_refused_in_one_line_naming_those_read():
    with pytest.raises(UnknownArchitecture) as caught:
        arch.by_gdb_name("mips")
    assert str(caught.value) == "this target's architecture (mips) is not one heapwalk reads (x86-64, arm64)"



def test_an_object_whose_header_names_another_machine_cannot_be_decoded_in_one_line():
    """In a target heapwalk reads, an object whose ELF header names a machine it reads none of is damaged (or
    foreign): what needs its code cannot be decoded, said in one line naming the object and the machine (the
    target's other allocators are still decoded), never the target's architecture refused."""
    _, image = _image(0x4141)
    for ask in (lambda: image.arch, lambda: image.code):
        with pytest.raises(CannotDecode) as caught:
            ask()
        assert str(caught.value) == ("/lib/libc.so.6 at 0x400000: its ELF header says machine 16705, not one heapwalk "
                                     "reads (x86-64, arm64): damaged, or foreign")


def test_a_toy_architecture_serves_glibc_s_discovery_its_code_and_its_thread_blocks(toy):
    """glibc's main_arena from malloc_trim's code, read by the image's architecture; a thread's TLS judged
    whole or lost by the target's: no line of glibc's code names either."""
    mem, image = _image(TOY_MACHINE)
    assert arch.by_elf_machine(TOY_MACHINE) is toy and image.arch is toy
    code = b"\0" * 5 + _ADR + struct.pack("<Q", 0x7F0000001000) + b"\0" * 16
    search = SimpleNamespace(image=image, code=lambda function, size: (code, 0x401000))
    assert trim_target(search) == 0x7F0000001000

    tls = 0x7F0000100000
    mem.add(tls, struct.pack("<Q", 0x70E) + bytes(0xFF8))
    disc = Discovery((2, 36), layout_for((2, 36)), None, None, None, None, None)
    whole, _ = decode_thread(mem, disc, ThreadRegs(1, 100, tls), None, toy)
    lost, _ = decode_thread(mem, disc, ThreadRegs(2, 101, tls + 8), None, toy)
    assert not whole.tls_lost and lost.tls_lost
    as_x86, _ = decode_thread(mem, disc, ThreadRegs(1, 100, tls), None, X86_64)
    assert as_x86.tls_lost  # x86-64's block starts with a pointer to itself, which the toy's does not


def test_a_core_of_another_architecture_is_refused_in_one_line_by_the_command_line(tmp_path):
    """A MIPS core (ELF machine 8) is named and refused before gdb opens it, not read as x86-64."""
    from heapwalk.cli.cores import resolve_core
    from heapwalk.cli.gdbmi import CliError
    header = bytearray(64)
    header[:7] = b"\x7fELF\x02\x01\x01"
    struct.pack_into("<HH", header, 16, 4, 8)         # ET_CORE, EM_MIPS
    struct.pack_into("<Q", header, 32, 64)
    struct.pack_into("<HH", header, 54, 56, 0)
    core = tmp_path / "core"
    core.write_bytes(bytes(header))
    with pytest.raises(CliError) as caught:
        resolve_core(core, None)
    assert str(caught.value) == (f"heapwalk: {core}: this target's architecture (ELF machine 8) is not one "
                                 "heapwalk reads (x86-64, arm64)")
