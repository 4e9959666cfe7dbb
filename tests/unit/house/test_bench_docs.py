"""`make bench`'s part of docs/performance.md (tests/tools/bench_docs.py): what it says of a run, and that a run
replaces its own size's part and nothing else."""

import bench_docs

MACHINE = {"date": "2026-11-29 01:32 UTC", "commit": "abc1234", "cpu": "Some CPU", "cpus": 2,
           "memory_bytes": 24 << 30, "kernel": "6.1.0", "virtual": "a virtual machine (kvm)",
           "gdb": "GNU gdb (Debian 13.1-3) 13.1", "python": "3.11.2", "numpy": "2.4.6", "glibc": "2.36"}


def _command(name, seconds, floor, floor_4m, peak_mib, per_million_mib, unit="chunks"):
    return {"command": name, "wall_seconds": seconds + 0.5, "command_seconds": seconds, "peak_rss_bytes": peak_mib << 20,
            f"rss_per_million_{unit}": per_million_mib * (1 << 20), f"{unit}_per_second": 1.0,
            "times_floor": seconds / floor, "times_floor_4m": seconds / floor_4m}


def _run():
    glibc = {"shape": "random", "chunks": 4_500_000, "heap_bytes": 1187 << 20, "heaps": 25, "runs": 3,
             "floor_seconds": 0.8, "floor_4m_seconds": 0.08, "gdb_load_seconds": 0.5,
             "gdb_load_peak_rss_bytes": 94 << 20, "walk_seconds": 1.2, "walk_times_floor": 1.5,
             "leak_scan_seconds": 0.8, "leak_scan_times_floor": 1.0,
             "commands": [_command("heapwalk report", 2.0, 0.8, 0.08, 519, 94),
                          _command("heapwalk check", 1.2, 0.8, 0.08, 239, 32)]}
    je = {"jemalloc": "bookworm", "blocks": 3_000_000, "extent_bytes": 1189 << 20, "extent_runs": 6621, "runs": 3,
          "floor_seconds": 0.25, "floor_4m_seconds": 0.25, "gdb_load_seconds": 0.5,
          "gdb_load_peak_rss_bytes": 104 << 20,
          "commands": [_command("heapwalk report", 2.0, 0.25, 0.25, 482, 126, "blocks"),
                       _command("heapwalk check", 0.45, 0.25, 0.25, 184, 27, "blocks")]}
    return {"size": "large", "shapes": [glibc], "jemalloc": je}


def test_a_part_says_the_machine_the_date_the_commit_the_method_and_each_figure():
    text = bench_docs.section("large", _run(), MACHINE, ["--size", "large"], ["a capture line"])
    assert text.startswith("### large: 2026-11-29 01:32 UTC, commit abc1234\n")
    prose = " ".join(text.split("\n\n")[1].split())     # the paragraph under the heading, unwrapped
    assert prose.startswith("Measured on Some CPU, 2 logical CPUs, 24.0 GiB, a virtual machine (kvm); Linux 6.1.0; "
                            "GNU gdb (Debian 13.1-3) 13.1; gdb's Python 3.11.2, numpy 2.4.6; glibc 2.36.")
    assert "`tests/tools/bench.py --size large`" in prose and "3 times, the median of its times inside gdb" in prose
    assert all(len(line) <= bench_docs.WIDTH for line in text.splitlines() if not line.startswith("|"))
    assert "| glibc random, 4.5 M chunks | 1,187 MiB in 25 heaps | 0.800 s | 0.080 s | 0.50 s, 94 MiB | 1.20 s, 1.5x " \
           "| 0.80 s, 1.0x |" in text
    assert "| jemalloc (bookworm) random, 3.0 M blocks | 1,189 MiB in 6,621 runs of extents | 0.250 s |" in text
    assert "| `heapwalk report` | 2.00 s, 25.0x (2.5x), 519 MiB (94/M) | 2.00 s, 8.0x (8.0x), 482 MiB (126/M) |" in text
    assert "- a capture line" in text


def test_the_bars_name_what_is_within_them_everywhere_and_where_each_other_command_is_not():
    """Time against the floor of 4 MiB reads (report 5x, check 3x), memory against 24 MiB a million."""
    run = _run()
    run["shapes"][0]["commands"][1] = _command("heapwalk check", 0.2, 0.8, 0.08, 239, 20)
    lines = bench_docs.bar_lines(bench_docs.cores_of(run))
    assert lines == [
        "Against the bars of time (the floor of 4 MiB reads):",
        "- within them on every core: `heapwalk check` (3x)",
        "- `heapwalk report` over its 5x: 25.0x on glibc random, 8.0x on jemalloc (bookworm) random",
        "",
        "Against the bar of memory (24 MiB per million chunks or blocks):",
        "- `heapwalk report` over it: 94 MiB/M on glibc random, 126 MiB/M on jemalloc (bookworm) random",
        "- `heapwalk check` over it: 27 MiB/M on jemalloc (bookworm) random"]
    run["jemalloc"]["commands"][1] = _command("heapwalk check", 0.9, 0.25, 0.25, 184, 24, "blocks")
    lines = bench_docs.bar_lines(bench_docs.cores_of(run))
    assert "- `heapwalk check` over its 3x: 3.6x on jemalloc (bookworm) random" in lines
    assert lines[-2:] == ["- within it on every core: `heapwalk check`",
                          "- `heapwalk report` over it: 94 MiB/M on glibc random, 126 MiB/M on jemalloc (bookworm) random"]


