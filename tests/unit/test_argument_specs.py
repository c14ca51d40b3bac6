"""The roles' argument specs cannot drift from the inventory contract: every contract variable a role documents in
``meta/argument_specs.yml`` has the contract's default (``shadowline.deployment.contract``), key by key, and a role's
own option has the default of its ``defaults/main.yml``. A failure names the role, the option and both values."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from shadowline.deployment import contract, engine_contract, model_contract
from shadowline.model.spec import ModelSpec

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.parent.parent for p in (ROOT / "roles").glob("*/meta/argument_specs.yml"))
NO_DEFAULT = None  # the contract computes it (nnodes, model id, GPU memory ...): a spec must not state one
PLACEHOLDER = "<deployment>"  # how the specs and docs/variables.md write a default that depends on the deployment


def _spec_defaults() -> dict[str, Any]:
    fields = {f.name: f.default for f in dataclasses.fields(ModelSpec)}
    socket_dir = contract.default_socket_dir(PLACEHOLDER)
    return {
        "gms_ports": contract.DEFAULT_PORTS,
        "gms_engine": engine_contract.DEFAULT_ENGINE,
        "gms_failover": contract.DEFAULT_FAILOVER,
        "gms_memory": contract.DEFAULT_MEMORY,
        "gms_model": model_contract.DEFAULT_MODEL,
        "gms_cohorts": contract.DEFAULT_COHORTS,
        "gms_service_user": contract.DEFAULT_SERVICE_USER,
        "gms_python": contract.DEFAULT_PYTHON.format(deployment=PLACEHOLDER),
        "gms_socket_dir": socket_dir,
        "gms_lock_path": contract.default_lock_path(socket_dir),
        "gms_model_allow_pickle": fields["allow_pickle"],
        "gms_model_allow_unpinned": fields["allow_unpinned"],
        "gms_model_verify": fields["verify"],
        "gms_insecure": False,
        "gms_secrets_rotate": False,
        "gms_firewall_allow": [],
        "gms_frontend_allow": [],
        "gms_frontend_tls": contract.FRONTEND_TLS_PLAIN,
        "gms_frontend_router_mode": contract.DEFAULT_ROUTER_MODE,
        "gms_binaries": contract.DEFAULT_BINARIES,
        "gms_secrets_dir": contract.DEFAULT_SECRETS_DIR.format(deployment=PLACEHOLDER),
        # required, or computed from other variables
        "gms_deployment": NO_DEFAULT,
        "gms_node_rank": NO_DEFAULT,
        "gms_node_address": NO_DEFAULT,
        "gms_frontend_bind": NO_DEFAULT,
        "gms_model_hf_token_file": NO_DEFAULT,
    }


CONTRACT = _spec_defaults()
TYPES = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}


def _options(role: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """(entry point, option, its spec) of every option of the role's argument specs."""
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return [(entry, name, spec) for entry, body in specs.items() for name, spec in (body.get("options") or {}).items()]


def _drift(where: str, spec: dict[str, Any], expected: Any) -> list[str]:
    """How one option's spec differs from the contract's default ``expected``."""
    if expected is NO_DEFAULT:
        if "default" in spec:
            return [f"{where}: the spec says default {spec['default']!r}, the contract computes it (no default)"]
        return []
    if "default" not in spec:
        return [f"{where}: the spec has no default, the contract's is {expected!r}"]
    problems = []
    if spec["default"] != expected or type(spec["default"]) is not type(expected):
        problems.append(f"{where}: the spec's default is {spec['default']!r}, the contract's is {expected!r}")
    wanted_type = TYPES.get(type(expected))
    if wanted_type and spec.get("type", "str") != wanted_type and not (wanted_type == "str" and spec.get("type") == "path"):
        problems.append(f"{where}: the spec's type is {spec.get('type', 'str')}, the contract's default is a {wanted_type}")
    return problems


def contract_drift(role: Path) -> list[str]:
    problems = []
    for entry, name, spec in _options(role):
        if name not in CONTRACT:
            continue
        where = f"roles/{role.name} ({entry}): {name}"
        expected = CONTRACT[name]
        if not isinstance(expected, dict):
            problems += _drift(where, spec, expected)
            continue
        if "default" in spec:
            problems.append(f"{where}: the spec gives the whole dict a default {spec['default']!r}; "
                            "the contract's defaults are per key")
        suboptions = spec.get("options")
        if suboptions is None:
            continue  # the dict is documented as a whole; preflight checks its keys
        for key in sorted(set(suboptions) - set(expected)):
            problems.append(f"{where}.{key}: the spec has it, the contract has no such key")
        for key in sorted(set(expected) - set(suboptions)):
            problems.append(f"{where}.{key}: the contract has it (default {expected[key]!r}), the spec does not "
                            "(role validation would refuse it)")
        for key in sorted(set(expected) & set(suboptions)):
            problems += _drift(f"{where}.{key}", suboptions[key], expected[key])
    return problems


def role_default_drift(role: Path) -> list[str]:
    """A role's own option (not a contract variable) has the default of its defaults/main.yml."""
    defaults_file = role / "defaults" / "main.yml"
    defaults = (yaml.safe_load(defaults_file.read_text()) or {}) if defaults_file.exists() else {}
    problems = []
    for entry, name, spec in _options(role):
        if name in CONTRACT or name == "gms_plan":
            continue
        where = f"roles/{role.name} ({entry}): {name}"
        value = defaults.get(name)
        if isinstance(value, str) and "{{" in value:
            if "default" in spec:
                problems.append(f"{where}: the spec says default {spec['default']!r}, defaults/main.yml computes it")
            continue
        if name not in defaults:
            if "default" in spec:
                problems.append(f"{where}: the spec says default {spec['default']!r}, defaults/main.yml has none")
            continue
        if spec.get("default") != value:
            problems.append(f"{where}: the spec's default is {spec.get('default')!r}, defaults/main.yml's is {value!r}")
    return problems


def test_the_roles_have_argument_specs():
    assert {r.name for r in ROLES} >= {"agent", "base", "engine", "etcd", "frontend", "gms_server", "model_cache",
                                       "nats", "python_env"}


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_argument_spec_defaults_are_the_contracts(role: Path):
    assert contract_drift(role) == []


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_argument_spec_defaults_are_the_roles_defaults(role: Path):
    assert role_default_drift(role) == []


def test_a_drifted_default_is_named_with_both_values(tmp_path: Path):
    """The check itself can fail: a spec that changed one failover default and lost a port is reported."""
    role = tmp_path / "roles" / "agent"
    (role / "meta").mkdir(parents=True)
    ports = {k: {"type": "int", "default": v} for k, v in contract.DEFAULT_PORTS.items() if k != "nats"}
    ports["frontend"]["default"] = 8001
    (role / "meta" / "argument_specs.yml").write_text(yaml.safe_dump({"argument_specs": {"main": {"options": {
        "gms_failover": {"type": "dict", "options": {"stable_after_s": {"type": "float", "default": 60.0}}},
        "gms_ports": {"type": "dict", "options": ports},
        "gms_cohorts": {"type": "int", "default": 3},
    }}}}))
    problems = contract_drift(role)
    assert "roles/agent (main): gms_failover.stable_after_s: the spec's default is 60.0, the contract's is 30.0" in problems
    assert "roles/agent (main): gms_ports.frontend: the spec's default is 8001, the contract's is 8000" in problems
    assert any(p.startswith("roles/agent (main): gms_ports.nats: the contract has it (default 4222)") for p in problems)
    assert "roles/agent (main): gms_cohorts: the spec's default is 3, the contract's is 2" in problems
