"""Every filter and role of the collection is documented for ``ansible-doc`` (filters: a sidecar YAML beside the
plugin; roles: meta/argument_specs.yml)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
ENV = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}


def registered_filters() -> set[str]:
    """The names each plugins/filter/*.py returns from FilterModule.filters()."""
    names: set[str] = set()
    for path in (ROOT / "plugins" / "filter").glob("*.py"):
        body = path.read_text().split("def filters(", 1)[1]
        names |= set(re.findall(r'"([a-z_]+)":\s*[a-z_]+', body))
    return names


def test_every_filter_has_documentation_that_ansible_doc_reads():
    filters = registered_filters()
    assert len(filters) >= 14
    missing = sorted(f for f in filters if not (ROOT / "plugins" / "filter" / f"{f}.yml").exists())
    assert not missing, f"no sidecar documentation for {missing}: add plugins/filter/<name>.yml"
    result = subprocess.run([BIN / "ansible-doc", "-t", "filter", "--json",
                             *[f"shadowline.gms.{f}" for f in sorted(filters)]],
                            env=ENV, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    docs = json.loads(result.stdout)
    for name in filters:
        doc = docs[f"shadowline.gms.{name}"]
        assert doc["doc"]["short_description"], name
        assert doc["examples"] and f"shadowline.gms.{name}" in doc["examples"], name
        assert doc["return"]["_value"]["type"], name
    assert "Missing documentation" not in result.stderr, result.stderr


def test_every_role_has_documentation_that_ansible_doc_reads():
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks").is_dir())
    assert {"agent", "engine", "etcd", "monitoring", "python_env"} <= set(roles)
    result = subprocess.run([BIN / "ansible-doc", "-t", "role", "--json", *[f"shadowline.gms.{r}" for r in roles]],
                            env=ENV, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    docs = json.loads(result.stdout)
    for role in roles:
        entry = docs[f"shadowline.gms.{role}"]["entry_points"]["main"]
        assert entry["short_description"] and entry.get("options") is not None, role