def test_a_run_adds_its_part_before_the_anchor_then_replaces_only_its_own():
    page = "# Performance\n\n## Method\n\ntext\n\n## The one pass (issue 19)\n\nmore\n"
    first = bench_docs.updated(page, "large", "### large: one\n")
    assert first.index(bench_docs.HEADING) < first.index("## The one pass")
    assert first.index("## Method") < first.index(bench_docs.HEADING)
    small = bench_docs.updated(first, "small", "### small: one\n")
    assert small.index("### small: one") < small.index("### large: one") < small.index("## The one pass")
    again = bench_docs.updated(small, "large", "### large: two\n")
    assert "### large: one" not in again and "### small: one" in again and "### large: two" in again
    assert again == bench_docs.updated(again, "large", "### large: two\n")
    assert again.endswith("## The one pass (issue 19)\n\nmore\n") and again.count(bench_docs.HEADING) == 1
    huge = bench_docs.updated(again, "huge", "### huge: one\n")
    assert huge.index("### large: two") < huge.index("### huge: one") < huge.index("## The one pass")


def test_a_page_without_the_anchor_gets_the_section_at_its_end():
    text = bench_docs.updated("# Performance\n\nsomething\n", "small", "### small: one\n")
    assert text.startswith("# Performance\n\nsomething\n\n" + bench_docs.HEADING)
    assert text.rstrip().endswith(bench_docs.end_marker("small"))


def test_the_page_is_written_from_the_benchs_json_alone(tmp_path):
    """The JSON carries the machine, the command and the lines printed after the tables: the part can be written
    again from it (tests/tools/bench_docs.py JSON PAGE) with what was measured then, not what this machine is now."""
    page = tmp_path / "performance.md"
    page.write_text("# Performance\n\n## The one pass\n")
    data = {**_run(), "machine": MACHINE, "argv": ["--size", "large"], "lines": ["pre-copy, a line"]}
    bench_docs.write(page, data)
    text = page.read_text()
    assert "### large: 2026-11-29 01:32 UTC, commit abc1234" in text and "- pre-copy, a line" in text
    assert text.index(bench_docs.end_marker("large")) < text.index("## The one pass")


def test_the_growth_table_has_a_row_per_core_of_each_size_in_size_order(tmp_path):
    small, large = _run(), _run()
    small["size"], small["machine"] = "small", {**MACHINE, "commit": "0ld0000"}
    large["machine"], large["argv"] = MACHINE, ["--size", "large"]
    page = tmp_path / "performance.md"
    page.write_text("# Performance\n\n## Method\n\ntext\n\n## The one pass (issue 19)\n\nmore\n")
    bench_docs.write(page, large, {"small": small})
    text = page.read_text()
    table = text[text.index("### How `report`'s cost grows"):text.index(bench_docs.end_marker("growth"))]
    rows = [line for line in table.splitlines() if line.startswith("| small") or line.startswith("| large")]
    assert [r.split(" | ")[:2] for r in rows] == [["| small", "glibc random"], ["| small", "jemalloc (bookworm) random"],
                                                   ["| large", "glibc random"], ["| large", "jemalloc (bookworm) random"]]
    assert rows[0].endswith("| 0ld0000, 2026-11-29 |") and "| 4,500,000 | 1,187 MiB | 2.00 s | 25.0x | 425 MiB | 94 MiB |" \
        in rows[2]
    assert text.index(bench_docs.end_marker("large")) < text.index(bench_docs.begin_marker("growth"))
    bench_docs.write(page, large, {"small": small})       # again: the same page, the table once
    assert page.read_text() == text


