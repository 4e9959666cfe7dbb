"""The shape of the package (docs/architecture.md), checked on its source: which part may import which, who
may import gdb, and how big a module or a function may grow."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "heapwalk"

def _allocator_parts() -> set[str]:
    """The folders of the allocators the registry serves (heapwalk.<part>.allocator each)."""
    from heapwalk import registry
    return {type(a).__module__.split(".")[1] for a in registry.allocators()}


ALLOCATOR_PARTS = _allocator_parts()
#: part -> the parts it may import (besides itself and the standard library and its dependencies): an allocator's
#: folder may use every part below the front ends; the front ends reach the allocators through the registry only
MAY_IMPORT = {
    "common": set(),
    "arch": {"common"},
    "inferior": {"arch", "common"},
    "analysis": {"inferior", "arch", "common"},
    "output": {"analysis", "inferior", "arch", "common"},
    "face": {"output", "analysis", "common"},
    **{part: {"face", "output", "analysis", "inferior", "arch", "common"} for part in ALLOCATOR_PARTS},
    "registry": {"face", *ALLOCATOR_PARTS},
    "gdb": {"registry", "face", "output", "analysis", "inferior", "arch", "common"},
    "capture": {"inferior", "arch", "common"},
    "cli": {"registry", "capture", "output", "analysis", "inferior", "arch", "common"},
    "__init__": {"gdb", "common"},
}
#: the only modules that import gdb
GDB_MODULES = {"gdb/adapter.py", "gdb/addressspace.py", "gdb/commands.py", "gdb/console.py", "gdb/session.py",
               "gdb/subcommand.py", "gdb/loading.py", "gdb/budget.py"}
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60
#: the documented hot loop: one function on purpose (see its docstring)
HOT_LOOPS = {("glibc/walk/chunkwalk.py", "walk_batches")}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path))


def _part(relative: str) -> str:
    return relative.split("/")[0].removesuffix(".py")


def _imports(tree: ast.AST, relative: str) -> set[str]:
    """The modules TREE imports, as absolute dotted names."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["heapwalk", *relative.split("/")[:-1]][: len(relative.split("/")) + 1 - node.level]
                out.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module == "heapwalk":     # from heapwalk import registry
                out.update(f"heapwalk.{a.name}" for a in node.names)
            else:
                out.add(node.module)
    return out


def test_each_part_imports_only_the_parts_below_it():
    wrong = []
    for relative, tree in _modules():
        part = _part(relative)
        for name in _imports(tree, relative):
            if not name.startswith("heapwalk.") and name != "heapwalk":
                continue
            target = name.split(".")[1] if "." in name else "__init__"
            if target != part and target not in MAY_IMPORT[part]:
                wrong.append(f"{relative} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_only_the_gdb_front_end_and_adapter_import_gdb():
    importing = {relative for relative, tree in _modules() if any(n == "gdb" or n.startswith("gdb.")
                                                                   for n in _imports(tree, relative))}
    assert importing == GDB_MODULES


def test_every_error_heapwalk_raises_has_one_base():
    """Each exception class of the package derives from errors.HeapwalkError (directly or through another),
    so that a front end catches heapwalk's own failures in one place; _HelpShown is argparse's help, no
    failure."""
    bases: dict[str, list[str]] = {}
    for relative, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]

    def derives(name: str, seen: frozenset = frozenset()) -> bool:
        return name == "HeapwalkError" or any(b not in seen and b in bases and derives(b, seen | {name})
                                              for b in bases.get(name, []))

    builtin = {"Exception", "ValueError", "RuntimeError", "LookupError", "OSError", "KeyError"}
    errors = [n for n, bs in bases.items() if n != "HeapwalkError" and n != "_HelpShown" and
              (set(bs) & builtin or any(b.endswith(("Error", "NotFound", "Unknown")) for b in bs))]
    assert errors and not [n for n in errors if not derives(n)], [n for n in errors if not derives(n)]


def test_modules_and_functions_stay_small():
    big_modules, big_functions = set(), set()
    for relative, tree in _modules():
        if len((PACKAGE / relative).read_text().splitlines()) > MAX_MODULE_LINES:
            big_modules.add(relative)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                big_functions.add((relative, node.name))
    assert not big_modules, f"modules over {MAX_MODULE_LINES} lines: {sorted(big_modules)}"
    assert not big_functions - HOT_LOOPS, f"functions over {MAX_FUNCTION_LINES} lines: {sorted(big_functions - HOT_LOOPS)}"


def _names(tree: ast.AST):
    """The names TREE defines or uses: variables, attributes, arguments, functions and classes."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, ast.arg):
            yield node.lineno, node.arg
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.lineno, node.name


def _texts(tree: ast.AST):
    """The string constants of TREE that are not docstrings: what it prints, compares and looks up."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


#: the parts whose text may not name an allocator either: the front ends ask the registry for every word
FRONT_ENDS = {"gdb", "cli"}


