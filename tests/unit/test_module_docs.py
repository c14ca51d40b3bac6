"""Every module of the collection documents itself: ansible-doc parses its DOCUMENTATION, EXAMPLES and RETURN
(a YAML slip in a description makes ansible-doc fail, and ansible-lint only warns about it)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DOC = REPO / ".venv" / "bin" / "ansible-doc"
MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py") if not p.stem.startswith("_"))


@pytest.mark.skipif(not ANSIBLE_DOC.exists(), reason="the project venv (make setup) is missing")
def test_every_module_has_parsable_docs() -> None:
    names = [f"shadowline.gms.{m}" for m in MODULES]
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run([str(ANSIBLE_DOC), "--json", *names], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    docs = json.loads(proc.stdout)
    assert sorted(docs) == sorted(names), f"ansible-doc could not read: {sorted(set(names) - set(docs))}"
    for name, doc in docs.items():
        assert doc["doc"].get("short_description"), f"{name}: no short_description"
        assert doc["doc"].get("description"), f"{name}: no description"
        assert doc.get("examples"), f"{name}: no EXAMPLES"
        assert doc.get("return") is not None, f"{name}: no RETURN"
