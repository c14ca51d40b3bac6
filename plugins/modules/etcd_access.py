#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: etcd_access
short_description: Turn on etcd's authentication for a shadowline deployment, with one user per identity
version_added: "0.2.0"
description:
  - On an infra host of the deployment, creates (or brings up to date) the etcd users C(root), C(agent) and
    C(dynamo) with the passwords installed under the plan's secrets directory on this host, the roles
    C(shadowline-agent) (read-write on the deployment's coordination keys and Dynamo's discovery keys) and
    C(shadowline-dynamo) (read-write on Dynamo's discovery keys only), then turns authentication on.
  - Idempotent. Passwords are read from files on the host; none is an option, a result or a log line.
  - Talks to etcd over TLS with the host's etcd client certificate when the plan's etcd clients use TLS (every
    plan but a Slurm job's, unless C(gms_insecure=true)).
  - Does nothing for a plan with C(gms_insecure=true).
options:
  plan:
    description: The cohort plan (C(gms_plan)) from M(shadowline.gms.preflight).
    type: dict
    required: true
  endpoint:
    description: The etcd member to talk to; the first of the plan's endpoints when unset.
    type: str
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
- name: Turn on etcd's authentication
  shadowline.gms.etcd_access:
    plan: "{{ gms_plan }}"
  run_once: true
"""

RETURN = r"""
changed_items:
  description: What was created, granted (only where missing) or turned on.
  returned: always
  type: list
  elements: str
  sample: ["user root", "user root: role root", "role shadowline-agent", "role shadowline-agent: v1/",
           "authentication enabled"]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.cluster.access import (
    ensure_etcd_auth,
    etcd_context,
    read_secret,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.common.etcd_client import EtcdError
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import ETCD_USERS, Plan


def main() -> None:
    module = AnsibleModule(argument_spec={"plan": {"type": "dict", "required": True}, "endpoint": {"type": "str"}},
                           supports_check_mode=True)
    plan = Plan.from_dict(module.params["plan"])
    if not plan.secure or plan.security is None or module.check_mode:
        module.exit_json(changed=False, changed_items=[])
    endpoint = module.params["endpoint"] or plan.infra.etcd_endpoints.split(",")[0]
    try:
        passwords = {user: read_secret(plan.security.password_file(user)) for user in ETCD_USERS
                     if user != "dynamo"}
        with open(plan.security.dynamo_env, encoding="utf-8") as handle:
            env = dict(line.split("=", 1) for line in handle.read().splitlines() if "=" in line)
        passwords["dynamo"] = env["ETCD_AUTH_PASSWORD"]
        context = etcd_context(plan)  # etcd's clients over TLS: the host's etcd client certificate
    except (OSError, KeyError, EtcdError) as err:
        module.fail_json(msg=f"the deployment's etcd passwords or certificates are not installed on this host "
                             f"({err}); run the whole playbook (the base role installs them)")
    for password in passwords.values():
        module.no_log_values.add(password)
    try:
        changed = ensure_etcd_auth(endpoint, plan.deployment, passwords, context=context)
    except EtcdError as err:
        module.fail_json(msg=f"could not set up etcd's authentication: {err}")
    module.exit_json(changed=bool(changed), changed_items=changed)


if __name__ == "__main__":
    main()
