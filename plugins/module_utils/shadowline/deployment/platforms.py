"""Which node platforms shadowline supports, and preflight's check of each host against them.

A GPU node needs systemd, a Python for Ansible's modules (3.8 or newer) and the runtime (a virtualenv or a
container: the runtime's own Python is not the system's). An infra host also runs etcd and nats-server from the
distribution's packages, and the agents speak etcd's ``/v3`` JSON gateway, which etcd has since 3.4: Ubuntu
22.04 packages etcd 3.3, so it may carry GPU nodes but not the infra. Another distribution is refused before
anything changes, rather than failing halfway through the roles (docs/gpu-cluster.md, Platforms).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..common.problems import Problem

OLDEST_PYTHON = (3, 8)


@dataclass(frozen=True)
class Platform:
    name: str
    infra: bool  # its packages carry etcd >= 3.4 and nats-server (the infra hosts' servers)
    tested: bool  # the testbed and CI run it
    note: str = ""


# (os-release ID, VERSION_ID) -> what it can carry.
PLATFORMS: dict[tuple[str, str], Platform] = {
    ("debian", "12"): Platform("Debian 12", infra=True, tested=True),
    ("ubuntu", "24.04"): Platform("Ubuntu 24.04", infra=True, tested=False),
    ("ubuntu", "22.04"): Platform("Ubuntu 22.04", infra=False, tested=False,
                                  note="its etcd-server is 3.3, without the /v3 gateway the agents use"),
}


def supported_text(infra: bool) -> str:
    return ", ".join(p.name for p in PLATFORMS.values() if p.infra or not infra)


def platform_problems(host: str, facts: dict[str, Any] | None, infra: bool) -> list[Problem]:
    """Problems with one host's platform (``facts``: node_facts.platform_facts), an infra host's (``infra``)
    stricter than a GPU node's. No facts (an older preflight_facts) is no problem: nothing can be said."""
    if not facts:
        return []
    problems = []
    python = tuple(facts.get("python") or ())
    if python and python < OLDEST_PYTHON:
        problems.append(Problem(
            "ansible_python_interpreter", f"the node's Python is {'.'.join(map(str, python))}; shadowline's modules "
            f"need {'.'.join(map(str, OLDEST_PYTHON))} or newer.",
            "install python3 (3.8+) on the host and point ansible_python_interpreter at it.", host=host))
    key = (str(facts.get("id") or ""), str(facts.get("version_id") or ""))
    platform = PLATFORMS.get(key)
    what = facts.get("pretty_name") or " ".join(key).strip() or "an unknown distribution"
    role = "an infra host (etcd, NATS, the frontend)" if infra else "a GPU node"
    if platform is None:
        problems.append(Problem(
            "(platform)", f"the host runs {what}, which shadowline does not support as {role}; "
            f"supported: {supported_text(infra)}.",
            "use a supported distribution for this host (docs/gpu-cluster.md, Platforms, says what each role of "
            "host needs).", host=host))
    elif infra and not platform.infra:
        problems.append(Problem(
            "gms_infra", f"the host runs {platform.name}, which can carry GPU nodes but not the infra: {platform.note}.",
            f"put the infra on {supported_text(True)} hosts (gms_infra).",
            host=host))
    return problems
