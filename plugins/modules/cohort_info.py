#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cohort_info
short_description: Live state of every engine cohort's rank on a node
version_added: "0.1.0"
description:
  - For each cohort of the plan, the rank on this node - its systemd unit, main pid and state - C(parked)
    (leader in standby, waiting for the failover lock), C(waking), C(active) (serving), C(starting),
    C(running) (a headless rank's process runs, which is all it shows), C(wedged) (a leader alive but its
    C(/health) does not answer) or C(dead) (no process). A leader's entry also has C(requests_running) and
    C(generated_tokens) from vLLM's progress metrics when it serves them.
  - On the node that holds the cohorts' leaders, also the live holder of the failover lock.
  - On a spare node (C(gms_spares)), which holds no rank, the state of its GMS server's and its agent's units.
  - Read-only; the same code serves the failover agent.
options:
  health_timeout_s:
    description: How long a leader's C(/health) may take before the rank counts as wedged.
    type: float
    default: 1.0
  failover_state:
    description:
      - Also read from the deployment's etcd whether automatic failover runs or an operator paused it
        (C(playbooks/pause.yml)); on a node of the deployment (it reads that node's etcd credentials).
    type: bool
    default: false
attributes:
  platform:
    platforms: posix
  check_mode:
    support: full
  diff_mode:
    support: none
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - shadowline.gms.node_plan
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
- name: Read the cohorts' state on every node
  shadowline.gms.cohort_info:
    plan: "{{ gms_plan }}"
    host: "{{ inventory_hostname }}"
  register: cohorts
"""

RETURN = r"""
ranks:
  description: One entry per cohort rank on this node.
  returned: always
  type: list
  elements: dict
  sample:
    - {cohort: 0, role: primary, host: node0, rank: 0, leader: true, pid: 1234, state: active, health: 200,
       unit: shadowline-demo-engine@0.service, ports: {master: 29500, system: 8080, nixl: 8280}}
lock_holder:
  description: C(engine-<id>) of the cohort holding the failover lock on this node, or null.
  returned: always
  type: str
spare:
  description: On a spare node, its GMS server's and its agent's unit states (systemd's ActiveState); null on a node.
  returned: always
  type: dict
  sample: {host: node4, gms_server: active, agent: active}
failover:
  description: With O(failover_state), C(automatic) or since when, by whom and why automatic failover is paused;
    null without it.
  returned: always
  type: str
  sample: "PAUSED since 2026-11-29 00:20:05 UTC by alice: switch firmware"
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.cluster.cohort_state import (
    lock_holder,
    rank_states,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.common.proc import unit_properties
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.control.failover import (
    FailoverError,
    paused_record,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.control.pause import describe_pause
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import Plan, spare_hosts


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "plan": {"type": "dict", "required": True},
            "host": {"type": "str", "required": True},
            "health_timeout_s": {"type": "float", "default": 1.0},
            "failover_state": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    plan = Plan.from_dict(module.params["plan"])
    host = module.params["host"]
    if host in spare_hosts(plan):
        units = {"gms_server": plan.unit_name("gms"), "agent": plan.unit_name("agent")}
        spare = {"host": host, **{name: unit_properties(unit, "ActiveState").get("ActiveState") or "unknown"
                                  for name, unit in units.items()}}
        module.exit_json(changed=False, ranks=[], lock_holder=None, failover=None, spare=spare)
    if host not in plan.hosts + plan.infra_hosts:
        module.fail_json(msg=f"host: {host} is not a node of deployment {plan.deployment}. "
                             "Fix: pass the node's inventory name (inventory_hostname).")
    ranks = rank_states(plan, host, module.params["health_timeout_s"])
    leader = any(r["leader"] for r in ranks)
    failover = None
    if module.params["failover_state"]:
        try:
            failover = describe_pause(paused_record(plan))
        except FailoverError as err:
            failover = f"unknown ({str(err)[:100]})"
    module.exit_json(changed=False, ranks=ranks, lock_holder=lock_holder(plan.lock_path) if leader else None,
                     failover=failover, spare=None)


if __name__ == "__main__":
    main()
