"""Never mint a second set of secrets for a running deployment.

The deployment's CA and etcd passwords are made once, on the controller, in ``gms_secrets_dir`` (secrets.py). A
controller that lacks them (an AWX/AAP execution environment is a fresh container for every job; a new laptop)
would make new ones and install them over those the running hosts use: NATS and its clients would stop trusting
each other, and etcd, which keeps its users' passwords in its data, would refuse the agents. Preflight compares
digests instead: each host says which secrets it has installed (``installed_digests``, a node fact: digests only,
never content), the controller says what its directory holds (``controller_digests``), and ``minting_problems``
refuses a run that would replace them unless the operator rotates on purpose (``gms_secrets_rotate``).
etcd's root password is never rotated that way: the old one is needed to set any password in etcd.
"""

from __future__ import annotations

import hashlib
import os

from ..common.problems import Problem

# name on a host (under the plan's security.dir) -> (path under gms_secrets_dir, what it is)
GUARDED = {
    "ca.crt": ("pki/ca.crt", "certificate authority"),
    "etcd-agent.password": ("etcd-agent.password", "etcd password of the agents"),
    "etcd-root.password": ("etcd-root.password", "etcd root password"),
}
ROOT_PASSWORD = "etcd-root.password"


def file_digest(path: str) -> str | None:
    """The file's SHA-256 (hex), None when it is not there or cannot be read."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def installed_digests(security_dir: str) -> dict[str, str | None]:
    """What a host has installed (a node fact), by the names of GUARDED."""
    return {name: file_digest(os.path.join(security_dir, name)) for name in GUARDED}


def controller_digests(controller_dir: str) -> dict[str, str | None]:
    """What ``gms_secrets_dir`` holds, by the names a host installs them under."""
    return {name: file_digest(os.path.join(controller_dir, path)) for name, (path, _what) in GUARDED.items()}


def minting_problems(deployment: str, controller_dir: str, controller: dict[str, str | None],
                     installed: dict[str, dict[str, str | None] | None], rotate: bool) -> list[Problem]:
    """One problem per secret that this run would make anew, or install over another, on hosts that run with
    one (``installed``: host -> its digests; None for a host that has none yet, e.g. before the first run)."""
    problems: list[Problem] = []
    for name, (path, what) in GUARDED.items():
        held = {host: digests[name] for host, digests in sorted(installed.items()) if digests and digests.get(name)}
        if not held:
            continue
        ours = controller.get(name)
        other = sorted(host for host, digest in held.items() if digest != ours)
        if not other or (rotate and name != ROOT_PASSWORD):
            continue
        where = f"{controller_dir}/{path}"
        hosts = ", ".join(other[:3]) + (f" and {len(other) - 3} more" if len(other) > 3 else "")
        if ours is None:
            message = (f"deployment {deployment} runs with its {what} ({name} on {hosts}), and {where} is not "
                       f"there: this run would make a new one and install it over the running one.")
        else:
            message = (f"{hosts} run deployment {deployment} with another {what} than {where} holds: this "
                       f"controller's copy is another deployment's or from before a rotation.")
        if name == ROOT_PASSWORD:
            fix = (f"put the deployment's {path} back in gms_secrets_dir (etcd needs the old root password to set "
                   f"any password); a new one only with new etcd data: playbooks/teardown.yml, then site.yml.")
        else:
            fix = ("point gms_secrets_dir at the directory that holds this deployment's secrets (AWX/AAP: storage "
                   "that outlives the job, docs/awx.md), or replace them on purpose with -e gms_secrets_rotate=true "
                   "(docs/security.md, 'Rotating credentials').")
        problems.append(Problem("gms_secrets_dir", message, fix))
    return problems
