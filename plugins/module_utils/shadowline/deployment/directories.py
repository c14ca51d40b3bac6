"""The directories a deployment makes on a host, which of them it may later remove, and its tmpfiles.d entry.

The one home of what teardown may remove (issue #42: it removed the socket directory's parent, whatever that
was). The base role makes these directories with shadowline.gms.install_files; each one marked here gets a marker
file (``.shadowline-deployment``, holding the deployment's name) when, and only when, the module creates it. A
directory that was there before (a user's) is never marked. playbooks/teardown.yml removes a marked directory only
if it still holds the marker naming the deployment, and never the parent of a user-given path: the socket
directory's parent is made and marked only when it is the deployment's own default (/run/shadowline/<deployment>).
"""

from __future__ import annotations

from typing import Any

from ..model.policy import MANIFEST_NAME
from .contract import default_socket_dir
from .plan import Plan

MARKER = ".shadowline-deployment"  # plugins/modules/install_files.py writes and reads it (its own copy: a module)


def deployment_directories(plan: Plan) -> list[dict[str, Any]]:
    """install_files ``directories`` of the base role, in order: configuration, state, the default socket
    directory's parent, the socket directory (which also holds the failover lock by default) and, when
    gms_lock_path is elsewhere, the lock's directory (the engines' and the agent's units may write it:
    units.lock_dir_writable). Each is marked: install_files writes the marker into it if it makes it.

    The parent of a gms_socket_dir the user gave is the user's: it is not listed, so never marked, chowned or
    removed (install_files makes it, root 0755, only when it is missing)."""
    user = plan.service_user
    found = [
        {"path": plan.config_dir, "owner": "root", "group": user, "mode": "0750", "mark": True},
        {"path": plan.state_dir, "owner": user, "group": user, "mode": "0750", "mark": True},
    ]
    if plan.socket_dir == default_socket_dir(plan.deployment):  # /run/shadowline/<deployment>: the deployment's
        found.append({"path": plan.socket_dir.rsplit("/", 1)[0], "owner": "root", "group": "root", "mode": "0755",
                      "mark": True})
    found.append({"path": plan.socket_dir, "owner": user, "group": user, "mode": "0750", "mark": True})
    if plan.lock_dir not in {entry["path"] for entry in found}:  # gms_lock_path outside the socket directory
        found.append({"path": plan.lock_dir, "owner": user, "group": user, "mode": "0750", "mark": True})
    return found


def removable_directories(plan: Plan, models: bool = False) -> list[dict[str, str]]:
    """What teardown may remove, as install_files ``owned_absent`` entries, each removed only if it proves to be
    the deployment's: the marked directories (their marker names the deployment; a removed parent takes its
    children with it) and, with ``models``, the model's directory if it holds shadowline's staging manifest of
    the plan's model (model/policy.py MANIFEST_NAME, whose model_id is gms_model.id)."""
    found = [{"path": d["path"]} for d in deployment_directories(plan) if d["mark"]]
    if models:
        found.append({"path": plan.model_dir, "marker": MANIFEST_NAME, "key": "model_id", "owner": plan.model_id})
    return found


def tmpfiles_text(plan: Plan, owned: list[str]) -> str:
    """/etc/tmpfiles.d/shadowline-<deployment>.conf: the socket directory (and the default one's parent) made again
    at boot (/run is a tmpfs; systemd-tmpfiles makes missing parents 0755), with their markers for those the
    deployment owns (``owned``: install_files' result), so that teardown after a reboot still knows them."""
    lines = [f"# shadowline {plan.deployment}: GMS sockets and the failover lock (flock needs a local filesystem)"]
    for entry in deployment_directories(plan)[2:]:
        lines.append(f"d {entry['path']} {entry['mode']} {entry['owner']} {entry['group']} -")
        if entry["path"] in owned:
            lines.append(f"f {entry['path']}/{MARKER} 0644 root root - {plan.deployment}")
    return "\n".join(lines) + "\n"
