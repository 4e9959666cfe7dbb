"""heapwalk runs on the Python that gdb embeds, from 3.9 (RHEL 9, Debian 11) on: no module may use syntax or a
library call newer than 3.9.  Every module of the package, the reproducer harness and the tests is parsed
with Python 3.9's grammar, and searched for the calls and keywords that 3.10 and later added."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SOURCES = sorted([*ROOT.glob("heapwalk/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("cores/**/*.py")])

#: keyword arguments that Python 3.10+ added to calls that exist in 3.9: (call name, keyword)
NEW_KEYWORDS = {("dataclass", "slots"), ("dataclass", "kw_only"), ("dataclass", "match_args"),
                ("field", "kw_only"), ("zip", "strict"), ("bisect", "key"), ("bisect_left", "key"),
                ("bisect_right", "key"), ("insort", "key"), ("insort_left", "key"), ("insort_right", "key"),
                ("make_dataclass", "slots"), ("make_dataclass", "kw_only")}
#: attributes and names that Python 3.10+ added
NEW_ATTRIBUTES = {"bit_count", "pairwise", "aiter", "anext", "KW_ONLY", "TypeAlias", "ParamSpec", "TypeGuard",
                  "Self", "LiteralString", "Never", "assert_never", "reveal_type", "TaskGroup", "timeout",
                  "StrEnum", "ReprEnum", "tomllib", "UTC", "batched", "override", "TypeVarTuple", "Unpack",
                  "NotRequired", "Required", "dataclass_transform", "get_overloads"}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _annotations(tree: ast.AST) -> set[int]:
    """The ids of every node inside an annotation (never evaluated under 'from __future__ import annotations')."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        elif isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
    return {id(n) for root in roots for n in ast.walk(root)}


def _newer_than_39(tree: ast.AST) -> list[str]:
    """What in TREE needs Python 3.10 or later, as 'line: what'."""
    out = []
    annotated = _annotations(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and id(node) not in annotated and any(
                isinstance(side, ast.Constant) and side.value is None for side in (node.left, node.right)):
            out.append(f"{node.lineno}: X | None outside an annotation")
        if isinstance(node, ast.Call):
            name = _name(node.func)
            for kw in node.keywords:
                if (name, kw.arg) in NEW_KEYWORDS:
                    out.append(f"{node.lineno}: {name}({kw.arg}=...)")
            if name == "isinstance" and len(node.args) == 2 and isinstance(node.args[1], ast.BinOp):
                out.append(f"{node.lineno}: isinstance with X | Y")
        elif isinstance(node, ast.Attribute) and node.attr in NEW_ATTRIBUTES:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "args", "cls")):
                out.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in NEW_ATTRIBUTES:
                    out.append(f"{node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in NEW_ATTRIBUTES:
                    out.append(f"{node.lineno}: import {alias.name}")
    return out


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_is_python_39(path):
    source = path.read_text()
    tree = ast.parse(source, filename=str(path), feature_version=(3, 9))
    assert _newer_than_39(tree) == []


def test_the_check_finds_what_39_lacks():
    """The search above, on code that 3.9 cannot run."""
    code = ("from dataclasses import dataclass\n@dataclass(frozen=True, slots=True)\nclass A:\n    x: int\n"
            "n = (5).bit_count()\nok = isinstance(n, int | str)\nfor a, b in zip([1], [2], strict=True): pass\n"
            "Rows = list[int | None]\ndef f(x: int | None) -> str | None: pass\n")
    assert sorted(line.split(": ")[1] for line in _newer_than_39(ast.parse(code))) == sorted(
        ["dataclass(slots=...)", ".bit_count", "isinstance with X | Y", "zip(strict=...)",
         "X | None outside an annotation"])
    with pytest.raises(SyntaxError):
        ast.parse("match x:\n    case 1:\n        pass\n", feature_version=(3, 9))
