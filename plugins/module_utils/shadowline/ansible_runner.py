"""Running Ansible for the `shadowline` command: the tools beside this interpreter (or on PATH), the checkout's
ansible.cfg when there is one, a collection playbook by its path in a checkout or by FQCN when installed, and the
messages read back from its JSON results."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

PROG = "shadowline"
CHECKOUT = Path(__file__).resolve().parents[3]  # plugins/module_utils/shadowline/ansible_runner.py in a checkout


def in_checkout() -> bool:
    return (CHECKOUT / "galaxy.yml").exists() and (CHECKOUT / "ansible.cfg").exists()


def ansible_tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise SystemExit(f"{PROG}: {name} is not installed (pip install ansible-core, and the shadowline.gms "
                         "collection, or run it from a shadowline checkout after `make setup`)")
    return found


def ansible_env() -> dict[str, str]:
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1"}
    if in_checkout() and "ANSIBLE_CONFIG" not in os.environ:
        env["ANSIBLE_CONFIG"] = str(CHECKOUT / "ansible.cfg")
    return env


def run_playbook(name: str, inventory: str, extra: dict | None = None, check: bool = False, verbose: bool = False
                 ) -> subprocess.CompletedProcess[str]:
    """playbooks/<name>.yml (in a checkout; installed: shadowline.gms.<name>), its output captured, results as
    JSON (what ``messages`` reads)."""
    playbook = str(CHECKOUT / "playbooks" / f"{name}.yml") if in_checkout() else f"shadowline.gms.{name}"
    argv = [ansible_tool("ansible-playbook"), "-i", inventory, playbook]
    if extra:
        argv += ["-e", json.dumps(extra)]
    if check:
        argv += ["--check", "--diff"]
    if verbose:
        argv.append("-v")
    env = {**ansible_env(), "ANSIBLE_STDOUT_CALLBACK": "default", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    return subprocess.run(argv, cwd=CHECKOUT if in_checkout() else None, env=env, capture_output=True, text=True,
                          check=False)


def messages(output: str, start: str) -> list[str]:
    """The ``msg`` values of a playbook's results (JSON format) that start with the pattern ``start`` (after any
    blanks a folded template left in front)."""
    return [json.loads(f'"{m}"') for m in re.findall(rf'"msg": " *((?:{start})(?:[^"\\]|\\.)*)"', output)]


def failure_of(output: str) -> str | None:
    """The message of a playbook's last failed task, if it said one."""
    at = output.rfind("FAILED! =>")
    found = re.search(r'"msg": "((?:[^"\\]|\\.)*)"', output[at:]) if at >= 0 else None
    return json.loads(f'"{found.group(1)}"') if found else None
