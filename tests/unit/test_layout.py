"""The library's shape, enforced: one home per concern (docs/architecture.md).

- production code never leans on test tooling or the fake: no module outside ``drill/`` and ``standin/`` imports
  from either (but the stand-in backend's own strategy, ``backends/standin.py``, may ask the stand-in; the
  operator's command line runs the drill report as its own program, ``python -m shadowline.drill.report_tool``);
  nor does any reach
  either through the library's own imports, nor any Ansible plugin but the drills' own (the stand-in backend is
  the one door: test_production_code_does_not_reach_drills_or_the_stand_in);
- the plan is typed past its one boundary: no ``plan["..."]`` read and no ``Plan = dict`` outside
  ``deployment/plan.py``;
- backend differences live in ``backends/``: no comparison with a backend's name anywhere else;
- the plan's type is apart from its builder: importing ``deployment/plan.py`` loads neither the contract's
  parsing, the PKI nor the container policy (``deployment/plan_builder.py`` builds a Plan from a Contract);
- the rooms stand on each other (ROOMS: what each may import; common/ the ground floor imports none), no two rooms
  import each other, no class has more than 30 methods and no module more than 600 lines without a reason; each
  rule is also run on a planted violation.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "plugins" / "module_utils" / "shadowline"
BACKEND_NAMES = {"standin", "dynamo_vllm"}


def library_files() -> list[Path]:
    return sorted(p for p in LIB.rglob("*.py") if "__pycache__" not in p.parts)


def package_of(path: Path) -> str:
    rel = path.relative_to(LIB).parts
    return rel[0] if len(rel) > 1 else ""


def imported_packages(path: Path) -> set[str]:
    """The top-level library packages a module imports from (relative or absolute imports)."""
    tree = ast.parse(path.read_text())
    here = list(path.relative_to(LIB).parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)]
                parts = base + (node.module.split(".") if node.module else [])
                names = [parts + [a.name] for a in node.names] if not node.module else [parts]
            elif node.module and node.module.startswith("shadowline"):
                names = [node.module.split(".")[1:]]
            else:
                continue
            found |= {n[0] for n in names if n}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("shadowline.")}
    return found


@pytest.mark.parametrize("path", library_files(), ids=lambda p: str(p.relative_to(LIB)))
def test_production_code_does_not_import_drills_or_the_stand_in(path: Path):
    if package_of(path) in ("drill", "standin"):
        return
    leaning = imported_packages(path) & {"drill", "standin"}
    if path == LIB / "backends" / "standin.py":
        leaning -= {"standin"}
    assert not leaning, f"{path.relative_to(ROOT)} imports from {sorted(leaning)}: move what it needs into its home"


def python_sources() -> list[Path]:
    sources = [p for p in (ROOT / "plugins").rglob("*.py") if "__pycache__" not in p.parts]
    sources += [ROOT / "slurm" / "render", ROOT / "scripts" / "show-plan", ROOT / "scripts" / "bench-failover",
                ROOT / "scripts" / "bench-client", ROOT / "scripts" / "bench-fleet-scale"]
    return sorted(p for p in sources if p.exists())


@pytest.mark.parametrize("path", python_sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_plan_is_typed_past_its_boundary(path: Path):
    if path == LIB / "deployment" / "plan.py":
        return
    text = path.read_text()
    reads = [i + 1 for i, line in enumerate(text.splitlines()) if re.search(r"\bplan\[[\"']", line)]
    assert not reads, f"{path.relative_to(ROOT)} reads the plan as a dict at lines {reads}: use deployment.plan.Plan"
    assert not re.search(r"^Plan = dict", text, re.M), f"{path.relative_to(ROOT)} declares its own dict Plan"


@pytest.mark.parametrize("path", library_files(), ids=lambda p: str(p.relative_to(LIB)))
def test_backend_differences_live_in_backends(path: Path):
    if package_of(path) == "backends":
        return
    branches = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and o.value in BACKEND_NAMES for o in operands):
                branches.append(node.lineno)
    assert not branches, (f"{path.relative_to(ROOT)} branches on a backend's name at lines {branches}: "
                          "ask the backend strategy (backends/) instead")


def test_the_plan_type_loads_without_the_contract_pki_or_container():
    """Every reader of a plan (the agent, the modules, the filters) imports deployment.plan: in a fresh interpreter
    that import must not pull in what only the builder needs (plan_builder.py)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import shadowline.deployment.plan; "
            "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('shadowline'))))")
    run = subprocess.run([sys.executable, "-c", code, str(LIB.parent)], capture_output=True, text=True, check=True)
    loaded = set(run.stdout.split())
    assert "shadowline.deployment.plan" in loaded
    coupled = loaded & {f"shadowline.deployment.{m}" for m in ("contract", "pki", "container", "plan_builder")}
    assert not coupled, f"importing deployment/plan.py loads {sorted(coupled)}: keep the builder's needs in plan_builder.py"


