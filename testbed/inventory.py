"""The files up() writes for users and tests: the Ansible inventory, known_hosts and .testbed/state.json."""

from __future__ import annotations

import contextlib
from typing import Any

import yaml

from .journal import State, write_json_atomic
from .names import (
    BRIDGE_ADDRESS,
    GROUP_VARS,
    INSTANCE,
    INVENTORY,
    KEY_FILE,
    KNOWN_HOSTS,
    REPO_ROOT,
    STATE_JSON,
    TESTBED_DIR,
)
from .ssh import write_known_hosts


def inventory_text(state: State) -> str:
    lines = [
        "# Written by testbed/testbed.py on `up`, removed on `down`. Do not edit.",
        "all:",
        "  vars:",
        "    ansible_user: root",
        f"    ansible_ssh_private_key_file: {KEY_FILE}",
        # the hosts' own keys, checked (each host makes its own on `up`: testbed/ssh.py)
        f"    ansible_ssh_common_args: -o StrictHostKeyChecking=yes -o UserKnownHostsFile={KNOWN_HOSTS}",
        "    ansible_python_interpreter: /usr/bin/python3",
        f"    testbed_repo_root: {REPO_ROOT}",
        f"    gms_secrets_dir: {TESTBED_DIR}/secrets  # the instance's own CA and passwords (docs/security.md)",
        f"    gms_firewall_allow: [{BRIDGE_ADDRESS}]  # the machine itself (tests, benchmarks) reaches every port",
        "  children:",
        "    gms_nodes:",
        "      hosts:",
    ]
    nodes, spares = state.hosts[:len(state.hosts) - state.spares], state.hosts[len(state.hosts) - state.spares:]
    if state.replicas > 1:  # a fleet (docs/fleet-design.md): each host names its replica and its rank there
        size = len(nodes) // state.replicas
        lines.insert(lines.index("  children:"), f"    testbed_replica_nodes: {size}  # one replica's hosts: its TP")
        lines += [f"        {h.name}: {{ansible_host: {h.address}, gms_replica: {h.index // size}, "
                  f"gms_replica_rank: {h.index % size}}}" for h in nodes]
    else:
        lines += [f"        {h.name}: {{ansible_host: {h.address}, gms_node_rank: {h.index}}}" for h in nodes]
    if spares:  # group_vars/gms_spares.yml is the nodes' (a spare runs their plan and roles: docs/fleet.md)
        lines += ["    gms_spares:", "      hosts:"] + [f"        {h.name}: {{ansible_host: {h.address}}}" for h in spares]
    if state.slurm:
        compute = ", ".join(f"{h.name}: {{}}" for h in state.hosts)
        lines += [f"    slurm_controller: {{hosts: {{{state.hosts[0].name}: {{}}}}}}",
                  f"    slurm_compute: {{hosts: {{{compute}}}}}"]
    return "\n".join(lines) + "\n"


def failover_of_testbed(**overrides: Any) -> dict[str, Any]:
    """The testbed deployment's gms_failover (its group_vars), with ``overrides``: what a test or benchmark passes
    as extra variables (``-e`` replaces the whole mapping, so it starts from these)."""
    data = yaml.safe_load((GROUP_VARS / "gms_nodes.yml").read_text())
    return {**(data.get("gms_failover") or {}), **overrides}


# Detection for suites that drive faults under load beside other testbeds (drills, fault matrix, fleet, containers):
# 3 s of /health silence, 2 s of a stalled generation, 1 s canaries. The testbed's own 1 s declared healthy serving
# leaders hung under CI's load on 2 cores (issue #37's false positive: in the fault matrix, the fleet, the drills
# and the container suite, each once in a CI run); no suite that uses it measures detection itself.
UNDER_LOAD = {"stable_after_s": 8, "health_timeout_s": 3.0, "progress_stall_s": 2.0, "canary_interval_s": 1.0}


def failover_under_load(**overrides: Any) -> dict[str, Any]:
    """failover_of_testbed at UNDER_LOAD's detection, with ``overrides``."""
    return failover_of_testbed(**{**UNDER_LOAD, **overrides})


def write_outputs(state: State) -> None:
    INVENTORY.parent.mkdir(parents=True, exist_ok=True)
    write_known_hosts(state)
    INVENTORY.write_text(inventory_text(state))
    link = INVENTORY.parent / "group_vars"
    if INSTANCE and not link.is_symlink():
        link.symlink_to(GROUP_VARS)
    public = {
        "nodes": state.nodes, "replicas": state.replicas, "spares": state.spares, "slurm": state.slurm,
        "boot_seconds": state.boot_seconds,
        "key": str(KEY_FILE), "inventory": str(INVENTORY),
        "hosts": [{"name": h.name, "address": h.address, "pid": h.pid, "rank": h.index} for h in state.hosts],
    }
    write_json_atomic(STATE_JSON, public)


def remove_outputs() -> None:
    for path in (INVENTORY, STATE_JSON, KNOWN_HOSTS) + ((INVENTORY.parent / "group_vars",) if INSTANCE else ()):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    with contextlib.suppress(OSError):
        INVENTORY.parent.rmdir()
