#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: failover_pause
short_description: Pause or resume a deployment's automatic failover for maintenance
version_added: "0.2.0"
description:
  - Writes (or removes) the deployment's pause record in etcd. While it is there every agent still watches,
    probes and reports, but declares no generation failed, and the driver relaunches nothing; each decision it
    holds is an event (C(failover-held)). A failover an operator runs meanwhile (C(playbooks/failover.yml)) still
    happens, and a dead primary's lock still passes to a parked shadow (the kernel does that).
  - On resume every agent restarts itself and reconciles what it finds (a rank that died meanwhile is declared
    then).
  - Pausing again keeps the first record (its time and reason).
  - Runs on a node of the deployment (it reads that node's etcd credentials); C(playbooks/pause.yml) runs it on
    the leader node.
options:
  plan:
    description: The cohort plan (the C(gms_plan) fact).
    type: dict
    required: true
  paused:
    description: C(true) pauses automatic failover, C(false) resumes it.
    type: bool
    required: true
  reason:
    description: Why (kept in the record and in the agents' events).
    type: str
    default: ""
  by:
    description: Who (kept in the record).
    type: str
    default: ""
attributes:
  platform:
    platforms: posix
  check_mode:
    support: full
    details: Says whether failover is paused and what would change, and changes nothing.
  diff_mode:
    support: full
    details: The pause record before and after.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
- name: Pause automatic failover while the switches are upgraded
  shadowline.gms.failover_pause:
    plan: "{{ gms_plan }}"
    paused: true
    reason: switch firmware upgrade, CHG-1234
  delegate_to: "{{ gms_plan.nodes[0].host }}"
  run_once: true

- name: Resume it
  shadowline.gms.failover_pause:
    plan: "{{ gms_plan }}"
    paused: false
  delegate_to: "{{ gms_plan.nodes[0].host }}"
  run_once: true
"""

RETURN = r"""
before:
  description: The pause record before (by, since, reason), or null when failover ran.
  returned: always
  type: dict
  sample: {by: alice, since: 1795640188.7, reason: switch firmware upgrade}
after:
  description: The pause record after, or null when failover runs.
  returned: always
  type: dict
  sample: null
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.control.failover import (
    FailoverError,
    set_paused,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import Plan


def describe(record: dict | None) -> str:
    if record is None:
        return "failover runs\n"
    return f"failover paused by {record.get('by') or '?'}: {record.get('reason') or '(no reason given)'}\n"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "plan": {"type": "dict", "required": True},
            "paused": {"type": "bool", "required": True},
            "reason": {"type": "str", "default": ""},
            "by": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    plan = Plan.from_dict(module.params["plan"])
    try:
        result = set_paused(plan, module.params["paused"], module.params["reason"], module.params["by"],
                            check=module.check_mode)
    except FailoverError as err:
        module.fail_json(msg=str(err))
    module.exit_json(changed=result["changed"], before=result["before"], after=result["after"],
                     diff={"before": describe(result["before"]), "after": describe(result["after"])})


if __name__ == "__main__":
    main()
