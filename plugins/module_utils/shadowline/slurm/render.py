"""`shadowline render-slurm` (slurm/render): render a ready-to-submit Slurm batch script of a shadowline deployment from its inventory.

Usage:
  slurm/render --inventory INVENTORY [--out FILE | --out-dir DIR] [--group gms_nodes]
  slurm/render --vars-json FILE --hosts N [--out FILE | --out-dir DIR]     (what playbooks/slurm_render.yml runs)

The inventory is read with `ansible-inventory --list` when it is installed (any inventory Ansible reads), else
directly with PyYAML (YAML inventories, with group_vars/ and host_vars/ beside them). Either way, "{{ ... }}"
values are templated with Jinja2 against the host's variables and `groups`, as Ansible would for simple
expressions, in Jinja2's sandbox (an inventory is data: an expression that reaches for Python internals is
refused, never run). Needs Python 3.9+ with Jinja2 and PyYAML (pip install jinja2 pyyaml) and nothing else; no host is
contacted. The nodes come from the Slurm allocation, not from the inventory: only the number of hosts in the
group (or gms_engine.nnodes) and the deployment's variables are used. Exit status 1 lists every problem.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..common import console
from ..common.problems import Problem, format_problems
from ..deployment.contract import missing_group_problem
from ..deployment.plan import Plan
from ..deployment.plan_builder import insecure_warning
from .allocation import read_spec
from .job import HOST_ONLY, job_context

ROOT = Path(__file__).resolve().parents[4]  # the checkout (plugins/module_utils/shadowline/slurm/render.py)
TEMPLATE = Path(__file__).resolve().with_name("job.sbatch.j2")  # package data: an installed CLI renders too


def need(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        raise SystemExit(f"slurm/render needs the Python package {module!r}: pip install jinja2 pyyaml "
                         f"(or run it with the interpreter of an Ansible installation)") from None


# -- reading the inventory ------------------------------------------------------------------------------------ #

def ansible_inventory() -> str | None:
    beside = Path(sys.executable).parent / "ansible-inventory"
    return str(beside) if beside.exists() else shutil.which("ansible-inventory")


def read_with_ansible(tool: str, inventory: str) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    env = {**os.environ, "ANSIBLE_CONFIG": os.environ.get("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))}
    proc = subprocess.run([tool, "-i", inventory, "--list"], capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"ansible-inventory could not read {inventory}:\n{proc.stderr.strip()}")
    data = json.loads(proc.stdout)
    hostvars = data.get("_meta", {}).get("hostvars", {})

    def members(group: str, seen: set[str]) -> list[str]:
        if group in seen:
            return []
        seen.add(group)
        entry = data.get(group, {})
        hosts = list(entry.get("hosts", []))
        for child in entry.get("children", []):
            hosts += [h for h in members(child, seen) if h not in hosts]
        return hosts

    groups = {name: members(name, set()) for name in data if name != "_meta"}
    return hostvars, groups


class YamlInventory:
    """A YAML inventory file or directory, group_vars/ and host_vars/, merged the way Ansible does it."""

    def __init__(self, path: str) -> None:
        self.yaml = need("yaml")
        self.path = Path(path)
        files = sorted(p for p in self.path.iterdir() if p.suffix in (".yml", ".yaml")) if self.path.is_dir() \
            else [self.path]
        self.base = self.path if self.path.is_dir() else self.path.parent
        self.parents: dict[str, list[str]] = {"all": []}
        self.group_vars: dict[str, dict[str, Any]] = {"all": {}}
        self.host_vars: dict[str, dict[str, Any]] = {}
        self.host_groups: dict[str, set[str]] = {}
        for file in files:
            data = self.yaml.safe_load(file.read_text()) or {}
            if not isinstance(data, dict):
                raise SystemExit(f"{file}: not a YAML inventory (use ansible-inventory for INI inventories)")
            for name, body in data.items():
                self._group(name, body or {}, None)

    def _group(self, name: str, body: dict[str, Any], parent: str | None) -> None:
        self.parents.setdefault(name, [])
        if parent and parent not in self.parents[name]:
            self.parents[name].append(parent)
        if name != "all" and not self.parents[name]:
            self.parents[name].append("all")
        self.group_vars.setdefault(name, {}).update(body.get("vars") or {})
        for host, values in (body.get("hosts") or {}).items():
            self.host_vars.setdefault(host, {}).update(values or {})
            self.host_groups.setdefault(host, set()).add(name)
        for child, child_body in (body.get("children") or {}).items():
            self._group(child, child_body or {}, name)

    def _vars_file(self, kind: str, name: str) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for candidate in (self.base / kind / f"{name}.yml", self.base / kind / f"{name}.yaml"):
            if candidate.is_file():
                merged.update(self.yaml.safe_load(candidate.read_text()) or {})
        folder = self.base / kind / name
        if folder.is_dir():
            for file in sorted(folder.glob("*.y*ml")):
                merged.update(self.yaml.safe_load(file.read_text()) or {})
        return merged

    def ancestry(self, group: str, depth: int = 0, out: dict[str, int] | None = None) -> dict[str, int]:
        out = {} if out is None else out
        out[group] = max(out.get(group, 0), depth)
        for parent in self.parents.get(group, []):
            self.ancestry(parent, depth + 1, out)
        return out

    def read(self) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
        hostvars: dict[str, dict[str, Any]] = {}
        for host, direct in self.host_groups.items():
            depths: dict[str, int] = {}
            for group in direct:
                self.ancestry(group, 0, depths)
            merged: dict[str, Any] = {}
            for group in sorted(depths, key=lambda g: (-depths[g], g)):  # all first, the host's own groups last
                merged.update(self.group_vars.get(group, {}))
                merged.update(self._vars_file("group_vars", group))
            merged.update(self.host_vars.get(host, {}))
            merged.update(self._vars_file("host_vars", host))
            hostvars[host] = merged
        groups = {g: sorted(h for h, gs in self.host_groups.items() if g in self._all_groups(gs)) for g in self.parents}
        return hostvars, groups

    def _all_groups(self, direct: set[str]) -> set[str]:
        found: set[str] = set()
        for group in direct:
            found |= set(self.ancestry(group))
        return found


def template_values(values: dict[str, Any], groups: dict[str, list[str]]) -> dict[str, Any]:
    """Template every "{{ ... }}" string against the host's variables (a few rounds, for variables of variables)."""
    jinja2 = need("jinja2")
    sandbox = need("jinja2.sandbox").sandbox
    env = sandbox.ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined)
    context = {**values, "groups": groups}

    def render(value: Any, name: str) -> Any:
        if isinstance(value, dict):
            return {k: render(v, f"{name}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [render(v, name) for v in value]
        if not isinstance(value, str) or ("{{" not in value and "{%" not in value):
            return value
        text = value
        for _unused in range(5):
            try:
                text = env.from_string(text).render(context)
            except sandbox.SecurityError as err:
                raise SystemExit(f"{name}: {value!r} reaches outside the inventory's data ({err}); refused, "
                                 "nothing was written. Fix: use plain values and simple expressions.") from None
            except jinja2.TemplateError as err:
                raise SystemExit(f"{name}: cannot template {value!r} without Ansible ({err}). Fix: simplify the "
                                 "expression, or render with playbooks/slurm_render.yml, which templates like Ansible.")
            if "{{" not in text and "{%" not in text:
                break
        return text

    return {name: render(value, name) for name, value in values.items()}


def deployment_values(hostvars: dict[str, dict[str, Any]], groups: dict[str, list[str]], group: str
                      ) -> tuple[dict[str, Any], int, list[Problem]]:
    hosts = groups.get(group, [])
    if not hosts:
        return {}, 0, [missing_group_problem(group, groups, "at least one host; under Slurm its hosts only give the "
                                             "deployment's variables and the node count (the nodes come from the "
                                             "allocation)")]
    templated = {h: template_values(hostvars.get(h, {}), groups) for h in hosts}
    first = hosts[0]
    shared = {k: v for k, v in templated[first].items() if k.startswith("gms_") and k not in HOST_ONLY}
    problems = []
    for host in hosts[1:]:
        for key in sorted(set(shared) | {k for k in templated[host] if k.startswith("gms_") and k not in HOST_ONLY}):
            if templated[host].get(key) != shared.get(key):
                problems.append(Problem(key, f"differs between {first} and {host}; a deployment has one value.",
                                        f"set {key} once for the group {group} (group_vars), not per host.", host))
                break
    return shared, len(hosts), problems


# -- main ----------------------------------------------------------------------------------------------------- #

def render(shared: dict[str, Any], hosts: int, source: str) -> tuple[str | None, str, list[Problem]]:
    """(the script, its default file name, problems)."""
    context, problems = job_context(shared, hosts, source)
    if context is None:
        return None, "", problems
    jinja2 = need("jinja2")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE.parent)), trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    text = env.get_template(TEMPLATE.name).render(**context)
    name = shared.get("gms_slurm", {}).get("job_name") if isinstance(shared.get("gms_slurm"), dict) else None
    return text, f"{name or 'shadowline-' + str(shared.get('gms_deployment'))}.sbatch", []


