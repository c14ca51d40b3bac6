#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fault_inject
short_description: Inject a failover drill's fault on one node, or undo what it left
version_added: "0.1.0"
description:
  - Runs on the node the fault lands on (C(playbooks/drill.yml) delegates it there), as root.
  - C(kill-leader), C(kill-worker), C(kill-standby) - SIGKILL the main process of the cohort's engine unit on
    this node. C(hang-leader), C(hang-worker) - SIGSTOP every process of the cohort's engine unit on this node
    (the leader's or a headless rank's; the whole rank freezes). C(stall-generation) - write C(hang-collective)
    into the stand-in's per-rank fault control file (C(<lock dir>/fault-engine-<id>-rank-<r>)), so the rank stops in
    its collective while its process runs. C(gpu-xid-app), C(gpu-xid-fatal) - append an Xid 31 (the leader node's
    GPU) or Xid 79 (this node's GPU, fenced until C(playbooks/failover.yml -e unfence=)) to the stand-in's fake GPU
    event file, which the agent's GPU watch reads as it reads NVML's events on a GPU node. C(kill-gms), C(kill-agent) - SIGKILL the main process of the
    node's GMS server or agent unit. C(cut-node) - a transient unit takes the interface that carries the node's
    address down for I(cut_s) seconds and up again (the module answers first).
  - With I(state=restored), undoes what the drill left - removes the control file, sends SIGCONT to processes
    still frozen (I(pids)), waits for the cut to end and makes sure the link is up - and returns when the link
    really went down and up.
  - The fault happens at the machine time I(at) (unix seconds), so the drill knows its load runs by then.
options:
  fault:
    description: The fault.
    type: str
    required: true
    choices: [kill-leader, kill-worker, hang-leader, hang-worker, stall-generation, gpu-xid-app, gpu-xid-fatal,
              kill-standby, kill-gms, kill-agent, cut-node]
  cohort:
    description: The cohort whose rank on this node the fault hits (engine faults).
    type: int
  at:
    description: Unix time to inject at; now when unset or past.
    type: float
  cut_s:
    description: How long C(cut-node) keeps the link down.
    type: float
    default: 5.0
  pids:
    description: With I(state=restored) and C(hang-leader), the processes the fault froze.
    type: list
    elements: int
    default: []
  state:
    description: C(injected) injects the fault, C(restored) undoes what it left.
    type: str
    default: injected
    choices: [injected, restored]
attributes:
  platform:
    platforms: posix
  check_mode:
    support: full
    details: Reports what it would do and does nothing.
  diff_mode:
    support: none
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - shadowline.gms.node_plan
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
- name: SIGKILL the serving leader
  shadowline.gms.fault_inject:
    plan: "{{ gms_plan }}"
    host: node0
    fault: kill-leader
    cohort: 0
  delegate_to: node0

- name: Cut node2 off for 5 seconds
  shadowline.gms.fault_inject:
    plan: "{{ gms_plan }}"
    host: node2
    fault: cut-node
    cut_s: 5
  delegate_to: node2
"""

RETURN = r"""
injected_at:
  description: Unix time of the fault (for cut-node, when the link is due to go down).
  returned: state=injected, not in check mode
  type: float
action:
  description: What was done, in words.
  returned: always
  type: str
  sample: SIGKILL pid 4242 (shadowline-demo-engine@0.service main process)
pids:
  description: The processes signalled.
  returned: state=injected
  type: list
  elements: int
late_s:
  description: How late the injection was against I(at).
  returned: state=injected, not in check mode
  type: float
cut:
  description: For cut-node with I(state=restored), when the link went down and up (unix time).
  returned: state=restored and fault=cut-node
  type: dict
done:
  description: With I(state=restored), what was undone.
  returned: state=restored
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import Plan
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.drill.faults import FAULTS, DrillError
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.drill.node import inject, restore


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "plan": {"type": "dict", "required": True},
            "host": {"type": "str", "required": True},
            "fault": {"type": "str", "required": True, "choices": list(FAULTS)},
            "cohort": {"type": "int"},
            "at": {"type": "float"},
            "cut_s": {"type": "float", "default": 5.0},
            "pids": {"type": "list", "elements": "int", "default": []},
            "state": {"type": "str", "default": "injected", "choices": ["injected", "restored"]},
        },
        supports_check_mode=True,
    )
    p = module.params
    plan = Plan.from_dict(p["plan"])
    if p["host"] not in plan.hosts:
        module.fail_json(msg=f"host: {p['host']} is not a node of deployment {plan.deployment}")
    if FAULTS[p["fault"]].cohort and p["cohort"] is None:
        module.fail_json(msg=f"cohort: {p['fault']} hits a cohort's rank; say which (cohort: <n>)")
    if module.check_mode:
        verb = "undo what" if p["state"] == "restored" else "inject"
        module.exit_json(changed=p["state"] == "injected", action=f"would {verb} {p['fault']} on {p['host']}"
                         + (f" (cohort {p['cohort']})" if p["cohort"] is not None else ""))
    try:
        if p["state"] == "restored":
            result = restore(plan, p["host"], p["fault"], p["cohort"], p["pids"])
            result["action"] = "; ".join(result["done"]) or "nothing to undo"
            module.exit_json(**result)
        result = inject(plan, p["host"], p["fault"], p["cohort"], p["at"], p["cut_s"])
    except DrillError as err:
        module.fail_json(msg=str(err))
    module.exit_json(changed=True, **result)


if __name__ == "__main__":
    main()
