"""arm64 through the architecture seam: found by its ELF machine and gdb's name, and its `CodeReader` on A64
code whose reading binutils gave (aarch64-linux-gnu-as and objdump 2.40, at 0x400000, its data page at
0x423000): each instruction shape discovery looks for, in the pairs compilers emit (adrp with add or ldr)."""

from __future__ import annotations

import pytest

from heapwalk import arch
from heapwalk.arch.arm64 import ARM64
from heapwalk.arch.arm64 import code

AT = 0x400000
#: bti c; adrp x1 / ldr x1; adrp x0 / add x0 (+0x20); bl g; adrp x3 / ldr w2 (+0x40); adrp x4 / ldrb w5 (+0x48);
#: adrp x6 / strb w7 (+0x49); lsr x8, x9, #12; adrp x22 / ldr x22 (+0x100); mrs x20, tpidr_el0;
#: add x24, x20, x22; adr x10 (+8); ldr x11, lit; ret; lit (8 bytes)
F = bytes.fromhex("5f2403d5010100f0210040f9000100f00080009111000094030100f0624040b9040100f085204139060100f0c72401"
                  "3928fd4cd3160100f0d68240f954d03bd59802168b2a7e11104b000058c0035fd60000000000000000")
#: g: mov w0, #0x1234; movk w0, #0x5, lsl #16; ret
G = bytes.fromhex("80468252a000a072c0035fd6")
#: h: stp x29, x30, [sp, #-32]!; mov x29, sp; nop; ldp x29, x30, [sp], #32; ret
H = bytes.fromhex("fd7bbea9fd0300911f2003d5fd7bc2a8c0035fd6")
DATA = 0x423000


def test_arm64_is_found_by_its_elf_machine_and_by_gdbs_name():
    assert arch.by_elf_machine(183) is ARM64 and arch.by_gdb_name("aarch64") is ARM64
    assert ARM64.thread_pointer == "tpidr" and not ARM64.tls_below_thread_pointer and ARM64.tcb_size == 16


def test_addresses_computed_and_words_read_through_adrp_pairs_and_in_one_instruction():
    refs = [(r.offset, r.target, r.computes, r.argument) for r in code.READER.address_refs(F, AT)]
    assert refs == [(8, DATA, False, 1), (16, DATA + 0x20, True, 0), (56, DATA + 0x100, False, None),
                    (68, DATA + 8, True, None), (72, AT + 0x50, False, None)]
    assert [(r.offset, r.target) for r in code.READER.loads32(F, AT)] == [(28, DATA + 0x40)]
    assert [r.target for r in code.READER.all_refs(F, AT)] == [DATA, DATA + 0x20, DATA + 0x40, DATA + 0x48,
                                                                DATA + 0x100, DATA + 8, AT + 0x50]
    assert code.READER.byte_loads(F, AT) == [DATA + 0x48] and code.READER.byte_stores(F, AT) == [DATA + 0x49]
    assert code.READER.first_address(F, AT) == DATA + 0x20 and code.READER.first_load(F, AT) == DATA


def test_calls_shifts_and_the_tls_slot_read_beside_tpidr():
    assert code.READER.calls(F, AT) == [AT + 0x58]
    assert code.READER.call_at(F, 0x14) and not code.READER.call_at(F, 0x18)
    assert code.READER.first_shift_right(F) == 12
    # lsl x11, x24, #4; ubfiz x17, x16, #3, #12 (shifts left); ubfx x24, x21, #32, #4 (a leaf key's cache slot)
    assert code.READER.first_shift_right(bytes.fromhex("0bef7cd3112e7dd3b88e60d3")) == 32
    assert code.READER.tls_slot(F, AT) == DATA + 0x100      # the word added to tpidr_el0


def test_a_constant_returned_and_an_unoptimised_functions_body():
    assert code.READER.returned_constant(G) == 0x51234 and code.READER.returned_constant(H) is None
    assert code.READER.frame_body(H) == 12 and code.READER.frame_body(G) is None


@pytest.mark.parametrize("dtv,length,generation,intact", [(0x5000, 64, 1, True), (0, 0, 0, False),
                                                          (0x5004, 64, 1, False), (0x5000, 1 << 40, 1, False)])
def test_a_thread_control_block_is_whole_when_its_dtv_looks_like_one(dtv, length, generation, intact):
    words = {0x9000: dtv, dtv - 8: length, dtv: generation}
    assert ARM64.tcb_intact(lambda at: words.get(at, 0), 0x9000) == intact


#: a function that reports a constant as mallctl's read-only functions do (written for this test: if newp or
#: newlen, EPERM; else oldval = 52, copied to oldp), built by aarch64-linux-gnu-gcc 12 with -O2
#: -fstack-protector-strong: the stack guard stored to its slot, then ``mov w0, #0x34; str w0, [sp, #52]``
REPORTS_O2 = bytes.fromhex("01000090210040f9fd7bbca9a50006aafd030091200040f9e01f00f9000080d220008052650100b5"
                           "80068052e03700b97f0000f1841840faa0000054820040f95f1000f181010054")
#: the same with -O0: the arguments stored to the frame, EPERM (``mov w0, #1; str w0, [sp, #92]``) to the slot
#: returned in w0 at the end (``ldr w0, [sp, #92]``), then the constant to its own slot (``str w0, [sp, #88]``)
REPORTS_O0 = bytes.fromhex(
    "fd7bb9a9fd030091e02700f9e12300f9e21f00f9e31b00f9e41700f9e51300f9e60f00f900000090000040f9010040f9e13700f9010080"
    "d2e01340f91f0000f181000054e00f40f91f0000f18000005420008052e05f00b92200001480068052e05b00b9e01b40f91f0000f18003"
    "0054e01740f91f0000f120030054e01740f9000040f91f1000f140020054e01740f9000040f9810080d21f1000f10090819ae03300f9e0"
    "630191e23340f9e10300aae01b40f900000094e01740f9e13340f9010000f9c0028052e05f00b905000014e15b40b9e01b40f9010000b9"
    "ff5f00b9e05f40b9")


def test_the_constant_a_function_stores_before_reporting_it():
    assert code.READER.stored_constant(REPORTS_O2) == 52
    assert code.READER.stored_constant(REPORTS_O0) == 52                # not EPERM, the slot it returns
    movz = bytes.fromhex("80068052")                                    # mov w0, #0x34
    assert code.READER.stored_constant(REPORTS_O2.replace(movz, bytes.fromhex("2000a052"))) == 65536  # #1, lsl 16
    store = bytes.fromhex("e03700b9")                                   # str w0, [sp, #52]
    assert code.READER.stored_constant(REPORTS_O2.replace(store, bytes.fromhex("ffd30039"))) == 0     # strb wzr
    assert code.READER.stored_constant(REPORTS_O2[:40]) is None         # only the guard stored