def run(args: argparse.Namespace) -> int:
    if not TEMPLATE.exists():
        raise SystemExit(f"render-slurm needs the job template {TEMPLATE}, which the package installs beside "
                         "slurm/render.py: reinstall shadowline (pip install .) or run it from a checkout")
    if args.vars_json:
        try:
            shared = json.loads(Path(args.vars_json).read_text())
        except (OSError, ValueError) as err:
            raise SystemExit(f"render-slurm: cannot read the variables {args.vars_json}: {err}") from None
        if not isinstance(shared, dict):
            raise SystemExit(f"render-slurm: {args.vars_json} is not a JSON object of the deployment's gms_* values")
        hosts, problems, how = args.hosts, [], "Ansible (playbooks/slurm_render.yml)"
    else:
        tool = None if args.no_ansible else ansible_inventory()
        unreadable = (OSError, ValueError) if tool else (OSError, ValueError, need("yaml").YAMLError)
        try:
            hostvars, groups = (read_with_ansible(tool, args.inventory) if tool
                                else YamlInventory(args.inventory).read())
        except unreadable as err:
            raise SystemExit(f"render-slurm: cannot read the inventory {args.inventory}: {err}") from None
        shared, hosts, problems = deployment_values(hostvars, groups, args.group)
        how = f"{'ansible-inventory' if tool else 'PyYAML'} from {args.inventory}"
    text, default_name, render_problems = (None, "", []) if problems else render(shared, hosts, "slurm/render")
    problems += render_problems
    if text is None:
        text = format_problems(problems, "slurm/render")
        console.err(text.replace("nothing was changed on any host", "nothing was written"))
        return 1
    target = Path(args.out) if args.out else Path(args.out_dir or ".") / default_name
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        changed = not (target.is_file() and target.read_text() == text)
        if changed:
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_text(text)
            tmp.chmod(0o755)
            tmp.replace(target)
    except OSError as err:
        raise SystemExit(f"render-slurm: cannot write {target}: {err}") from None
    result = {"path": str(target.resolve()), "changed": changed, "inventory": how, "submit": f"sbatch {target}"}
    if not Plan.from_dict(read_spec(text)["plan"]).secure:  # the plan the supervisor will read
        result["warning"] = "slurm/render: warning: " + insecure_warning(str(shared.get("gms_deployment")))
        console.err(result["warning"])
    console.out(json.dumps(result))
    return 0