# -- what production code reaches, import by import ------------------------------------------------------------- #

PREFIXES = ("shadowline.", "ansible_collections.shadowline.gms.plugins.module_utils.shadowline.")
DOOR = ("backends.standin", "standin")  # the stand-in backend's strategy may ask the stand-in (and only it)
DRILL_PLUGINS = {"drill_load", "drill_probe", "drill_report", "fault_inject"}  # the drills' own Ansible face


def library_module(name: str) -> Path | None:
    """The file of a library module by its dotted name under shadowline (``control.agent``), or None."""
    base = LIB.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def dotted(path: Path) -> str:
    parts = list(path.relative_to(LIB).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_parts(name: str) -> list[str] | None:
    """A module's name as parts under shadowline (``shadowline.control.agent``, or as Ansible imports it from the
    collection), or None: not the library's."""
    for prefix in PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):].split(".")
    return None


@functools.cache
def imported_modules(path: Path) -> frozenset[str]:
    """The library modules an import statement anywhere in ``path`` (at the top or in a function) loads: the module
    named, a submodule imported by name, and every package above them (importing ``backends.base`` runs
    ``backends/__init__.py`` first)."""
    here = list(path.relative_to(LIB).parts[:-1]) if path.is_relative_to(LIB) else []
    named: list[list[str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            elif node.module and library_parts(node.module):
                base = library_parts(node.module)
            else:
                continue
            named.append(base)
            named += [base + [a.name] for a in node.names]
        elif isinstance(node, ast.Import):
            named += [parts for a in node.names if (parts := library_parts(a.name))]
    found: set[str] = set()
    for parts in named:
        for end in range(1, len(parts) + 1):
            name = ".".join(parts[:end])
            if library_module(name) is not None:
                found.add(name)
    return frozenset(found)


def reached(start: Path) -> dict[str, str]:
    """Every library module ``start`` loads, directly or through the modules it loads, each with the one it was
    reached from (its parent in the walk; a library module ``start`` is in it too, reached from "")."""
    name = dotted(start) if start.is_relative_to(LIB) else ""
    parents: dict[str, str] = {name: ""} if name else {}
    todo = [(start, name)]
    while todo:
        path, name = todo.pop()
        for module in sorted(imported_modules(path)):
            if module in parents or (name == DOOR[0] and module.split(".")[0] == DOOR[1]):
                continue
            parents[module] = name
            todo.append((library_module(module), module))
    return parents


def production_entry_points() -> list[Path]:
    """Every library module outside ``drill/`` and ``standin/`` (the operator's command line included), and every
    Ansible module, action and filter plugin but the drills' own (drill_*, fault_inject)."""
    points = [p for p in library_files() if package_of(p) not in ("drill", "standin")]
    for kind in ("modules", "action", "filter"):
        points += sorted(p for p in (ROOT / "plugins" / kind).glob("*.py") if p.stem not in DRILL_PLUGINS)
    return points


@pytest.mark.parametrize("path", production_entry_points(), ids=lambda p: str(p.relative_to(ROOT)))
def test_production_code_does_not_reach_drills_or_the_stand_in(path: Path):
    """The direct rule above, followed through the library's own imports: from each production module (the agent's
    ``control/``, ``deployment/``, ``slurm/``, ``backends/``, ``model/``, ``cluster/``, ``common/``, ``cli.py``) and each Ansible plugin
    (the drills' own aside), the walk follows every import statement of ``shadowline`` (at the top of a module or
    inside a function, with the packages each one loads) and must reach nothing under ``drill/`` or ``standin/``.

    One door is not followed: ``backends/standin.py`` asking ``standin/`` (its imports are inside its methods, so
    they run only where the deployment runs the stand-in). Every reader of a plan reaches ``backends/`` through
    ``deployment/plan.py`` (``Plan.engine``), so without the door the rule could not hold; with it, the rule says
    what matters: production code names no fake itself, and the stand-in is reached only by asking the backend
    strategy (the direct rule keeps every other module of ``backends/`` off ``standin/``)."""
    parents = reached(path)
    leaks = sorted(m for m in parents if m.split(".")[0] in ("drill", "standin"))
    chains = []
    for module in leaks:
        chain = [module]
        while parents[chain[-1]]:
            chain.append(parents[chain[-1]])
        chains.append(" <- ".join(chain))
    assert not leaks, (f"{path.relative_to(ROOT)} reaches test tooling or the fake: {'; '.join(chains)}: move what "
                       "it needs into its home, or let the backend strategy supply it")


# -- rooms: what may import what ---------------------------------------------------------------------------------- #

# Each room of the library and the rooms it may import (docs/architecture.md draws them). common/ is the ground floor:
# it imports no other room. The top-level modules (cli.py, gpu_proof.py, ...) sit above every room.
ROOMS: dict[str, frozenset[str]] = {
    "common": frozenset(),
    "model": frozenset({"common"}),
    "backends": frozenset({"common", "standin"}),  # standin: only backends/standin.py, the door (tested above)
    "deployment": frozenset({"common", "model", "backends"}),
    "cluster": frozenset({"common", "deployment", "backends"}),
    "control": frozenset({"common", "cluster", "deployment", "model", "backends"}),
    "slurm": frozenset({"common", "cluster", "deployment", "model", "backends"}),
    "standin": frozenset({"common"}),
    "drill": frozenset({"common", "cluster", "control", "deployment", "model", "backends", "standin"}),
}
MAX_METHODS = 30
MAX_LINES = 600
WIDE_REASON = "Wide on purpose:"  # a module over MAX_LINES says why in its docstring, after these words


def room(module: str) -> str:
    """The room of a dotted module name under shadowline: its package, or "" for a top-level module."""
    head = module.split(".")[0]
    return head if head in ROOMS else ""


def room_edges(imports: dict[str, frozenset[str]]) -> dict[tuple[str, str], list[str]]:
    """(importing room, imported room) -> the module pairs that make the edge; top-level modules left out."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, targets in imports.items():
        for target in targets:
            a, b = room(module), room(target)
            if a and b and a != b:
                edges.setdefault((a, b), []).append(f"{module} -> {target}")
    return edges


def layering_problems(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    return [f"{a}/ imports {b}/ ({', '.join(sorted(pairs)[:3])}): {a}/ may import only "
            f"{', '.join(sorted(ROOMS[a])) or 'nothing but the standard library'}"
            for (a, b), pairs in sorted(edges.items()) if b not in ROOMS[a]]


def cycle_problems(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    return [f"{a}/ and {b}/ import each other ({edges[(a, b)][0]}; {edges[(b, a)][0]})"
            for (a, b) in sorted(edges) if a < b and (b, a) in edges]


def library_imports() -> dict[str, frozenset[str]]:
    return {dotted(p): imported_modules(p) for p in library_files()}


def test_each_room_imports_only_the_rooms_below_it():
    problems = layering_problems(room_edges(library_imports()))
    assert not problems, "; ".join(problems)


def test_no_two_rooms_import_each_other():
    problems = cycle_problems(room_edges(library_imports()))
    assert not problems, "; ".join(problems)


def test_every_room_is_declared():
    packages = {p.name for p in LIB.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(ROOMS), f"rooms without a rule: {sorted(packages - set(ROOMS))}; gone: {sorted(set(ROOMS) - packages)}"


def test_a_planted_upward_import_and_a_planted_cycle_are_caught():
    planted = {"common.http": frozenset({"control.agent"}), "control.agent": frozenset({"common.http"}),
               "cluster.access": frozenset({"deployment.plan"}), "deployment.plan": frozenset({"cluster.access"})}
    edges = room_edges(planted)
    assert layering_problems(edges) == [
        "common/ imports control/ (common.http -> control.agent): common/ may import only nothing but the standard library",
        "deployment/ imports cluster/ (deployment.plan -> cluster.access): deployment/ may import only backends, common, model"]
    assert cycle_problems(edges) == [
        "cluster/ and deployment/ import each other (cluster.access -> deployment.plan; deployment.plan -> cluster.access)",
        "common/ and control/ import each other (common.http -> control.agent; control.agent -> common.http)"]
    assert not layering_problems(room_edges({"control.agent": frozenset({"common.http", "cluster.access"})}))


def wide_classes(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            methods = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
            if methods > MAX_METHODS:
                found.append(f"{node.name} ({methods} methods)")
    return found


def too_wide(source: str) -> bool:
    """Over MAX_LINES lines without a reason in its docstring."""
    if len(source.splitlines()) <= MAX_LINES:
        return False
    doc = ast.get_docstring(ast.parse(source)) or ""
    return WIDE_REASON not in doc


@pytest.mark.parametrize("path", python_sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_class_has_more_than_30_methods(path: Path):
    wide = wide_classes(path.read_text())
    assert not wide, f"{path.relative_to(ROOT)}: {', '.join(wide)}: split it by concern"


@pytest.mark.parametrize("path", python_sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_wider_than_600_lines_without_a_reason(path: Path):
    assert not too_wide(path.read_text()), (
        f"{path.relative_to(ROOT)} has {len(path.read_text().splitlines())} lines: split it, or say why not in its "
        f"docstring after {WIDE_REASON!r}")


def test_a_planted_wide_class_and_a_planted_wide_module_are_caught():
    methods = "".join(f"    def m{i}(self):\n        pass\n" for i in range(MAX_METHODS + 1))
    assert wide_classes(f"class Wide:\n{methods}") == [f"Wide ({MAX_METHODS + 1} methods)"]
    assert not wide_classes("class Narrow:\n    def m(self):\n        pass\n")
    body = "x = 1\n" * MAX_LINES
    assert too_wide(f'"""A module."""\n{body}')
    assert not too_wide(f'"""A module. {WIDE_REASON} one table."""\n{body}')
    assert not too_wide('"""A module."""\nx = 1\n')
