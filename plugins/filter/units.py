# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that turn the cohort plan (the gms_plan fact) into systemd unit names and texts, and a node's agent
endpoint, an etcd member and the frontend (their URL and a client's TLS files)."""

from __future__ import annotations

from typing import Any, Callable

from ansible.errors import AnsibleFilterError
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.cluster.access import (
    agent_url,
    etcd_tls_files,
    frontend_tls_files,
    host_tls_files,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment import container, firewall, units
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import Plan, gpu_hosts

RENDERERS: dict[str, Callable[..., str]] = {
    "gms": units.gms_unit,
    "etcd": units.etcd_unit,
    "etcd-proxy": units.etcd_proxy_unit,
    "nats": units.nats_unit,
    "agent": units.agent_unit,
    "firewall": firewall.firewall_unit,
    "firewall_rules": firewall.firewall_rules,  # not a unit: the nft script the firewall unit loads
}


def unit_name(plan: dict[str, Any], kind: str, cohort: int | None = None) -> str:
    """The one rule for unit names (shadowline-<deployment>-<kind>.service, engine@<cohort>)."""
    return Plan.from_dict(plan).unit_name(kind, None if cohort is None else int(cohort))


def gms_dir(plan: dict[str, Any]) -> str:
    """The GMS server's socket directory of the plan's residency (its model revision), below gms_socket_dir."""
    return Plan.from_dict(plan).gms_dir


def unit_text(plan: dict[str, Any], kind: str, host: str | None = None, cohort: int | None = None) -> str:
    """The unit file (or, for kind engine with a cohort, that cohort's drop-in) for a host."""
    plan = Plan.from_dict(plan)
    try:
        if kind == "frontend":
            return units.frontend_unit(plan)
        if kind == "engine" and cohort is None:
            return units.engine_template(plan)
        if kind == "engine":
            return units.engine_dropin(plan, str(host), int(cohort))
        return RENDERERS[kind](plan, str(host))
    except KeyError as err:
        raise AnsibleFilterError(f"shadowline.gms.unit_text: no {kind} unit for host {host}: {err}") from err


def agent_endpoint(plan: dict[str, Any], host: str) -> dict[str, Any]:
    """``host``'s agent endpoint: its base URL and the client TLS files of that host ({} when plain)."""
    typed = Plan.from_dict(plan)
    if host not in gpu_hosts(typed):
        raise AnsibleFilterError(f"shadowline.gms.agent_endpoint: {host} is neither a node nor a spare of "
                                 f"{typed.deployment}")
    return {"url": agent_url(typed, host), "tls": host_tls_files(typed)}


def etcd_endpoint(plan: dict[str, Any], host: str) -> dict[str, Any]:
    """The client URL of the etcd member on infra host ``host`` and the TLS files of a client on any host of the
    deployment ({} when etcd's clients are plain)."""
    typed = Plan.from_dict(plan)
    members = dict(zip(typed.infra_hosts, typed.infra.etcd_endpoints.split(",")))
    if host not in members:
        raise AnsibleFilterError(f"shadowline.gms.etcd_endpoint: {host} is no infra host of {typed.deployment} "
                                 f"(etcd members: {', '.join(members)})")
    return {"url": members[host], "tls": etcd_tls_files(typed)}


def frontend_endpoint(plan: dict[str, Any], where: str = "host") -> dict[str, Any]:
    """The frontend's URL and, when it is HTTPS (gms_frontend_tls), a client's TLS files: a host's (``host``: on
    any host of the deployment) or the controller's (``controller``); tls is {} when plain."""
    if where not in ("host", "controller"):
        raise AnsibleFilterError(f"shadowline.gms.frontend_endpoint: where is {where!r}, not host or controller")
    typed = Plan.from_dict(plan)
    return {"url": typed.infra.frontend_url, "tls": frontend_tls_files(typed, on_controller=where == "controller")}


def runtime_check_argv(plan: dict[str, Any], library: str) -> list[str]:
    """The argv of shadowline.deployment.runtime_check in the deployment's runtime (the host's interpreter, or a
    throwaway container of the image with ``library``, the host's site-packages, mounted)."""
    typed = Plan.from_dict(plan)
    return container.runtime_check_argv(typed.container, typed.python, library, typed.backend, typed.gpus_per_node)


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"unit_name": unit_name, "unit_text": unit_text, "gms_dir": gms_dir, "agent_endpoint": agent_endpoint,
                "etcd_endpoint": etcd_endpoint, "frontend_endpoint": frontend_endpoint, "runtime_check_argv": runtime_check_argv}
