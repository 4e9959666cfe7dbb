"""The report page ('heapwalk report --html') in a real browser, Debian's chromium run headless: the page
draws (a screenshot that is not blank and shows the maps' colours), its maps hold the chunks the JSON counts
(read from the page the browser built), it fits a narrow window without sideways scrolling, and it prints.
On every glibc with symbols hidden, on a damaged heap (the damage shown), and on jemalloc."""

from __future__ import annotations

import functools
import json
from collections import Counter

import pytest

from browser import Browser, cut_off, png_pixels
from figures import page_disagreements
from conftest import (GLIBCS, JEMALLOCS, NO_SYMBOLS, capture, capture_jemalloc, capture_mimalloc, capture_tcmalloc,
                      corruption, glibc, run_gdb)

pytestmark = pytest.mark.cores

#: the in-use colour of the maps and charts, as a screenshot has it
IN_USE = bytes.fromhex("d62728")


@pytest.fixture(scope="module")
def browser():
    with Browser() as b:
        yield b


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """pages(key, exe, core, iex) -> (the page's path, the report's JSON), by 'heapwalk report --html --json'."""
    tmp = tmp_path_factory.mktemp("pages")

    @functools.cache
    def compute(key: str, exe: str, core: str, iex: tuple[str, ...]):
        page, js = tmp / f"{key}.html", tmp / f"{key}.json"
        result = run_gdb([exe, core], [f"heapwalk report --json {js} --html {page}"], iex=list(iex))
        assert page.exists() and js.exists(), result.stdout + result.stderr
        assert "Traceback" not in result.stdout + result.stderr
        return page, json.loads(js.read_text())
    return compute


def _glibc_page(pages, g: str, name: str):
    c = capture(g, name)
    return pages(f"{g}-{name}", str(c.exe), str(c.core), tuple(glibc(g).gdb_settings(False)))


def _not_blank(png: bytes) -> Counter:
    """The screenshot's colours, after checking it is a picture of something: many colours, and a good
    share of its pixels not white."""
    width, height, rows = png_pixels(png)
    step = len(rows[0]) // width
    colours = Counter(bytes(row[i:i + 3]) for row in rows[::4] for i in range(0, len(row), step * 2))
    white = colours[b"\xff\xff\xff"]
    assert len(colours) > 20 and white < 0.97 * sum(colours.values()), (len(colours), white)
    return colours


#: the chunks per kind of each arena's strips, as the browser has the page
CHUNKS_IN_PAGE = """(() => {
  const out = {};
  for (const g of document.querySelectorAll('g.heap')) {
    const a = out[g.dataset.arena] = out[g.dataset.arena] || {};
    for (const pair of g.dataset.chunks.split(' ').filter(Boolean)) {
      const [kind, n] = pair.split('=');
      a[kind] = (a[kind] || 0) + Number(n);
    }
  }
  return out;
})()"""


def _wanted_chunks(doc: dict) -> dict[str, dict[str, int]]:
    return {str(a["number"]): {k: n for k, n in a["accounting"]["chunks"].items() if n and k != "fencepost"}
            for a in doc["arenas"]}


def _fits(browser: Browser, width: int) -> None:
    """The page at WIDTH pixels: nothing wider than the window (tables scroll in their own box), and each
    heap's strip as wide as the text."""
    browser.resize(width)
    assert browser.evaluate("document.documentElement.scrollWidth") <= width
    strips = browser.evaluate("[...document.querySelectorAll('svg.strip')].map(s => s.getBoundingClientRect().width)")
    assert strips and all(0 < w <= width for w in strips)


