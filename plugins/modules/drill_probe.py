#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: drill_probe
short_description: What a failover drill reads on a node, before and after the fault
version_added: "0.1.0"
description:
  - I(mode=steady) - on the leader node, waits (up to I(steady_timeout_s)) until the deployment is steady
    (every slot running, a cohort holding the failover lock, the other leaders parked), returns the slots, the
    lock holder and the leaders' failover states and, with I(fault), chooses where the fault lands.
  - I(mode=before) - on every node, records the processes of every cohort's engine unit (pid and start time,
    from the unit's cgroup), the agent's and the GMS server's pids and (stand-in) whether the weights are
    resident.
  - I(mode=settle) - on the leader node, waits until the agents are done with the fault injected at I(since)
    and the deployment serves again (a failure declared if one is expected, every slot running or dead again,
    the lock holder's leader active, the frontend listing the model), at least I(min_s) and at most
    I(timeout_s) seconds.
  - I(mode=after) - on every node, which processes of I(snapshot) (this node's I(mode=before) result) are
    still alive, the agent's events since I(since), the agent's and the GMS server's pids; on the leader node
    also the slots, the lock holder and every leader's failover state.
  - Read-only; the clock of the returned times is the node's (testbed hosts share the machine's).
options:
  mode:
    description: What to read (see the description).
    type: str
    required: true
    choices: [steady, before, settle, after]
  fault:
    description:
      - With I(mode=steady), the fault whose target to choose; with I(mode=settle), the fault whose end to wait
        for (a fault that fences a node ends once every slot is held).
    type: str
  target:
    description: With I(fault), the node the fault lands on instead of its default.
    type: str
  steady_timeout_s:
    description: With I(mode=steady), how long to wait for a steady deployment.
    type: float
    default: 60
  settings:
    description:
      - With I(mode=steady), the drill's numbers (C(drill_rate), C(drill_max_s), C(drill_warmup_s), C(drill_tail_s),
        C(drill_cut_s), C(drill_steady_timeout_s), C(drill_request_timeout_s)) as given, checked for sense (finite,
        positive, bounded, ordered) before anything else; each refusal names the variable and the fix.
    type: dict
    default: {}
  since:
    description: Unix time of the fault (I(mode=settle)) or of the drill's start (I(mode=after)).
    type: float
  slots_before:
    description: With I(mode=settle), the slots as I(mode=steady) saw them.
    type: dict
    default: {}
  expect_failure:
    description: With I(mode=settle), a generation must be declared failed before the drill settles.
    type: bool
    default: false
  min_s:
    description: With I(mode=settle), observe at least this long after I(since).
    type: float
    default: 0.5
  timeout_s:
    description: With I(mode=settle), give up after this long.
    type: float
    default: 60
  snapshot:
    description: With I(mode=after), this node's engine processes from I(mode=before).
    type: dict
    default: {}
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
- name: Read the engine processes before the fault
  shadowline.gms.drill_probe:
    plan: "{{ gms_plan }}"
    host: "{{ inventory_hostname }}"
    mode: before
  register: before
"""

RETURN = r"""
time:
  description: The node's clock when it read.
  returned: always
  type: float
processes:
  description: With I(mode=before), {cohort - {unit, main_pid, active, processes [{pid, start, cmd}]}}.
  returned: mode=before
  type: dict
leader:
  description: Whether this is the leader node (the one with the lock, the leaders and the driver agent).
  returned: always
  type: bool
state:
  description: On the leader node - {lock_holder, slots, leaders}.
  returned: mode=steady, and mode=after on the leader node
  type: dict
workers:
  description: On the leader node, every Dynamo worker registered in discovery (every replica's) - {instance id
    in hex - the host address of its request plane}; the drill report names the replica that served each request
    from it.
  returned: mode=steady, and mode=after on the leader node
  type: dict
target:
  description: With I(fault) on the leader node, where it lands - {host, cohort, node_rank, summary}.
  returned: mode=steady with fault
  type: dict
