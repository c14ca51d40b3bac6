#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: readiness_gate
short_description: Refuse to start engines unless every node holds the same verified model
version_added: "0.2.0"
description:
  - The readiness gate of the engine role, over C(shadowline.model.readiness.readiness_gate) (the Slurm
    supervisor runs the same check) - every node of the deployment must report its model C(Ready), with the
    pinned revision and the same manifest digest.
  - Takes what C(ansible.builtin.slurp) of each node's model status file registered on the hosts of the play
    (I(reads)); a node of the plan that nobody read, or whose file is missing, has no model status.
  - The first host of the play that is a node of the deployment decides for all and fails with one message
    naming every node that differs and the fix; the other hosts only report the problems. Use it with
    C(any_errors_fatal), so the play stops on every node.
  - Returns the manifest digest of this host's model, which the engines' C(model.conf) drop-in records.
  - In check mode it reports the problems and does not fail (nothing may be staged yet).
  - Runs on the controller; reads nothing from the hosts itself.
options:
  plan:
    description: The cohort plan (C(gms_plan)).
    type: dict
    required: true
  reads:
    description:
      - What a C(ansible.builtin.slurp) of the status file registered, one entry per host of the play (the
        C(results) of a loop delegated to each node read, each carrying the node as C(item)), for example
        C(ansible_play_hosts | map('extract', hostvars, 'engine_model_status') | list).
      - A failed slurp (no status file) and a skipped one count as no status.
    type: list
    elements: dict
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - shadowline.gms.controller_action
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
- name: Read the model status file of every node of the deployment
  ansible.builtin.slurp:
    src: "{{ gms_plan.model_dir | shadowline.gms.model_status_path }}"
  delegate_to: "{{ item }}"
  loop: "{{ [inventory_hostname] }}"
  register: engine_model_status
  failed_when: false

- name: Refuse to start engines unless every node holds the same verified model
  shadowline.gms.readiness_gate:
    plan: "{{ gms_plan }}"
    reads: "{{ ansible_play_hosts | map('extract', hostvars, 'engine_model_status') | list }}"
  register: engine_model_gate
  any_errors_fatal: true
"""

RETURN = r"""
problems:
  description: What must be fixed before engines may start, one line per node and difference; empty means go.
  returned: always
  type: list
  elements: str
  sample:
    - "node2: manifest digest sha256:655241842c86… differs from sha256:2d17e989cc2e… held by node0, node1; restage node2."
digest:
  description: The manifest digest of the model this host holds (empty when it holds no Ready model).
  returned: always
  type: str
  sample: sha256:2d17e989cc2e0c6d0a6d3a7c5a2b0e9f3f0d1f6c2c7a5b8e9d0c1b2a3f4e5d6c
decided_on:
  description: The host that decides for the play (the first host of the play that is a node of the deployment).
  returned: always
  type: str
  sample: node0
"""