@pytest.mark.parametrize("g", GLIBCS)
def test_the_report_page_draws_its_maps_in_a_browser(browser, pages, g):
    page, doc = _glibc_page(pages, g, "thread_arenas")
    browser.open(page, 1280)
    colours = _not_blank(browser.screenshot())
    assert colours[IN_USE] > 1000                      # the maps and the chart show memory in use
    assert browser.evaluate(CHUNKS_IN_PAGE) == _wanted_chunks(doc)
    assert browser.evaluate("document.querySelectorAll('figure.heap').length") == sum(
        len(a["heaps"]) for a in doc["arenas"])
    heights = browser.evaluate("[...document.querySelectorAll('svg.strip')].map(s => s.getBoundingClientRect().height)")
    assert all(30 <= h <= 60 for h in heights)
    titles = browser.evaluate("[...document.querySelectorAll('h2')].map(h => h.textContent)")
    assert titles[:5] == ["What the core holds, by owner", "Verdict", "Where the memory is", "Heap maps",
                          "Free chunks by size"]
    assert "What malloc_trim(0) would give back" in titles and "Threads and their arenas" in titles
    _fits(browser, 380)
    pdf = browser.pdf()
    assert pdf.startswith(b"%PDF") and pdf.count(b"/Type /Page\n") + pdf.count(b"/Type /Page>") + \
        pdf.count(b"/Type/Page") >= 2


def test_a_damaged_heap_shows_its_damage_on_the_page(browser, pages):
    """chunk_size's core: a chunk's size field overwritten; the walk cannot pass it, and the page says so at
    the address: an error among the findings, a strip with bytes not walked, drawn in their colour."""
    c = corruption("system", "chunk_size")
    page, doc = pages("corrupt-chunk_size", str(c.exe), str(c.core), (NO_SYMBOLS,))
    browser.open(page, 1280)
    _not_blank(browser.screenshot())
    errors = browser.evaluate("[...document.querySelectorAll('.sev-error')].length")
    assert errors >= 1
    unwalked = browser.evaluate("[...document.querySelectorAll('rect[data-kind=unwalked]')]"
                                ".reduce((n, r) => n + Number(r.dataset.bytes), 0)")
    assert unwalked > 0
    assert "NOT WALKED (damage)" in browser.evaluate("document.getElementById('maps').textContent")
    found = doc["findings"] + [f for a in doc["arenas"] for f in a["findings"] + a["accounting"]["findings"]]
    addresses = {f["address"] for f in found if f["severity"] == "error" and f["address"] is not None}
    text = browser.evaluate("document.getElementById('findings').textContent")
    assert addresses and all(f"{a:#x}" in text for a in addresses)


@pytest.mark.parametrize("suite", JEMALLOCS)
def test_a_jemalloc_page_has_its_arenas_decay_and_threads(browser, pages, suite):
    cap = capture_jemalloc(suite, "je_dns")
    page, doc = pages(f"je-{suite}", str(cap.exe), str(cap.core), (NO_SYMBOLS,))
    browser.open(page, 1280)
    _not_blank(browser.screenshot())
    rows = browser.evaluate("document.querySelectorAll('#arenas tbody tr').length")
    assert rows == len(doc["report"]["arenas"])
    head = browser.evaluate("[...document.querySelectorAll('#arenas thead th')].map(th => th.textContent)")
    assert "mapped" in head and "top" not in head and "system" not in head, head
    dirty = browser.evaluate("[...document.querySelectorAll('#decay rect[data-kind=dirty]')]"
                             ".reduce((n, r) => n + Number(r.dataset.bytes), 0)")
    assert dirty == sum(a["pdirty"] for a in doc["jemalloc"]["arenas"]) * 4096
    assert browser.evaluate("document.querySelectorAll('#threads tbody tr').length") == len(doc["jemalloc"]["threads"])
    # the maps of its extents: each arena's dirty pages, as its counters have them
    mapped = browser.evaluate("""(() => { const out = {};
      for (const g of document.querySelectorAll('#maps g.heap'))
        for (const r of g.querySelectorAll('rect[data-kind=dirty]'))
          out[g.dataset.arena] = (out[g.dataset.arena] || 0) + Number(r.dataset.bytes);
      return out; })()""")
    assert mapped == {str(a["index"]): a["pdirty"] * 4096 for a in doc["jemalloc"]["arenas"] if a["pdirty"]}
    findings = browser.evaluate("document.getElementById('findings').textContent")
    assert "glibc" not in findings and ("as jemalloc leaves it" in findings or doc["findings"]), findings
    browser.resize(380)
    assert browser.evaluate("document.documentElement.scrollWidth") <= 380