def test_no_allocator_is_named_outside_its_folder_and_the_registry():
    """The front ends, the engine and the generic output loop over the decoded allocators: none imports an
    allocator's folder (the rule above) or has a name of one in its code (found.glibc, jemalloc_strips); the
    front ends' help, messages and lookups name none either (the registry composes them)."""
    named = []
    for relative, tree in _modules():
        if _part(relative) in ALLOCATOR_PARTS | {"registry"}:
            continue
        named += [f"{relative}:{line}: {name}" for line, name in _names(tree)
                  if any(a in name.lower() for a in ALLOCATOR_PARTS)]
        if _part(relative) in FRONT_ENDS:
            named += [f"{relative}:{line}: {text[:60]!r}" for line, text in _texts(tree)
                      if any(a in text.lower() for a in ALLOCATOR_PARTS)]
        imported = [n for n in _imports(tree, relative) if n.split(".")[1:2] and n.split(".")[1] in ALLOCATOR_PARTS]
        named += [f"{relative}: imports {n}" for n in imported]
    for path in sorted(PACKAGE.rglob("*.[ch]")):   # the shared C decodes no allocator's structures either
        relative = path.relative_to(PACKAGE).as_posix()
        if _part(relative) not in ALLOCATOR_PARTS:
            named += [f"{relative}:{i}: {line.strip()[:60]}" for i, line in enumerate(path.read_text().splitlines(), 1)
                      if any(a in line.lower() for a in ALLOCATOR_PARTS)]
    assert not named, "\n".join(named)


def test_the_shared_drawing_names_no_allocator_s_own_kinds_of_run():
    """The heap maps' kinds that only one allocator has (glibc's bins, jemalloc's dirty pages) are named in
    that allocator's folder only: the output reads them from `mapkinds` ("top" aside: every arena view has a
    top, which an allocator says it has or not in its `Words`)."""
    from heapwalk.common import mapkinds
    from heapwalk import registry
    registry.allocators()
    own = set(mapkinds.KINDS) - {k.name for k in mapkinds.SHARED} - {"top"}
    assert {"small", "tcache_struct", "dirty", "slab_free"} <= own
    wrong = []
    for relative, tree in _modules():
        if _part(relative) in ("output", "face") or relative in ("common/view.py", "common/mapkinds.py"):
            wrong += [f"{relative}:{node.lineno} names {node.value!r}" for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and node.value in own]
    assert not wrong, "\n".join(wrong)


#: words that name a processor architecture, its registers or its instructions
ARCHITECTURE_WORDS = re.compile(r"x86|amd64|aarch64|arm64|\$fs_base|\$rsp|\brip\b|\brsp\b|\brsi\b|\brdi\b|"
                                r"\brax\b|endbr64|\blea\b", re.IGNORECASE)


def test_no_architecture_is_named_outside_its_folder():
    """Every architecture's instructions, registers and TLS layout are heapwalk/arch's: nothing else names one,
    in its names, strings or docstrings, nor in a C file (a layout that differs is asked of the `Architecture`)."""
    named = []
    for relative, tree in _modules():
        if _part(relative) == "arch":
            continue
        named += [f"{relative}:{line}: {name}" for line, name in _names(tree) if ARCHITECTURE_WORDS.search(name)]
        named += [f"{relative}:{node.lineno}: {node.value[:60]!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and ARCHITECTURE_WORDS.search(node.value)]
    for path in sorted(PACKAGE.rglob("*.[ch]")):
        named += [f"{path.relative_to(PACKAGE)}:{i}: {line.strip()[:60]}"
                  for i, line in enumerate(path.read_text().splitlines(), 1) if ARCHITECTURE_WORDS.search(line)]
    assert not named, "\n".join(named)


def _unit(relative: str) -> str:
    """The unit of the import graph RELATIVE belongs to: its part's sub-package (glibc/walk), or the module
    itself when it lies directly in a part (glibc/decode, view)."""
    parts = relative.removesuffix(".py").removesuffix("/__init__").split("/")
    return "/".join(parts[:2])


def test_the_import_graph_has_no_circle():
    """No sub-package or module imports, through any chain, one that imports it back (mimalloc 3 beside
    mimalloc's shared part, glibc's walks beside its discovery and its accounts): the package's import graph,
    its sub-packages and top modules as nodes, has no cycle."""
    edges: dict[str, set[str]] = {}
    for relative, tree in _modules():
        here = _unit(relative)
        for name in _imports(tree, relative):
            if not name.startswith("heapwalk."):
                continue
            path = name.split(".")[1:]
            target = "/".join(path) if (PACKAGE.joinpath(*path)).is_dir() else "/".join(path) + ".py"
            if not (PACKAGE / target).exists() and len(path) > 1:   # from package import module: the package
                target = "/".join(path[:-1]) + ("" if PACKAGE.joinpath(*path[:-1]).is_dir() else ".py")
            there = _unit(target)
            if there != here and not here.startswith(there + "/"):
                edges.setdefault(here, set()).add(there)
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not circles, "\n".join(circles)
