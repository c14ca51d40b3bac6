"""The library's shape, enforced: one home per concern (docs/architecture.md).

- production code never leans on test tooling or the fake: no module outside ``drill/`` and ``standin/`` imports
  from either (but the stand-in backend's own strategy, ``backends/standin.py``, may ask the stand-in, and the
  operator's command line, ``cli.py``, offers the drill report as one of its subcommands);
- the plan is typed past its one boundary: no ``plan["..."]`` read and no ``Plan = dict`` outside
  ``deployment/plan.py``;
- backend differences live in ``backends/``: no comparison with a backend's name anywhere else;
- the plan's type is apart from its builder: importing ``deployment/plan.py`` loads neither the contract's
  parsing, the PKI nor the container policy (``deployment/plan_builder.py`` builds a Plan from a Contract).
"""

from __future__ import annotations

import ast
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
    if path == LIB / "cli.py":
        leaning -= {"drill"}
    assert not leaning, f"{path.relative_to(ROOT)} imports from {sorted(leaning)}: move what it needs into its home"


def python_sources() -> list[Path]:
    sources = [p for p in (ROOT / "plugins").rglob("*.py") if "__pycache__" not in p.parts]
    sources += [ROOT / "slurm" / "render", ROOT / "scripts" / "show-plan", ROOT / "scripts" / "bench-failover",
                ROOT / "scripts" / "bench-client"]
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
