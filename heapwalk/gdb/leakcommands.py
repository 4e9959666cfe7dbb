"""gdb command ``heapwalk leaks``, and the leak scan other commands share (``heapwalk chunk`` says whether a
chunk is reached and how).  The scan itself is the engine's (`analysis.reach`, `analysis.leaks`); here the
target's parts are put together and the result printed."""

from __future__ import annotations

import numpy as np

from heapwalk.analysis.inuse import InUse, LeakTotals, in_use_of, leak_totals
from heapwalk.analysis.leakreport import describe
from heapwalk.analysis.leaks import Leaks, leaks_of
from heapwalk import registry
from heapwalk.gdb import budget
from heapwalk.gdb.console import console_with_header, interactive, progress_bar, write_json
from heapwalk.gdb.session import UserError, load_allocators
from heapwalk.gdb.subcommand import Parser, Subcommand, json_option
from heapwalk.output.leakdoc import leaks_group, leaks_json
from heapwalk.gdb.adapter import stack_frame, symbol_at
from heapwalk.inferior.ranges import merged
from heapwalk.inferior.ownmemory import give_back
from heapwalk.inferior.roots import RegisterRoot, readonly_images

__all__ = ["LeaksCommand", "scan_leaks", "reach_text", "in_use_and_leaks", "report_scans", "pages_seen_of"]


def scan_leaks(found, decoded, paths: bool = False) -> Leaks:
    """The leaks of the allocator DECODED (one of FOUND, `load_allocators`' answer, walked with its blocks kept);
    PATHS keeps how each block is reached (`reach_text` needs it).  UserError when this machine has not the
    memory for the scan (`budget.scan_refused`)."""
    target = found.target
    blocks = decoded.blocks()
    refused = budget.scan_refused(blocks.count)
    if refused is not None:
        raise UserError(f"heapwalk: {refused}")
    with progress_bar("scanning for leaks") as progress:
        return leaks_of(decoded.memory, blocks, target.space, target.threads, progress, paths=paths)


def report_scans(found, no_leaks: bool, pages=None) -> tuple[list, list[str]]:
    """`in_use_and_leaks` of each of FOUND's decoded allocators that is scanned (None for the others, and for
    all with NO_LEAKS), and why any scan was not made (this machine has not the memory for it)."""
    scans, refused = [], []
    for decoded in found.decoded:
        give_back()                  # what came before (the verdicts' tables), before the blocks' arrays
        blocks = decoded.blocks() if decoded.scans_leaks and not no_leaks else None   # made once: 3 M cost 100 MiB
        why = None if blocks is None else budget.scan_refused(blocks.count)
        refused += [why] if why else []
        scans.append(in_use_and_leaks(found, decoded, pages, blocks) if blocks is not None and not why else None)
        del blocks
        give_back()                  # the scan's and the tables' holes, before the next allocator or the RSS
    return scans, refused


def pages_seen_of(found, scanned=None) -> tuple[list, list] | None:
    """The pages the decoders' walks already judged (`pages.PagesSeen`), and the leak scans
    (SCANNED), for a plain core's contents; None when none were kept."""
    kept = [p for p in (d.pages_seen() for d in found.decoded) if p is not None]
    kept += [scanned.seen()] if scanned is not None else []
    if not kept:
        return None
    return merged(r for judged, _ in kept for r in judged), merged(r for _, runs in kept for r in runs)


def in_use_and_leaks(found, decoded, pages=None, blocks=None) -> tuple[InUse, LeakTotals, np.ndarray]:
    """What the allocator DECODED (one of FOUND) holds in use, by size and signature, what of it is leaked, and
    the leaked blocks' addresses (for the heap maps); PAGES (`pages.PagesSeen`) hears which pages the scan
    read hold anything; BLOCKS, when given, are DECODED's (`Decoded.blocks`, made already)."""
    mem = decoded.memory
    blocks = decoded.blocks() if blocks is None else blocks
    target = found.target
    with progress_bar("scanning for leaks") as progress:
        lk = leaks_of(mem, blocks, target.space, target.threads, progress, pages=pages)
    return (in_use_of(blocks, ~lk.reach.reached, lk.reach.signed, readonly_images(target.space), symbol_at, mem),
            leak_totals(lk), lk.leaked_chunks())


