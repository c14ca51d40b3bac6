#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight
short_description: Check a whole shadowline deployment before anything changes, reporting every problem at once
version_added: "0.1.0"
description:
  - Reads the inventory contract (C(gms_deployment), C(gms_model), C(gms_engine), C(gms_cohorts), C(gms_ports),
    C(gms_socket_dir), C(gms_lock_path), C(gms_memory) and the rest) of every host in the nodes group, and the
    facts that M(shadowline.gms.preflight_facts) gathered on each of them, and checks them together.
  - "Checks: variable names (typos are named) and types; node ranks unique, contiguous, one leader; C(nnodes)
    equal to the number of nodes; tensor parallel size fits and splits evenly; every port in 1024..65535 with no
    collision between cohorts and infra, and not already used on a node by a process outside the deployment;
    the lock path on a local filesystem (not NFS, Lustre, GPFS, BeeGFS, CIFS) where it can be created; model
    revision pinned and weights in safetensors unless allowed; GPU count and memory budget where known; for the
    C(dynamo_vllm) backend, that the runtime Python finds C(dynamo.vllm) and C(gpu_memory_service)."
  - Every problem names the variable and the host, what is wrong and the fix. The task fails once with all of
    them. It changes nothing anywhere; on success it returns the cohort plan.
  - Runs on the controller; use it with C(run_once) after gathering facts on every node.
options:
  nodes_group:
    description: The inventory group of the GPU nodes.
    type: str
    default: gms_nodes
  infra_group:
    description: The inventory group of the etcd, NATS and frontend hosts (empty or absent means the leader node).
    type: str
    default: gms_infra
  spares_group:
    description: The inventory group of the spare nodes (a GMS server and an agent each, no rank); absent means none.
    type: str
    default: gms_spares
  facts_name:
    description: The fact that M(shadowline.gms.preflight_facts) set on each node.
    type: str
    default: shadowline_node
seealso:
  - module: shadowline.gms.preflight_facts
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - shadowline.gms.controller_action
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
- name: Gather node facts
  shadowline.gms.preflight_facts:
    deployment: "{{ gms_deployment | default(omit) }}"

- name: Check the whole deployment
  shadowline.gms.preflight:
  run_once: true
  register: preflight
"""

RETURN = r"""
plan:
  description: The cohort plan, every process of the deployment with its host, argv and environment.
  returned: success
  type: dict
checks:
  description: What was checked.
  returned: always
  type: list
  elements: str
problems:
  description: Every problem found, each with field, host, message and fix.
  returned: always
  type: list
  elements: dict
"""