settled:
  description: With I(mode=settle), whether the agents were done within I(timeout_s); C(settled_at) and
    C(note) say when, or what was still going on.
  returned: mode=settle
  type: bool
survivors:
  description: With I(mode=after), the processes of I(snapshot) still alive [{cohort, pid, start, cmd, stopped}].
  returned: mode=after
  type: list
  elements: dict
events:
  description: With I(mode=after), this node's agent events since I(since).
  returned: mode=after
  type: list
  elements: dict
agent:
  description: The agent unit's main pid (0 when it does not run) and when it started (unix time).
  returned: mode=before or mode=after
  type: dict
gms:
  description: The GMS server's pid, when it started and (stand-in) whether its weights sockets hold committed
    weights.
  returned: mode=before or mode=after
  type: dict
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.cluster.cohort_state import lock_holder
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.common.events import read_events
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import Plan
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.drill.faults import (
    DrillError,
    choose_target,
    fault,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.drill.node import (
    engine_processes,
    gms_state,
    leader_views,
    service_state,
    slots,
    survivors,
    wait_settled,
    wait_steady,
    workers,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.drill.settings import check as check_settings


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "plan": {"type": "dict", "required": True},
            "host": {"type": "str", "required": True},
            "mode": {"type": "str", "required": True, "choices": ["steady", "before", "settle", "after"]},
            "fault": {"type": "str"},
            "target": {"type": "str"},
            "steady_timeout_s": {"type": "float", "default": 60},
            "settings": {"type": "dict", "default": {}},
            "since": {"type": "float"},
            "slots_before": {"type": "dict", "default": {}},
            "expect_failure": {"type": "bool", "default": False},
            "min_s": {"type": "float", "default": 0.5},
            "timeout_s": {"type": "float", "default": 60},
            "snapshot": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    p = module.params
    plan = Plan.from_dict(p["plan"])
    if p["host"] not in plan.hosts:
        module.fail_json(msg=f"host: {p['host']} is not a node of deployment {plan.deployment}")
    leader = plan.node(p["host"]).rank == 0
    result = {"changed": False, "leader": leader, "host": p["host"]}
    try:
        if p["mode"] in ("steady", "settle") and not leader:
            module.fail_json(msg=f"mode={p['mode']} runs on the leader node (node rank 0): the lock and the "
                                 "driver agent are there")
        if p["mode"] == "steady":
            problems = check_settings(p["settings"])
            if problems:
                module.fail_json(msg="the drill's settings make no sense: " + " ".join(problems), problems=problems)
            if p["fault"] is not None:
                fault(p["fault"])  # the library's list of faults: an unknown one fails before any wait
            state = wait_steady(plan, p["steady_timeout_s"])
            result["state"] = state
            result["workers"] = workers(plan)
            if p["fault"] is not None:
                result["target"] = choose_target(plan, p["fault"], state["lock_holder"], p["target"] or None)
        elif p["mode"] == "before":
            result.update(processes=engine_processes(plan), agent=service_state(plan, "agent"), gms=gms_state(plan))
        elif p["mode"] == "settle":
            if p["since"] is None:
                module.fail_json(msg="since: the time of the fault is required with mode=settle")
            fences = fault(p["fault"]).fences if p["fault"] else False
            ok, at, note = wait_settled(plan, p["since"], p["slots_before"], p["expect_failure"], p["min_s"],
                                        p["timeout_s"], fences)
            result.update(settled=ok, settled_at=at, note=note)
        else:
            result.update(survivors=survivors(p["snapshot"]), agent=service_state(plan, "agent"),
                          gms=gms_state(plan),
                          events=list(read_events(plan.events_path, p["since"] or 0.0)))
            if leader:
                result["state"] = {"lock_holder": lock_holder(plan.lock_path), "slots": slots(plan),
                                   "leaders": leader_views(plan)}
                result["workers"] = workers(plan)
    except DrillError as err:
        module.fail_json(msg=str(err))
    result["time"] = time.time()
    module.exit_json(**result)


if __name__ == "__main__":
    main()
