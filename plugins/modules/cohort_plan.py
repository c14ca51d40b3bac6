#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cohort_plan
short_description: The cohort plan of a shadowline deployment, from the inventory alone
version_added: "0.1.0"
description:
  - Builds the cohort plan (every cohort's ENGINE_ID, role and ports; every rank's host, headless flag, argv and
    environment) from the inventory contract of the hosts in the nodes group, and sets it as the fact C(gms_plan).
  - Contacts no host and checks no host state; use C(playbooks/preflight.yml) before changing hosts. Fails with
    every problem of the inventory at once.
  - Runs on the controller.
options:
  nodes_group:
    description: The inventory group of the GPU nodes.
    type: str
    default: gms_nodes
  infra_group:
    description: The inventory group of the etcd, NATS and frontend hosts.
    type: str
    default: gms_infra
  spares_group:
    description: The inventory group of the spare nodes (a GMS server and an agent each, no rank); absent means none.
    type: str
    default: gms_spares
attributes:
  facts:
    support: full
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - shadowline.gms.controller_action
  - ansible.builtin.action_common_attributes.facts
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
- name: Know the plan without running preflight
  shadowline.gms.cohort_plan:
  run_once: true
"""

RETURN = r"""
plan:
  description: The cohort plan.
  returned: success
  type: dict
"""