def test_a_machine_that_ran_one_size_keeps_the_other_sizes_rows_the_page_has(tmp_path):
    """A new machine's build/bench holds no run of the sizes measured before: their rows stay as they were, in
    size order, and the size run now replaces its own."""
    small, large, huge = _run(), _run(), _run()
    small["size"], small["machine"] = "small", {**MACHINE, "commit": "0ld0000"}
    huge["size"], huge["machine"] = "huge", {**MACHINE, "commit": "0ldhuge"}
    large["machine"], large["argv"] = MACHINE, ["--size", "large"]
    page = tmp_path / "performance.md"
    page.write_text("# Performance\n\n## Method\n\ntext\n")
    bench_docs.write(page, large, {"small": small, "huge": huge})
    again = {**_run(), "machine": {**MACHINE, "commit": "new1234"}, "argv": ["--size", "large"]}
    bench_docs.write(page, again)                          # no other size's run on this machine
    text = page.read_text()
    table = text[text.index("### How `report`'s cost grows"):text.index(bench_docs.end_marker("growth"))]
    cells = [[c.strip() for c in line.split("|")] for line in table.splitlines()]
    rows = [f"{c[1]} {c[-2].split(',')[0]}" for c in cells if len(c) > 2 and c[1] in bench_docs.SIZE_ORDER]
    assert rows == ["small 0ld0000", "small 0ld0000", "large new1234", "large new1234", "huge 0ldhuge", "huge 0ldhuge"]


def test_another_size_s_rows_are_those_of_the_run_that_wrote_its_part(tmp_path):
    """build/bench may hold a run of another size that was not written to the page (a slow spell's, or one run
    without --docs): the page's rows of that size stay, those of the run that wrote its part."""
    large, huge = _run(), _run()
    large["machine"], large["argv"] = {**MACHINE, "commit": "written"}, ["--size", "large"]
    huge["size"], huge["machine"], huge["argv"] = "huge", {**MACHINE, "commit": "hugerun"}, ["--size", "huge"]
    page = tmp_path / "performance.md"
    page.write_text("# Performance\n\n## Method\n\ntext\n")
    bench_docs.write(page, large)
    unwritten = {**_run(), "machine": {**MACHINE, "commit": "notonpage"}}
    bench_docs.write(page, huge, {"large": unwritten})
    text = page.read_text()
    table = text[text.index("### How `report`'s cost grows"):text.index(bench_docs.end_marker("growth"))]
    cells = [[c.strip() for c in line.split("|")] for line in table.splitlines()]
    rows = [f"{c[1]} {c[-2].split(',')[0]}" for c in cells if len(c) > 2 and c[1] in bench_docs.SIZE_ORDER]
    assert rows == ["large written", "large written", "huge hugerun", "huge hugerun"]


def test_the_preloaded_allocators_have_their_columns_and_rows(tmp_path):
    """tcmalloc's and mimalloc's runs (`bench_preload`) are cores of the tables and rows of the growth table."""
    large = _run()
    large["machine"], large["argv"] = MACHINE, ["--size", "large"]
    large["preloaded"] = [{"allocator": "tcmalloc", "name": "tcmalloc (bookworm)", "blocks": 3_000_027,
                           "block_bytes": 1273 << 20, "block_runs": 16, "runs": 3, "floor_seconds": 0.8,
                           "floor_4m_seconds": 0.17, "gdb_load_seconds": 0.5, "gdb_load_peak_rss_bytes": 98 << 20,
                           "commands": [_command("heapwalk report", 2.9, 0.8, 0.17, 302, 68, "blocks")]}]
    page = tmp_path / "performance.md"
    page.write_text("# Performance\n\n## Method\n\ntext\n")
    bench_docs.write(page, large)
    text = page.read_text()
    assert "| tcmalloc (bookworm) random, 3.0 M blocks | 1,273 MiB in 16 runs of pages in use |" in text
    assert "| large | tcmalloc (bookworm) random | 3,000,027 | 1,273 MiB | 2.90 s | 17.1x | 204 MiB | 68 MiB |" in text


def test_the_growth_plot_draws_each_cores_sizes_as_a_line(tmp_path):
    """performance-growth.svg, written beside the page: a line in each panel for each kind of core, through its
    sizes in order, and the page shows it."""
    small, large = _run(), _run()
    small["size"], small["machine"] = "small", {**MACHINE, "commit": "0ld0000"}
    small["shapes"][0]["chunks"] = 300_000
    small["jemalloc"]["blocks"] = 150_000
    large["machine"], large["argv"] = MACHINE, ["--size", "large"]
    page = tmp_path / "performance.md"
    page.write_text("# Performance\n")
    bench_docs.write(page, large, {"small": small})
    svg = (tmp_path / "performance-growth.svg").read_text()
    assert svg.startswith("<svg ") and svg.count("<polyline") == 4 and svg.count("<circle") == 8
    assert "glibc random" in svg and "jemalloc (bookworm) random" in svg
    assert "](performance-growth.svg)" in page.read_text()
    import bench_plot
    points = bench_plot.points_of([line for line in page.read_text().splitlines() if line.startswith("| small")
                                   or line.startswith("| large")])
    assert [n for n, _, _ in points["glibc random"]] == [300_000, 4_500_000]
