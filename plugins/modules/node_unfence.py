#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_unfence
short_description: Return a fenced node to service once its GPU was reset or the node serviced
version_added: "0.2.0"
description:
  - A node agent fences its node when a GPU health event (an Xid whose NVIDIA resolution is a GPU reset or node
    service, a double-bit ECC error, a GPU lost) takes a GPU out of service - every cohort has a rank on every
    node, so every cohort is failed and the driver relaunches nothing while a node is fenced.
  - This module removes the node's fence from the deployment's etcd. The driver then relaunches the slots it
    held, each as a fresh generation. Reset the GPU (C(nvidia-smi -r)) or service the node first.
  - Runs on a node of the deployment (it reads that node's etcd credentials); C(playbooks/failover.yml
    -e unfence=<node>) runs it on the leader node.
options:
  plan:
    description: The cohort plan (the C(gms_plan) fact).
    type: dict
    required: true
  node:
    description: The inventory name of the fenced node.
    type: str
    required: true
attributes:
  platform:
    platforms: posix
  check_mode:
    support: full
    details: Says whether the node is fenced, and why, and changes nothing.
  diff_mode:
    support: full
    details: The fence record before and none after.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
- name: Unfence node2 after its GPU was reset
  shadowline.gms.node_unfence:
    plan: "{{ gms_plan }}"
    node: node2
  delegate_to: "{{ gms_plan.nodes[0].host }}"
  run_once: true
"""

RETURN = r"""
fence:
  description: The fence record that was removed (GPU, Xid, action, detail, since), or null when the node was
    not fenced.
  returned: always
  type: dict
  sample: {gpu: GPU-5d0c3c36, xid: 79, action: node-service, detail: "Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS",
           since: 1795640188.7, node: node2}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.control.failover import (
    FailoverError,
    unfence,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import Plan


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "plan": {"type": "dict", "required": True},
            "node": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    plan = Plan.from_dict(module.params["plan"])
    try:
        result = unfence(plan, module.params["node"], check=module.check_mode)
    except FailoverError as err:
        module.fail_json(msg=str(err))
    diff = {"before": f"fenced: {result['fence']}\n" if result["fence"] else "not fenced\n", "after": "not fenced\n"}
    module.exit_json(changed=result["changed"], fence=result["fence"], diff=diff)


if __name__ == "__main__":
    main()
