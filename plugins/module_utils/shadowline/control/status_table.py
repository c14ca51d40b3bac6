"""The status table a person reads at a glance: one row per rank of every cohort on every node."""

from __future__ import annotations

from typing import Any

COLUMNS = ("cohort", "role", "node", "rank", "pid", "state", "lock", "ports (master/system/nixl)", "model")
HEALTHY = frozenset({"active", "parked", "running"})  # a rank's states of a whole deployment (headless: running)


def whole(states: list[str]) -> bool:
    """Is a deployment whose ranks show ``states`` whole (every rank serving, parked or running, and some rank
    at all)? The exit status of ``shadowline status``: anything dead, wedged, starting or waking is not."""
    return bool(states) and all(state in HEALTHY for state in states)


def table_states(lines: list[str]) -> list[str]:
    """The state column of a printed status table's rows (its header names the columns)."""
    if not lines or "state" not in lines[0].split():
        return []
    column = lines[0].split().index("state")
    return [line.split()[column] for line in lines[2:] if len(line.split()) > column
            and not line.startswith("lock holder:")]


def status_rows(ranks: list[dict[str, Any]], holder: str | None, model: str) -> list[tuple[str, ...]]:
    rows = []
    for r in sorted(ranks, key=lambda x: (x["cohort"], x["rank"])):
        holds = r["leader"] and holder == f"engine-{r['cohort']}"
        ports = r["ports"]
        rows.append((str(r["cohort"]), r["role"], r["host"], str(r["rank"]), str(r["pid"] or "-"), r["state"],
                     "holder" if holds else "", f"{ports['master']}/{ports['system']}/{ports['nixl']}", model))
    return rows


def render_status_table(ranks: list[dict[str, Any]], holder: str | None, model: str) -> str:
    rows = [COLUMNS] + status_rows(ranks, holder, model)
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"lock holder: {holder or 'none (no cohort is serving)'}")
    return "\n".join(lines)