@pytest.mark.parametrize("suite", JEMALLOCS)
def test_a_process_with_both_allocators_gets_both_on_its_page(browser, pages, suite):
    """je_both: jemalloc for the program, glibc's malloc beside it. The page draws jemalloc's part, the
    program's allocator, and then glibc's heaps, each arena of each in its table."""
    cap = capture_jemalloc(suite, "je_both")
    page, doc = pages(f"je-both-{suite}", str(cap.exe), str(cap.core), (NO_SYMBOLS,))
    assert doc["allocators"] == ["jemalloc", "glibc"]
    browser.open(page, 1280)
    _not_blank(browser.screenshot())
    assert browser.evaluate("document.querySelectorAll('#glibc-arenas tbody tr').length") == len(
        doc["glibc_malloc"]["report"]["arenas"])
    assert browser.evaluate("document.querySelectorAll('#arenas tbody tr').length") == len(
        doc["report"]["arenas"])
    assert browser.evaluate("document.querySelectorAll('#glibc-maps figure.heap').length") >= 2
    assert browser.evaluate("document.querySelectorAll('#maps figure.heap').length") >= 1
    assert "This process allocates with both" in browser.evaluate("document.body.textContent")


@pytest.mark.parametrize("which", ["glibc", "jemalloc", "both"])
def test_the_page_reads_at_1280_to_1400_pixels_with_nothing_cut(browser, pages, which):
    """At 1280 and 1400 pixels nothing of the page is past the window or clipped, and no table hides part of
    itself in its scrolling box (every column of the arena tables is seen); in a narrow window the wide
    tables scroll in their boxes, and still nothing is cut."""
    if which == "glibc":
        page, _ = _glibc_page(pages, "system", "thread_arenas")
    else:
        cap = capture_jemalloc(JEMALLOCS[0], "je_dns" if which == "jemalloc" else "je_both")
        page, _ = pages(f"je-{which}-{JEMALLOCS[0]}", str(cap.exe), str(cap.core), (NO_SYMBOLS,))
    browser.open(page, 1280)
    for width in (1280, 1400):
        assert cut_off(browser, width) == {"cut": [], "hidden": []}, width
    assert cut_off(browser, 380)["cut"] == []


@pytest.mark.parametrize("which", ["jemalloc-bookworm", "jemalloc-bullseye", "mimalloc-bookworm", "mimalloc-trixie",
                                   "tcmalloc-bookworm"])
def test_no_two_figures_of_another_allocator_s_page_disagree(pages, which):
    """The other allocators' pages: the arenas' rows and the maps count the same bytes in use and free (a
    jemalloc arena's row its own maps'; the regions thread caches hold free on both, as 'free: tcache'), and
    each map's caption says what the map draws in use."""
    kind, build = which.split("-")
    cap = {"jemalloc": lambda: capture_jemalloc(build, "je_dns"), "mimalloc": lambda: capture_mimalloc(build),
           "tcmalloc": lambda: capture_tcmalloc(build)}[kind]()
    page, doc = pages(which, str(cap.exe), str(cap.core), (NO_SYMBOLS,))
    assert doc["allocator"] == kind
    assert page_disagreements(page.read_text(), doc) == []
    if kind == "jemalloc":        # the regions the caches hold are drawn, and counted as the rows count them
        cached = sum(a["free"]["tcache"] for a in doc["report"]["arenas"])
        assert cached > 0 and page.read_text().count('data-kind="tcache_regions"') > 0


@pytest.mark.parametrize("g", ["system", "trixie"])
def test_no_two_figures_of_the_page_disagree(pages, g):
    """Each arena's row and what its heap maps draw (in use, free, top) and say in their captions (in use, the
    address space trim releases) are the same figures."""
    page, doc = _glibc_page(pages, g, "thread_arenas")
    assert page_disagreements(page.read_text(), doc) == []
