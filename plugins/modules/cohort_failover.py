#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cohort_failover
short_description: Planned or forced failover of one engine cohort across all nodes, group-atomically
version_added: "0.1.0"
description:
  - Declares the cohort's current generation failed in the deployment's etcd, exactly as a node agent does when
    it detects a failure (one compare-and-swap on the cohort's slot, reason C(planned-failover),
    C(handover-failover) or C(forced-failover)). Every node's agent then tears its rank of that generation down
    (the whole cohort on every node, or none), the driver agent verifies that a parked shadow takes the failover lock (when the
    cohort served) and relaunches the cohort as a fresh shadow.
  - Waits for the promotion and the relaunch and returns the timeline, from the driver's event log.
  - A slot the agents marked C(dead) after a crash loop is revived instead - a new generation is launched with
    its crash-loop count reset (fix the cause first).
  - C(planned) and C(handover) refuse to fail the serving cohort over while no shadow is parked (serving would
    stop until the relaunch); C(forced) does it anyway. The agents stop the ranks with SIGTERM, wait
    C(gms_failover.planned_grace_s) (planned, default 5 s, so that the engines drain) or
    C(gms_failover.term_grace_s) (handover and forced, default 0, at once), then SIGKILL - see docs/drills.md.
  - C(handover) is what C(playbooks/upgrade.yml) uses. The serving cohort's worker is first taken out of the
    frontend's routing with its model card kept (its C(v1/instances/) records deleted), so that new requests meet
    503s, which the OpenAI SDK retries, and the streams on it end on it, until its metrics count none running (at
    most C(gms_failover.planned_grace_s)); then it is ended at once and a parked shadow takes over. If the handover
    stops before the declaration, the worker is put back into routing. A draining Dynamo 1.6.1 engine (mode
    C(planned)) deregisters itself instead, and the frontend answers 404 (which no client retries) until the
    successor registers.
  - Runs on the leader node (node rank 0), where the lock and the driver agent's event log are; use
    C(delegate_to) and C(run_once) (C(playbooks/failover.yml) does).
options:
  plan:
    description: The cohort plan (the C(gms_plan) fact).
    type: dict
    required: true
  cohort:
    description: The cohort to fail over (0 is the primary).
    type: int
    required: true
  mode:
    description: C(planned), C(handover) or C(forced) (see the description).
    type: str
    default: planned
    choices: [planned, handover, forced]
  wait:
    description: Wait for the promotion (if the cohort served) and the relaunch.
    type: bool
    default: true
  timeout_s:
    description: How long to wait.
    type: float
    default: 120
attributes:
  platform:
    platforms: posix
  check_mode:
    support: full
    details: Says what it would do (the action and the slots before and after) and changes nothing.
  diff_mode:
    support: full
    details: The slots and the lock holder before, and as they are expected after.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
- name: Fail the serving cohort over to a parked shadow
  shadowline.gms.cohort_failover:
    plan: "{{ gms_plan }}"
    cohort: 0
  delegate_to: "{{ gms_plan.nodes[0].host }}"
  run_once: true
  register: failover

- name: Revive a slot the agents gave up on (after fixing the cause)
  shadowline.gms.cohort_failover:
    plan: "{{ gms_plan }}"
    cohort: 1
    mode: forced
  delegate_to: "{{ gms_plan.nodes[0].host }}"
  run_once: true
"""

RETURN = r"""
action:
  description: C(fail over), C(revive) (a dead slot) or C(wait) (already failed; only followed).
  returned: always
  type: str
reason:
  description: The reason recorded, C(planned-failover), C(handover-failover) or C(forced-failover).
  returned: always
  type: str
generation_before:
  description: The cohort's generation before.
  returned: always
  type: int
generation_after:
  description: The cohort's generation at the end.
  returned: when waited
  type: int
serving_before:
  description: The lock holder before (C(engine-<id>)).
  returned: always
  type: str
serving_after:
  description: The lock holder at the end.
  returned: when waited
  type: str
completed:
  description: Whether the promotion (if it served) and the relaunch happened within I(timeout_s).
  returned: when waited
  type: bool
drain:
  description: A handover of the serving cohort - C(derouted) (the routing records taken away), C(drain_s) (from
    that until the declaration), C(running_left) (requests still running then; null when the engine's metrics
    do not say).
  returned: when the serving cohort was handed over
  type: dict
  sample: {derouted: 2, drain_s: 0.065, running_left: 0.0}
timeline:
  description: Seconds after the declaration - C(generation_gone_s) (every rank gone on every node),
    C(teardown_per_node) (as the driver saw the confirmations, from the detection), C(promote_s),
    C(promoted_cohort), C(relaunch_s), C(slot_dead_s).
  returned: when waited
  type: dict
  sample: {generation_gone_s: 0.08, teardown_per_node: {node0: 0.05, node1: 0.07}, promote_s: 0.15,
           promoted_cohort: 1, relaunch_s: 1.9, slot_dead_s: null}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.control.failover import (
    MODES,
    FailoverError,
    plan_failover,
    run_failover,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import Plan


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "plan": {"type": "dict", "required": True},
            "cohort": {"type": "int", "required": True},
            "mode": {"type": "str", "default": "planned", "choices": list(MODES)},
            "wait": {"type": "bool", "default": True},
            "timeout_s": {"type": "float", "default": 120},
        },
        supports_check_mode=True,
    )
    p = module.params
    plan = Plan.from_dict(p["plan"])
    host = plan.leader_node.host
    try:
        if module.check_mode:
            planned = plan_failover(plan, p["cohort"], p["mode"])
            module.exit_json(changed=planned["action"] != "wait", action=planned["action"],
                             reason=f"{p['mode']}-failover", generation_before=planned["slot"].generation,
                             serving_before=planned["holder"], diff=planned["diff"],
                             msg=f"would {planned['action']} cohort {p['cohort']} "
                                 f"(generation {planned['slot'].generation}, {planned['slot'].state})")
        result = run_failover(plan, p["cohort"], p["mode"], f"{host} ({p['mode']}-failover)", p["wait"],
                              p["timeout_s"])
    except FailoverError as err:
        module.fail_json(msg=str(err))
    diff = result.pop("diff")
    changed = result["action"] != "wait"
    if p["wait"] and not result.get("completed"):
        module.fail_json(msg=f"cohort {p['cohort']}: no {' and no '.join(result.get('waiting_for', []))} within "
                             f"{p['timeout_s']:.0f} s; the agents' events say why (playbooks/status.yml)",
                         changed=changed, **result)
    result.update(changed=changed, diff=diff if module._diff else None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
