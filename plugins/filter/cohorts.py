# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the cohort plan used by the engine role."""

from __future__ import annotations

from typing import Any, Callable

from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.common.lock import parse_holder
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment import units
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import Plan, restart_order
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.preflight import (
    fleet_refusal as refusal_of_a_fleet,
)

UNIT_DIR = units.UNIT_DIR


def cohort_order(plan: dict[str, Any], lock_content: str | None = None) -> list[int]:
    """Cohort ids in start order given the lock file's content (C(engine-<id>), or empty)."""
    return restart_order(Plan.from_dict(plan).cohort_ids, parse_holder(lock_content or ""))


def engine_files(plan: dict[str, Any], host: str, model_digest: str = "",
                 only: list[int] | None = None) -> dict[str, list[dict[str, str]]]:
    """Every directory and file of the engines on a host, as shadowline.gms.install_files takes them: the mount
    point of the model's view (Plan.model_view), each cohort's home and drop-in directory; the template unit; per
    cohort its command and environment (plan.conf) and, once the readiness gate passed, the digest of the model its
    ranks start on (model.conf). ``only``: those cohorts' files alone (playbooks/upgrade.yml relaunches the writer
    cohort on a new model revision while the others keep the served one's)."""
    plan = Plan.from_dict(plan)
    root = {"owner": "root", "group": "root"}
    user = {"owner": plan.service_user, "group": plan.service_user}
    directories = [{"path": plan.model_view, "mode": "0755", **root}]  # where each unit mounts its revision
    files = [{"path": f"{UNIT_DIR}/{plan.unit_name('engine')}", "content": units.engine_template(plan),
              "mode": "0644", **root}]
    for cohort in _selected(plan, only):
        dropin = units.engine_dropin_dir(plan, cohort)
        directories += [{"path": f"{plan.engines_dir}/{cohort}", "mode": "0750", **user},
                        {"path": dropin, "mode": "0755", **root}]
        files.append({"path": f"{dropin}/plan.conf", "content": units.engine_dropin(plan, host, cohort),
                      "mode": "0644", **root})
        if model_digest:
            files.append({"path": f"{dropin}/model.conf", "content": units.engine_model_dropin(str(model_digest)),
                          "mode": "0644", **root})
    return {"directories": directories, "files": files}


def engine_changed_cohorts(plan: dict[str, Any], changed_paths: list[str] | None,
                           only: list[int] | None = None) -> list[int]:
    """The cohorts whose units changed, from install_files' changed_paths: all of them (or all of ``only``) when
    the template changed, else those with a changed drop-in file."""
    plan = Plan.from_dict(plan)
    changed = set(changed_paths or [])
    cohorts = _selected(plan, only)
    if f"{UNIT_DIR}/{plan.unit_name('engine')}" in changed:
        return cohorts
    return [c for c in cohorts if any(p.startswith(units.engine_dropin_dir(plan, c) + "/") for p in changed)]


def replica_plan(plan: dict[str, Any], replica: int | str) -> dict[str, Any]:
    """One replica's own plan (Plan.for_replica, which refuses a replica the plan lacks, naming those there are):
    its nodes, ranks, lock and leader; what drill.yml, failover.yml and upgrade.yml drive. ``replica`` as the
    playbooks' ``-e replica`` gives it: "" (none given) is replica 0, whose plan a deployment of one replica is."""
    return Plan.from_dict(plan).for_replica(int(replica) if str(replica) != "" else 0).to_dict()


def fleet_refusal(plan: dict[str, Any], playbook: str, replica: object = "") -> str:
    """Why ``playbook`` refuses this deployment (a fleet without ``replica``, for a playbook that acts on one replica
    at a time), "" when not."""
    return refusal_of_a_fleet(Plan.from_dict(plan), playbook, replica)


def _selected(plan: Plan, only: list[int] | None) -> list[int]:
    if only is None:
        return plan.cohort_ids
    wanted = {int(o) for o in only}
    return [c for c in plan.cohort_ids if c in wanted]


def serving_cohort(plan: dict[str, Any], lock_content: str | None = None) -> int:
    """The cohort holding the failover lock (its content ``engine-<id>``), or -1 when the lock is free."""
    engine_id = parse_holder(lock_content or "")
    for cohort in Plan.from_dict(plan).cohorts:
        if engine_id is not None and int(cohort.engine_id) == engine_id:
            return cohort.cohort
    return -1


ENV_MARK = "--environment--"  # playbooks/upgrade.yml prints the rank's GMS_SOCKET_DIR after it


def stale_cohorts(plan: dict[str, Any], host: str, running: list[dict[str, Any]]) -> list[int]:
    """The cohorts whose rank on ``host`` does not run the plan's command: ``running`` is a looped command's
    results over the plan's cohorts, each with the rank's ``/proc/<pid>/cmdline`` as ``stdout_lines`` (the unit's
    main process: in container mode ``podman run ... IMAGE`` followed by the plan's argv, so it ends with both),
    then ENV_MARK and the process's ``GMS_SOCKET_DIR=...``: the model revision's residency, since every revision's
    engines name the same model path (Plan.model_view)."""
    typed = Plan.from_dict(plan)
    stale = []
    for result in running:
        cohort = int(result["item"]["cohort"])
        lines = list(result.get("stdout_lines") or [])
        running_argv, running_env = lines, None
        if ENV_MARK in lines:
            cut = lines.index(ENV_MARK)
            running_argv, running_env = lines[:cut], lines[cut + 1:]
        process = typed.cohort(cohort).rank_on(host).process
        argv = list(process.argv)
        if typed.container:
            argv = [typed.container.image, *argv]
            running_argv = running_argv[-len(argv):]
        residency = f"GMS_SOCKET_DIR={process.env.get('GMS_SOCKET_DIR', '')}"
        if running_argv != argv or (running_env is not None and residency not in running_env):
            stale.append(cohort)
    return stale


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"cohort_order": cohort_order, "engine_files": engine_files,
                "engine_changed_cohorts": engine_changed_cohorts, "serving_cohort": serving_cohort,
                "stale_cohorts": stale_cohorts, "fleet_refusal": fleet_refusal,
                "replica_plan": replica_plan}
