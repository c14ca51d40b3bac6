# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the units of a deployment found on a host (ansible.builtin.find), named by the plan's one unit-name
rule: the engine cohorts the plan no longer has (engine role) and every unit in stop order (teardown.yml)."""

from __future__ import annotations

import os
from typing import Any, Callable

from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import (
    Plan,
    residency_dir,
    unit_name,
)

DROPIN_SUFFIX = ".d"


def _unit_of(path: str) -> str:
    """The unit a path under /etc/systemd/system belongs to (a drop-in directory names its unit)."""
    name = os.path.basename(str(path).rstrip("/"))
    return name[: -len(DROPIN_SUFFIX)] if name.endswith(".service" + DROPIN_SUFFIX) else name


def _engine_cohort(plan: Plan, unit: str) -> int | None:
    """The cohort whose engine unit this is (by the plan's unit-name rule), or None."""
    _unused, at, instance = unit.partition("@")
    cohort = instance[:-len(".service")] if instance.endswith(".service") else instance
    if not at or not cohort.isdigit() or plan.unit_name("engine", int(cohort)) != unit:
        return None
    return int(cohort)


def engine_units_unplanned(plan: dict[str, Any], dropin_dirs: list[str]) -> list[dict[str, Any]]:
    """The engine cohorts installed here (their drop-in directories) that the plan no longer has:
    ``[{cohort, unit, dropin}]``, by cohort."""
    typed = Plan.from_dict(plan)
    found = []
    for path in dropin_dirs or []:
        unit = _unit_of(path)
        cohort = _engine_cohort(typed, unit)
        if str(path).endswith(DROPIN_SUFFIX) and cohort is not None and not typed.has_cohort(cohort):
            found.append({"cohort": cohort, "unit": unit, "dropin": str(path)})
    return sorted(found, key=lambda item: item["cohort"])


def units_stop_order(plan: dict[str, Any], paths: list[str]) -> list[list[str]]:
    """The units of the deployment behind the paths found (unit files and drop-in directories) in the order to
    stop them: the engine cohorts first, then everything else (never the engine template, which runs nothing);
    empty groups left out."""
    typed = Plan.from_dict(plan)
    units = list(dict.fromkeys(_unit_of(p) for p in paths or []))
    units = [u for u in units if u != typed.unit_name("engine")]
    engines = [u for u in units if _engine_cohort(typed, u) is not None]
    others = [u for u in units if u not in engines]
    return [group for group in (engines, others) if group]


def gms_units_unplanned(plan: dict[str, Any], paths: list[str]) -> list[dict[str, Any]]:
    """The GMS server units installed here (unit files found) of another residency than the plan's: a model
    revision no cohort runs any more, and the unit of a deployment from before residencies
    (``shadowline-<deployment>-gms.service``). ``[{unit, path, socket_dir}]``: the unit, its file, and its
    residency's socket directory (None for the older unit, whose sockets its server removes when it stops)."""
    typed = Plan.from_dict(plan)
    prefix = unit_name(typed.deployment, "gms")[: -len(".service")]  # shadowline-<deployment>-gms@
    legacy = prefix.rstrip("@") + ".service"
    found = []
    for path in paths or []:
        unit = os.path.basename(str(path))
        if unit == legacy:
            found.append({"unit": unit, "path": str(path), "socket_dir": None})
        elif unit.startswith(prefix) and unit.endswith(".service") and unit != typed.unit_name("gms"):
            residency = unit[len(prefix): -len(".service")]
            if residency:  # never the template name
                found.append({"unit": unit, "path": str(path), "socket_dir": residency_dir(typed.socket_dir, residency)})
    return sorted(found, key=lambda item: item["unit"])


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"engine_units_unplanned": engine_units_unplanned, "units_stop_order": units_stop_order,
                "gms_units_unplanned": gms_units_unplanned}