def reach_text(lk: Leaks, chunk: int, threads=()) -> str | None:
    """Whether the in-use chunk at CHUNK is reached, and one path from a root to it ("reached: stack of
    thread 3, frame 2 (0x7ffe...) -> 0x55... -> this chunk"), or why it is leaked; None when no block
    starts there."""
    blocks, reach = lk.reach.blocks, lk.reach
    i = int(np.searchsorted(blocks.starts, np.uint64(chunk + blocks.header)))
    if i >= blocks.count or int(blocks.starts[i]) != chunk + blocks.header:
        return None
    if not reach.reached[i]:
        if i in set(lk.unreferenced.tolist()):
            return "leaked: nothing reachable points to it, and no other leaked chunk either (unreferenced)"
        return "leaked: only other leaked chunks point to it"
    path = reach.path(i)
    root, word = reach.root_of(path[0])
    if isinstance(root, RegisterRoot):
        start = root.label
    elif root.kind == "stack":
        start = f"{_stack_place(root, word, threads)} ({word:#x})"
    else:
        name = symbol_at(word) if root.kind in ("data", "bss") else None
        start = f"{root.label} ({word:#x}{f' {name}' if name else ''})"
    hops = [f"{int(blocks.addresses(j)):#x}" for j in path[:-1]]
    return "reached: " + " -> ".join([start, *hops, "this chunk"])


def _stack_place(root, word: int, threads) -> str:
    """Where in a thread's stack mapping WORD lies: a frame of its stack, or its TLS (above the outermost
    frame, near the thread pointer: the static TLS lies below it, the thread descriptor at it)."""
    where = stack_frame(root.thread, word)
    thread_pointer = next((t.thread_pointer for t in threads if t.number == root.thread), None)
    if (where is None or where[1]) and thread_pointer is not None \
            and thread_pointer - _TLS_ROOM <= word < thread_pointer + 4096:
        return f"TLS of thread {root.thread}"
    return root.label if where is None else f"{root.label}, frame {where[0]}"


#: bytes below the thread pointer taken for a thread's static TLS when telling it from the stack
_TLS_ROOM = 64 << 10


class LeaksCommand(Subcommand):
    name = "leaks"

    def make_parser(self):
        p = Parser(prog="heapwalk leaks", description="Find the chunks in use that nothing points to any more: "
                   "a conservative scan from the roots (threads' stacks and registers, TLS, the program's and "
                   "libraries' writable data, anonymous mappings, mmapped chunks) through every chunk in use. "
                   "Shows the leaked chunks per arena, by size and by signature (a vtable, a type, text), and "
                   "the unreferenced ones (where each leaked structure starts) with what they hold.")
        p.add_argument("--limit", metavar="N", type=int, default=20,
                       help="show at most N rows of each table (default 20); --json has every leaked chunk")
        json_option(p)
        return p

    def run(self, args) -> None:
        found = load_allocators(walk_chunks=True, keep_used=True)
        scanned = found.scanned()
        if not scanned:
            readers = " and ".join(f"{a.name}'s" for a in registry.allocators() if a.scans_leaks)
            raise UserError(f"heapwalk leaks: only {readers} heap is scanned for leaks so far; this process "
                            f"allocates with {' and '.join(d.title for d in found.decoded)}")
        documents = []
        for decoded in scanned:
            lk = scan_leaks(found, decoded)
            rep = describe(lk, decoded.memory, readonly_images(found.target.space), symbol_at, max(args.limit, 0))
            console = console_with_header(decoded)
            console.print(leaks_group(rep, interactive(), decoded.block_noun), end="")
            documents.append((decoded, leaks_json(decoded.leaks_header(), rep) if args.json else None))
        write_json(args.json, documents)
