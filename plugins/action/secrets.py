# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of shadowline.gms.secrets: create the deployment's secrets in gms_secrets_dir (once, under a
lock: every host's task runs this) and install this host's share with one run of shadowline.gms.install_files,
no_log. Returns paths only; never a password or a key."""

from __future__ import annotations

import fcntl
import os
from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import Plan
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.secrets import (
    controller_dir,
    ensure_secrets,
    host_files,
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        _unused, args = self.validate_argument_spec(argument_spec={"plan": {"type": "dict", "required": True}})
        plan = Plan.from_dict(args["plan"])
        if not plan.secure or plan.security is None:
            result.update(changed=False, paths=[], msg="gms_insecure: true - no secrets")
            return result
        host = (task_vars or {}).get("inventory_hostname", "")
        where = controller_dir(plan)
        if self._task.check_mode and not os.path.isdir(where):
            result.update(changed=True, paths=[], controller_dir=where,
                          msg=f"would create the secrets of deployment {plan.deployment} in {where}")
            return result
        try:
            written = self._ensure(plan, where)
            entries = host_files(plan, host)
            files = []
            for entry in entries:
                with open(entry["src"], encoding="utf-8") as handle:
                    files.append({"path": entry["dest"], "content": handle.read(), "owner": entry["owner"],
                                  "group": plan.service_user if entry["owner"] != "root" else "root",
                                  "mode": entry["mode"]})
        except (OSError, ImportError) as err:
            result.update(failed=True, msg=f"could not create the deployment's secrets in {where}: "
                                           f"{err.__class__.__name__}: {getattr(err, 'strerror', None) or err}. "
                                           "Fix: make gms_secrets_dir a private, writable directory on the "
                                           "controller (and install python3-cryptography there).")
            return result
        directory = {"path": plan.security.dir, "owner": "root", "group": plan.service_user, "mode": "0750"}
        module_args = {"directories": [directory], "files": files}
        installed = self._execute_module(module_name="shadowline.gms.install_files", module_args=module_args,
                                         task_vars=task_vars)
        if installed.get("failed"):
            result.update(failed=True, msg=f"installing the deployment's secrets on {host} failed: "
                                           f"{installed.get('msg', 'see the host')}")
            return result
        result.update(changed=bool(installed.get("changed")), paths=[f["path"] for f in files], controller_dir=where,
                      created_on_controller=written,
                      msg=f"{len(files)} credential file(s) of deployment {plan.deployment} on {host}")
        return result

    def _ensure(self, plan: Plan, where: str) -> list[str]:
        if self._task.check_mode and not os.path.isdir(where):
            return []
        os.makedirs(where, mode=0o700, exist_ok=True)
        with open(os.path.join(where, ".lock"), "w", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # every host's task creates what is missing, one at a time
            return ensure_secrets(plan)
