# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of shadowline.gms.show (an action plugin: it runs on the controller)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: show
short_description: Print text for a person to read, line by line
version_added: 0.2.0
description:
  - Prints O(text) on the controller as plain lines between the task's banner and its result, so a table (the
    status table, a drill's timeline) reads as a table. M(ansible.builtin.debug) shows a multi-line message as
    a JSON-quoted string or list.
  - The lines are also returned, for a register.
options:
  text:
    description: The text to print; each line as it is.
    type: str
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - shadowline.gms.controller_action
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
- name: Print the status table
  shadowline.gms.show:
    text: "{{ results | shadowline.gms.status_table(gms_plan.model_id) }}"
  run_once: true
"""

RETURN = r"""
lines:
  description: The lines printed.
  returned: always
  type: list
  elements: str
  sample: ["cohort role    node   rank pid   state", "0      primary node0  0    4242  active"]
"""
