#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: wait_ready
short_description: Wait, polling every tenth of a second, until a shadowline service is ready
version_added: "0.1.0"
description:
  - Polls one condition until it holds or I(timeout_s) passes - an HTTP status at I(url), at least I(count)
    files matching I(path_glob), or a live holder of the failover lock at I(lock_path) (optionally a given
    I(holder)).
  - Fails with what it saw last, and reports how long it waited. Changes nothing.
options:
  url:
    description: URL to GET.
    type: str
  status_code:
    description: The HTTP status that means ready.
    type: int
    default: 200
  path_glob:
    description: A glob pattern of files to count.
    type: str
  count:
    description: How many files must match I(path_glob).
    type: int
    default: 1
  lock_path:
    description: The failover lock file.
    type: path
  holder:
    description: The lock holder that means ready (C(engine-<id>)); any live holder when unset.
    type: str
  timeout_s:
    description: How long to wait.
    type: float
    default: 120
  interval_s:
    description: Time between checks.
    type: float
    default: 0.1
attributes:
  platform:
    platforms: posix
  check_mode:
    support: full
  diff_mode:
    support: none
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
- name: Wait for the frontend
  shadowline.gms.wait_ready:
    url: http://198.18.0.10:8000/health
    timeout_s: 60
"""

RETURN = r"""
waited_s:
  description: Seconds waited.
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.control.waits import (
    files_check,
    holder_check,
    http_check,
    poll,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str"},
            "status_code": {"type": "int", "default": 200},
            "path_glob": {"type": "str"},
            "count": {"type": "int", "default": 1},
            "lock_path": {"type": "path"},
            "holder": {"type": "str"},
            "timeout_s": {"type": "float", "default": 120},
            "interval_s": {"type": "float", "default": 0.1},
        },
        required_one_of=[("url", "path_glob", "lock_path")],
        mutually_exclusive=[("url", "path_glob", "lock_path")],
        supports_check_mode=True,
    )
    p = module.params
    if p["url"]:
        check = http_check(p["url"], p["status_code"])
    elif p["path_glob"]:
        check = files_check(p["path_glob"], p["count"])
    else:
        check = holder_check(p["lock_path"], p["holder"])
    ready, waited, seen = poll(check, p["timeout_s"], p["interval_s"])
    if not ready:
        module.fail_json(msg=f"not ready after {waited:.1f} s: {seen}", waited_s=round(waited, 3))
    module.exit_json(changed=False, waited_s=round(waited, 3))


if __name__ == "__main__":
    main()
