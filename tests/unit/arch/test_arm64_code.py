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
    assert code.READER.tls_slot(F, AT) == DATA + 0x100      # the word added to tpidr_el0


def test_a_constant_returned_and_an_unoptimised_functions_body():
    assert code.READER.returned_constant(G) == 0x51234 and code.READER.returned_constant(H) is None
    assert code.READER.frame_body(H) == 12 and code.READER.frame_body(G) is None


@pytest.mark.parametrize("dtv,length,generation,intact", [(0x5000, 64, 1, True), (0, 0, 0, False),
                                                          (0x5004, 64, 1, False), (0x5000, 1 << 40, 1, False)])
def test_a_thread_control_block_is_whole_when_its_dtv_looks_like_one(dtv, length, generation, intact):
    words = {0x9000: dtv, dtv - 8: length, dtv: generation}
    assert ARM64.tcb_intact(lambda at: words.get(at, 0), 0x9000) == intact
