#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin plugins/action/drill_report.py, on the controller; this file documents it.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: drill_report
short_description: The failover drill report from what a drill recorded on every node
version_added: "0.1.0"
description:
  - Computes the drill report (C(shadowline.drill.report)) from the results the tasks of C(playbooks/drill.yml)
    registered - the fault, the steady state before, every node's engine processes before and survivors,
    events, agent and GMS server after, the settle result and the load's requests - and checks what the fault
    expects (docs/drills.md).
  - Writes the report as JSON to I(path) (with the evidence it was computed from, so it can be recomputed) and
    the timeline as an SVG picture beside it; returns the table a person reads.
  - Runs on the controller (an action plugin).
options:
  plan:
    description: The cohort plan (on a fleet, the drilled replica's, C(shadowline.gms.replica_plan)).
    type: dict
    required: true
  fleet:
    description: The whole deployment's plan, to name the replica that served each request (the worker Dynamo
      names in each answer, whose request-plane address is a node of one replica). Defaults to I(plan).
    type: dict
  fault:
    description: The fault's name.
    type: str
  injected:
    description: The result of C(shadowline.gms.fault_inject).
    type: dict
    required: true
  restored:
    description: The result of C(shadowline.gms.fault_inject) with I(state=restored).
    type: dict
  steady:
    description: The result of C(shadowline.gms.drill_probe) with I(mode=steady).
    type: dict
    required: true
  before:
    description: Per host, the result of C(shadowline.gms.drill_probe) with I(mode=before).
    type: dict
  settle:
    description: The result of C(shadowline.gms.drill_probe) with I(mode=settle).
    type: dict
  after:
    description: Per host, the result of C(shadowline.gms.drill_probe) with I(mode=after).
    type: dict
  requests:
    description: The requests of C(shadowline.gms.drill_load).
    type: list
    elements: dict
  path:
    description: Where to write the JSON report; the SVG goes beside it (C(.svg) for C(.json)).
    type: path
  svg:
    description: Where to write the SVG instead.
    type: path
attributes:
  check_mode:
    support: full
    details: Computes and returns the report, writes no file.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - shadowline.gms.controller_action
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
# See playbooks/drill.yml, which registers every input.
- name: Compute the report
  shadowline.gms.drill_report:
    plan: "{{ gms_plan }}"
    injected: "{{ drill_injected }}"
    steady: "{{ drill_steady }}"
    path: /tmp/drill.json
  run_once: true
"""

RETURN = r"""
lines:
  description: The timeline table and the figures, for people.
  returned: always
  type: list
  elements: str
report:
  description: The report without the evidence and the timeline (fault, detect_s, teardown_s,
    teardown_per_node, promote_s, first_ok_s, failed_before_promotion, failed_after_promotion, orphans,
    relaunch_s, problems, notes, passed, ...).
  returned: always
  type: dict
passed:
  description: Whether every expectation of the fault held.
  returned: always
  type: bool
problems:
  description: The expectations that did not hold.
  returned: always
  type: list
  elements: str
path:
  description: The JSON report written.
  returned: when I(path) was given, not in check mode
  type: str
svg:
  description: The SVG timeline written.
  returned: when I(path) was given, not in check mode
  type: str
"""
