"""The collection's Python runs on nodes from Python 3.8 to 3.13 (issue #16).

Modules run under the node's own interpreter (``ansible_python_interpreter``), which on a RHEL 8 or Ubuntu 20.04
node is 3.8; they import the module_utils they use. Every file already starts with
``from __future__ import annotations``, so annotations are strings and may use ``X | None`` and ``dict[str, int]``;
what breaks on 3.8 is the same syntax *evaluated*: a type alias (``Plan = dict[str, Any]``), an ``isinstance``
with ``int | None``, a ``cast()``, a dataclass default factory. This test reads every plugin file with the 3.8
grammar and walks the code outside annotations for what 3.8 lacks. The checker is tested on snippets first, so a
checker that stopped finding anything fails too.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLUGIN_FILES = sorted(p for p in (ROOT / "plugins").rglob("*.py") if "__pycache__" not in p.parts)
OLDEST = (3, 8)

BUILTIN_GENERICS = {"dict", "list", "tuple", "set", "frozenset", "type"}
TYPE_NAMES = BUILTIN_GENERICS | {"int", "float", "str", "bytes", "bool", "object"}
# Names that do not exist in the oldest supported Python (module -> names, with the version that added them).
NEW_NAMES = {
    "typing": {"TypeAlias", "ParamSpec", "Concatenate", "TypeGuard", "Self", "Never", "LiteralString", "Required",
               "NotRequired", "Unpack", "TypeVarTuple", "assert_never", "reveal_type", "override", "Annotated"},
    "functools": {"cache"},
    "itertools": {"pairwise", "batched"},
    "datetime": {"UTC"},
    "enum": {"StrEnum", "verify"},
}
NEW_MODULES = {"tomllib", "zoneinfo", "graphlib"}
NEW_METHODS = {"removeprefix", "removesuffix", "bit_count"}
NEW_KEYWORDS = {"zip": {"strict"}, "dataclass": {"slots", "kw_only"}, "dataclasses.dataclass": {"slots", "kw_only"}}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


class _Finder(ast.NodeVisitor):
    """Walks code that Python evaluates (annotations are skipped: ``from __future__ import annotations``)."""

    def __init__(self) -> None:
        self.problems: list[tuple[int, str]] = []
        self.typing_names: set[str] = set()
        self.abc_names: set[str] = set()
        self.class_names: set[str] = set()

    def _flag(self, node: ast.AST, what: str) -> None:
        self.problems.append((getattr(node, "lineno", 0), what))

    # Annotations are not evaluated: visit everything but them.
    def visit_arg(self, node: ast.arg) -> None:
        return

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for item in node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d]:
            self.visit(item)
        for statement in node.body:
            self.visit(statement)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.class_names.add(node.name)
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name in NEW_MODULES:
                self._flag(node, f"import {alias.name} (not in Python {OLDEST[0]}.{OLDEST[1]})")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module in NEW_MODULES:
            self._flag(node, f"from {module} import ... (not in Python {OLDEST[0]}.{OLDEST[1]})")
        for alias in node.names:
            if alias.name in NEW_NAMES.get(module, set()):
                self._flag(node, f"from {module} import {alias.name} (not in Python {OLDEST[0]}.{OLDEST[1]})")
            if module == "typing":
                self.typing_names.add(alias.asname or alias.name)
            if module == "collections.abc":
                self.abc_names.add(alias.asname or alias.name)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        name = _dotted(node.value)
        if name in BUILTIN_GENERICS:
            self._flag(node, f"{name}[...] evaluated at run time (Python 3.9+); use typing's or a string")
        elif name in self.abc_names or name.startswith("collections.abc."):
            self._flag(node, f"{name}[...] evaluated at run time (Python 3.9+); use typing's")
        self.generic_visit(node)

    def _is_type(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Constant) and node.value is None:
            return True
        if isinstance(node, ast.Subscript):
            return self._is_type(node.value)
        name = _dotted(node)
        return bool(name) and (name in TYPE_NAMES or name in self.typing_names or name in self.class_names
                               or name.startswith("typing."))

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.BitOr):
            if self._is_type(node.left) or self._is_type(node.right):
                self._flag(node, "X | Y of types evaluated at run time (Python 3.10+); use typing.Union/Optional")
            if isinstance(node.left, ast.Dict) or isinstance(node.right, ast.Dict):
                self._flag(node, "dict | dict (Python 3.9+); use {**a, **b}")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in NEW_METHODS:
            self._flag(node, f".{node.attr}() (Python 3.9+)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func)
        for keyword in node.keywords:
            if keyword.arg in NEW_KEYWORDS.get(name, set()):
                self._flag(node, f"{name}({keyword.arg}=...) (Python 3.10+)")
        self.generic_visit(node)


def problems_in(source: str) -> list[tuple[int, str]]:
    """What in ``source`` fails on the oldest supported Python (empty when nothing does)."""
    try:
        tree = ast.parse(source, feature_version=OLDEST)
    except SyntaxError as error:
        return [(error.lineno or 0, f"syntax: {error.msg}")]
    finder = _Finder()
    # Imports first, so that names are known wherever they are used.
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            finder.visit(node)
    finder.problems.clear()
    finder.visit(tree)
    return finder.problems


@pytest.mark.parametrize("snippet", [
    "from typing import Any\nPlan = dict[str, Any]\n",
    "x = isinstance(1, int | None)\n",
    "from typing import Optional\nT = Optional[int] | None\n",
    "def f(s):\n    return s.removeprefix('a')\n",
    "def f(a, b):\n    return list(zip(a, b, strict=True))\n",
    "from dataclasses import dataclass\n@dataclass(slots=True)\nclass A:\n    x: int = 0\n",
    "from collections.abc import Mapping\nM = Mapping[str, int]\n",
    "match x:\n    case 1:\n        pass\n",
    "import tomllib\n",
    "from typing import TypeAlias\n",
    "from functools import cache\n",
    "class A:\n    pass\nU = A | None\n",
    "def f(x=list[int]):\n    pass\n",
    "def f(a):\n    return {'a': 1} | a\n",
    "x: int = dict[str, int]()\n",
])
def test_the_checker_finds_what_python_38_lacks(snippet: str) -> None:
    assert problems_in("from __future__ import annotations\n" + snippet)


@pytest.mark.parametrize("snippet", [
    "from typing import Any, Dict\nPlan = Dict[str, Any]\n",
    "def f(x: int | None, y: dict[str, list[int]]) -> tuple[int, ...] | None:\n    z: list[int] = []\n    return None\n",
    "x = 1 | 2\nflags = 0\nflags |= 4\n",
    "from typing import Optional\nT = Optional[int]\n",
    "class A:\n    x: dict[str, int]\n    y: int | None = None\n",
    "def f(s: str) -> str:\n    return s[len('a'):] if s.startswith('a') else s\n",
])
def test_the_checker_lets_what_python_38_runs(snippet: str) -> None:
    assert problems_in("from __future__ import annotations\n" + snippet) == []


@pytest.mark.parametrize("path", PLUGIN_FILES, ids=lambda p: str(p.relative_to(ROOT / "plugins")))
def test_plugin_file_runs_on_python_38(path: pathlib.Path) -> None:
    found = problems_in(path.read_text(encoding="utf-8"))
    assert not found, "\n".join(f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in found)
