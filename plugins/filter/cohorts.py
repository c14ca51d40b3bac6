# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the cohort plan used by the engine role."""

from __future__ import annotations

from typing import Any, Callable

from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.lock import parse_holder
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.plan import restart_order


def cohort_order(plan: dict[str, Any], lock_content: str | None = None) -> list[int]:
    """Cohort ids in start order given the lock file's content (C(engine-<id>), or empty)."""
    return restart_order([c["cohort"] for c in plan["cohorts"]], parse_holder(lock_content or ""))


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"cohort_order": cohort_order}
