"""The status table a person reads at a glance: one row per rank of every cohort on every node."""

from __future__ import annotations

from typing import Any

COLUMNS = ("cohort", "role", "node", "rank", "pid", "state", "lock", "ports (master/system/nixl)", "model")
FAILOVER = "failover:"  # the line after the lock holder: automatic, or paused (control/pause.py)
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
            and not line.startswith(("lock holder:", FAILOVER))]


def status_rows(ranks: list[dict[str, Any]], holder: str | None, model: str) -> list[tuple[str, ...]]:
    rows = []
    for r in sorted(ranks, key=lambda x: (x["cohort"], x["rank"])):
        holds = r["leader"] and holder == f"engine-{r['cohort']}"
        ports = r["ports"]
        rows.append((str(r["cohort"]), r["role"], r["host"], str(r["rank"]), str(r["pid"] or "-"), r["state"],
                     "holder" if holds else "", f"{ports['master']}/{ports['system']}/{ports['nixl']}", model))
    return rows


def render_status_table(ranks: list[dict[str, Any]], holder: str | None, model: str, failover: str | None = None
                        ) -> str:
    """The table; ``failover``: what automatic failover is (pause.describe_pause), a line of its own when known."""
    rows = [COLUMNS] + status_rows(ranks, holder, model)
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"lock holder: {holder or 'none (no cohort is serving)'}")
    if failover:
        lines.append(f"{FAILOVER} {failover}")
    return "\n".join(lines)


def table_failover(lines: list[str]) -> str | None:
    """What a printed table says of automatic failover (None: it says nothing)."""
    return next((line[len(FAILOVER):].strip() for line in lines if line.startswith(FAILOVER)), None)


# -- the same table as data (shadowline status -o json|yaml) ---------------------------------------------------- #

NO_HOLDER = "none (no cohort is serving)"


def status_document(rows: list[tuple[str, ...]], holder: str | None, failover: str | None = None) -> dict[str, Any]:
    """The table's rows and lock holder as data: one record per row, with the table's columns as keys (ports split
    into master/system/nixl, numbers as numbers, the lock column as ``holder``), and ``whole`` as the exit status
    judges it."""
    ranks = []
    for row in rows:
        cell = dict(zip(COLUMNS, row))
        master, system, nixl = (cell["ports (master/system/nixl)"].split("/") + ["", "", ""])[:3]
        ranks.append({"cohort": _number(cell["cohort"]), "role": cell["role"], "node": cell["node"],
                      "rank": _number(cell["rank"]), "pid": None if cell["pid"] in ("", "-") else _number(cell["pid"]),
                      "state": cell["state"], "holder": cell["lock"] == "holder",
                      "ports": {"master": _number(master), "system": _number(system), "nixl": _number(nixl)},
                      "model": cell["model"]})
    document = {"ranks": ranks, "lock_holder": holder if holder and holder != NO_HOLDER else None,
                "whole": whole([r["state"] for r in ranks])}
    if failover is not None:
        document["failover"] = failover
    return document


def table_rows(lines: list[str]) -> tuple[list[tuple[str, ...]], str | None]:
    """A printed table's rows and lock holder, read back by the column spans its dashed line marks (a blank lock
    cell stays blank). ([], None) when the lines are not a status table."""
    if len(lines) < 2 or lines[0].split()[:3] != ["cohort", "role", "node"] or set(lines[1]) - {"-", " "}:
        return [], None
    spans, start = [], 0
    for dashes in lines[1].split("  "):
        spans.append((start, start + len(dashes)))
        start += len(dashes) + 2
    if len(spans) != len(COLUMNS):
        return [], None
    rows, holder = [], None
    for line in lines[2:]:
        if line.startswith("lock holder:"):
            holder = line.split(":", 1)[1].strip()
            continue
        if line.startswith(FAILOVER):
            continue
        if line.strip():
            rows.append(tuple(line[a:b].strip() if i < len(spans) - 1 else line[a:].strip()
                              for i, (a, b) in enumerate(spans)))
    return rows, holder


def _number(text: str) -> int | str:
    return int(text) if text.isdigit() else text
