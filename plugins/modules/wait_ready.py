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
  - Fails with what it waited for, on which node (this host's name), for how long, and what it saw last; with
    I(unit), also that unit's state and its last journal lines. Reports what it waited for and how long.
    Changes nothing.
options:
  url:
    description: URL to GET.
    type: str
  tls:
    description:
      - For an https I(url) - C(ca) (the CA file to trust) and, where the server asks for one, C(cert) and C(key)
        (this client's certificate). Empty - the system's CAs, no client certificate.
    type: dict
    default: {}
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
  what:
    description: What is waited for, in words (V(the leader of cohort 0 healthy)); the condition when unset.
    type: str
  unit:
    description:
      - The systemd unit whose readiness this is; named, with its state and last log lines, on a timeout.
      - Its state is read every half second while waiting; once its process has ended by itself with a failure
        status (systemd's C(Result=exit-code), as an engine that refuses its arguments) the wait fails at once, with
        its last log lines, instead of waiting out I(timeout_s) (or the progress slice). A unit killed by a signal
        (the failover agent tears down a rank it did not launch, then relaunches the cohort) is waited for.
    type: str
  timeout_s:
    description: How long to wait.
    type: float
    default: 120
  interval_s:
    description: Time between checks.
    type: float
    default: 0.1
  progress_s:
    description:
      - With I(progress_s), one call waits at most that long and returns (C(ready) false, unchanged, not failed)
        what it saw, so that a loop prints a progress line per slice; the caller counts the slices toward
        I(timeout_s) (the engine role does) and fails on the last. 0 - wait the whole I(timeout_s) and fail on it.
    type: float
    default: 0
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
    what: the frontend answering /health
    unit: shadowline-llama-frontend.service
    timeout_s: 60
"""

RETURN = r"""
waited_s:
  description: Seconds waited.
  returned: always
  type: float
ready:
  description: Whether the condition held (always true unless I(progress_s) was given).
  returned: always
  type: bool
msg:
  description: What was waited for, on which node, and for how long (C(<what> on <node> - ready after 3.2 s)).
  returned: always
  type: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.cluster.access import client_context
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.cluster.waits import (
    every,
    files_check,
    holder_check,
    http_check,
    poll,
)

UNIT_CHECK_S = 0.5  # how often the unit's state is read while waiting (systemctl show: about 10 ms)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str"},
            "tls": {"type": "dict", "default": {}},
            "status_code": {"type": "int", "default": 200},
            "path_glob": {"type": "str"},
            "count": {"type": "int", "default": 1},
            "lock_path": {"type": "path"},
            "holder": {"type": "str"},
            "what": {"type": "str"},
            "unit": {"type": "str"},
            "timeout_s": {"type": "float", "default": 120},
            "interval_s": {"type": "float", "default": 0.1},
            "progress_s": {"type": "float", "default": 0},
        },
        required_one_of=[("url", "path_glob", "lock_path")],
        mutually_exclusive=[("url", "path_glob", "lock_path")],
        supports_check_mode=True,
    )
    p = module.params
    if p["url"]:
        tls = p["tls"] or {}
        context = client_context(tls["ca"], tls.get("cert"), tls.get("key")) if tls.get("ca") else None
        check = http_check(p["url"], p["status_code"], context=context)
    elif p["path_glob"]:
        check = files_check(p["path_glob"], p["count"])
    else:
        check = holder_check(p["lock_path"], p["holder"])
    what = p["what"] or (f"{p['url']} answering {p['status_code']}" if p["url"] else
                         f"{p['count']} file(s) matching {p['path_glob']}" if p["path_glob"] else
                         f"{p['holder'] or 'a live holder'} holding {p['lock_path']}")
    node = os.uname().nodename
    slice_s = p["progress_s"] if p["progress_s"] > 0 else p["timeout_s"]
    refused = every(UNIT_CHECK_S, lambda: unit_refused(module, p["unit"])) if p["unit"] else None
    ready, waited, seen = poll(check, slice_s, p["interval_s"], hopeless=refused)
    if not ready and p["unit"] and unit_ended(module, p["unit"]):  # it will never be ready: say so now
        module.fail_json(msg=f"{what} on {node}: unit {p['unit']} ended after {waited:.1f} s: "
                             f"{unit_summary(module, p['unit'])}", waited_s=round(waited, 3))
    if not ready and p["progress_s"] > 0:
        module.exit_json(changed=False, ready=False, waited_s=round(waited, 3), msg=f"{what} on {node}: {seen}")
    if not ready:
        msg = f"{what} on {node}: not ready after {waited:.1f} s; last seen: {seen}"
        if p["unit"]:
            msg += f"; unit {p['unit']} on {node}: {unit_summary(module, p['unit'])}"
        module.fail_json(msg=msg, waited_s=round(waited, 3))
    module.exit_json(changed=False, ready=True, waited_s=round(waited, 3),
                     msg=f"{what} on {node} - ready after {waited:.1f} s")


def unit_properties(module: AnsibleModule, unit: str, *names: str) -> dict[str, str]:
    """The unit's properties ``names`` as systemd shows them ({} without systemd)."""
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        return {}
    _rc, out, _err = module.run_command([systemctl, "show", *(f"--property={name}" for name in names), unit])
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def unit_ended(module: AnsibleModule, unit: str) -> bool:
    """Whether the unit has stopped (failed, or exited): an engine unit is never restarted by systemd."""
    return unit_properties(module, unit, "ActiveState").get("ActiveState") in ("failed", "inactive")


def unit_refused(module: AnsibleModule, unit: str) -> bool:
    """Whether the unit's process ended by itself with a failure status (systemd's Result exit-code), as an engine
    that refuses its arguments does: asked while waiting. A unit killed by a signal is not: the failover agent
    tears down (SIGKILL) a rank started outside its generations and relaunches the cohort, which then becomes
    ready (a redeployment over a failed generation, seen on the testbed); the end of the wait looks again."""
    props = unit_properties(module, unit, "ActiveState", "Result")
    return props.get("ActiveState") in ("failed", "inactive") and props.get("Result") == "exit-code"


def unit_summary(module: AnsibleModule, unit: str) -> str:
    """The unit's state and its last log lines, for a timeout's message."""
    props = unit_properties(module, unit, "ActiveState", "SubState", "Result")
    if not props:
        return "no systemd here"
    state = "/".join(props[name] for name in ("Result", "ActiveState", "SubState") if props.get(name)) or "unknown"
    journalctl = module.get_bin_path("journalctl")
    logs = ""
    if journalctl:
        _rc, out, _err = module.run_command([journalctl, "-u", unit, "-n", "60", "--no-pager", "-o", "json"])
        logs = " | ".join(own_lines(out, 5))
    return f"{state}" + (f"; last log lines: {logs}" if logs else "")


def own_lines(journal_json: str, count: int) -> list[str]:
    """The last ``count`` lines the unit's processes wrote, from ``journalctl -o json`` output: systemd's own lines
    about the unit (exited, failed, started, consumed CPU) are left out, so that a relaunch by the agent or a stop
    does not push the engine's error out of the message."""
    lines = []
    for entry_text in journal_json.splitlines():
        try:
            entry = json.loads(entry_text)
        except ValueError:
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # journald's JSON gives a message that is not UTF-8 as its bytes
            message = bytes(b & 0xFF for b in message if isinstance(b, int)).decode("utf-8", "replace")
        if entry.get("_PID") == "1" or not isinstance(message, str) or not message.strip():
            continue
        lines.append(message.strip())
    return lines[-count:]


if __name__ == "__main__":
    main()
