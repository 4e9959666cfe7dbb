"""What a command over a big heap is expected to cost, and whether this machine has the memory for it
(`analysis.sizing`); the refusals in gdb are in tests/cores/commands/test_budget.py."""

from __future__ import annotations

from heapwalk.analysis import sizing

GIB = 1 << 30


def test_the_expected_cost_grows_with_the_memory_that_may_hold_chunks():
    regions = [(0x10000, 0x10000 + 3 * GIB), (1 << 40, (1 << 40) + GIB)]
    cost = sizing.expected("report", regions)
    seconds, per_gib = sizing.RATES["report"]
    assert cost.heap == 4 * GIB and cost.seconds == 4 * seconds and cost.bytes == 4 * per_gib
    assert sizing.expected("lists", regions).bytes < sizing.expected("walk", regions).bytes < cost.bytes
    assert sizing.expected("report", []).heap == 0


def test_the_memory_available_is_memavailable_and_a_command_may_take_a_share_of_it():
    meminfo = "MemTotal:       24634412 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n"
    available = sizing.available_memory(meminfo)
    assert available == 20000000 * 1024
    assert sizing.available_memory("MemTotal: 1 kB\n") is None
    assert isinstance(sizing.available_memory(), int)          # this machine's own
    assert not sizing.too_big(int(0.8 * available) - 1, available) and sizing.too_big(int(0.8 * available) + 1, available)
    assert not sizing.too_big(1 << 60, None)                    # a machine that does not say is not refused


def test_the_scan_needs_a_fixed_room_and_a_few_bytes_a_block():
    assert sizing.scan_need(0) == sizing.SCAN_FIXED
    assert sizing.scan_need(10_000_000) - sizing.scan_need(0) == 10_000_000 * sizing.SCAN_PER_BLOCK
    assert sizing.human_bytes(3 * GIB // 2) == "1.5 GiB" and sizing.human_bytes(5 << 20) == "5 MiB"


def test_report_s_help_says_the_cost_and_the_command_line_can_run_it_anyway():
    from heapwalk.cli.main import make_parser
    from heapwalk.output.options import cost_epilog
    seconds, per_gib = sizing.RATES["report"]
    text = cost_epilog()
    assert f"about {seconds:g} s and {per_gib >> 20} MiB of gdb's memory per GiB of heap" in text
    assert "'set heapwalk memory-check off' in gdb, or the command line's --no-memory-check" in text
    report = make_parser().parse_args(["report", "core", "--no-memory-check"])
    assert report.no_memory_check and not make_parser().parse_args(["report", "core"]).no_memory_check
