# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the directories a deployment makes on a host (deployment/directories.py): what the base role
creates and marks, what teardown.yml may remove, and the tmpfiles.d entry that makes the socket directory again
at boot."""

from __future__ import annotations

from typing import Any, Callable

from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment import directories
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import Plan


def deployment_dirs(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return directories.deployment_directories(Plan.from_dict(plan))


def removable_dirs(plan: dict[str, Any], models: bool = False) -> list[dict[str, str]]:
    return directories.removable_directories(Plan.from_dict(plan), bool(models))


def tmpfiles_conf(plan: dict[str, Any], owned: list[str]) -> str:
    return directories.tmpfiles_text(Plan.from_dict(plan), list(owned or []))


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"deployment_dirs": deployment_dirs, "removable_dirs": removable_dirs, "tmpfiles_conf": tmpfiles_conf}
