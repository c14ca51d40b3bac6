"""The status table a person reads at a glance: one row per rank of every cohort on every node. A fleet's table
(ranks of more than one replica, docs/fleet-design.md) starts each row with its replica and ends with one line per
replica naming its lock holder; a deployment of one replica's is as it always was."""

from __future__ import annotations

from typing import Any

COLUMNS = ("cohort", "role", "node", "rank", "pid", "state", "lock", "ports (master/system/nixl)", "model")
FLEET_COLUMNS = ("replica", *COLUMNS)
NO_HOLDER = "none (no cohort is serving)"
FAILOVER = "failover:"  # the line after the lock holder: automatic, or paused (control/pause.py)
SPARE = "spare "  # a line per spare node (gms_spares), after the failover line: its GMS server's and agent's units
# the lines after a table's rows (render_status_table): summaries, never a rank's row
SUMMARIES = ("lock holder:", FAILOVER, "replica ", SPARE)
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
            and not line.startswith(SUMMARIES)]


def replicas_of(ranks: list[dict[str, Any]]) -> list[int]:
    """The replicas the ranks are of (cohort_state.rank_states names each; a rank without one is replica 0's)."""
    return sorted({r.get("replica", 0) for r in ranks})


def status_rows(ranks: list[dict[str, Any]], holder: str | None | dict[int, str | None], model: str
                ) -> list[tuple[str, ...]]:
    """``holder``: the lock holder, or a fleet's by replica."""
    holders = holder if isinstance(holder, dict) else {0: holder}
    fleet = len(replicas_of(ranks)) > 1
    rows = []
    for r in sorted(ranks, key=lambda x: (x.get("replica", 0), x["cohort"], x["rank"])):
        replica = r.get("replica", 0)
        holds = r["leader"] and holders.get(replica) == f"engine-{r['cohort']}"
        ports = r["ports"]
        row = (str(r["cohort"]), r["role"], r["host"], str(r["rank"]), str(r["pid"] or "-"), r["state"],
               "holder" if holds else "", f"{ports['master']}/{ports['system']}/{ports['nixl']}", model)
        rows.append((str(replica), *row) if fleet else row)
    return rows


def render_status_table(ranks: list[dict[str, Any]], holder: str | None | dict[int, str | None], model: str,
                        failover: str | None = None, spares: list[dict[str, str]] | None = None) -> str:
    """The table; ``holder``: the lock holder, or a fleet's by replica (a line each); ``failover``: what automatic
    failover is (pause.describe_pause), a line of its own when known; ``spares``: a line each (cohort_info's
    ``spare``: the host and its GMS server's and agent's unit states); none for a deployment without spares."""
    fleet = len(replicas_of(ranks)) > 1
    columns = FLEET_COLUMNS if fleet else COLUMNS
    rows = [columns] + status_rows(ranks, holder, model)
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if fleet:
        holders = holder if isinstance(holder, dict) else {}
        for replica in replicas_of(ranks):
            ranks_of = [r for r in ranks if r.get("replica", 0) == replica]
            healthy = sum(r["state"] in HEALTHY for r in ranks_of)
            lines.append(f"replica {replica}: lock holder {holders.get(replica) or NO_HOLDER}; "
                         f"{healthy} of {len(ranks_of)} ranks healthy")
    else:
        lines.append(f"lock holder: {holder or NO_HOLDER}")
    if failover:
        lines.append(f"{FAILOVER} {failover}")
    lines += [f"{SPARE}{s['host']}: GMS server {s.get('gms_server', 'unknown')}, agent {s.get('agent', 'unknown')}"
              for s in spares or ()]
    return "\n".join(lines)


def table_failover(lines: list[str]) -> str | None:
    """What a printed table says of automatic failover (None: it says nothing)."""
    return next((line[len(FAILOVER):].strip() for line in lines if line.startswith(FAILOVER)), None)


def table_spares(lines: list[str]) -> list[dict[str, str]]:
    """A printed table's spare nodes, read back from its "spare <host>: GMS server <state>, agent <state>" lines
    (render_status_table): [{host, gms_server, agent}]."""
    spares = []
    for line in lines[2:]:
        head, _colon, rest = line.partition(": GMS server ")
        gms, _comma, agent = rest.partition(", agent ")
        if line.startswith(SPARE) and rest and agent:
            spares.append({"host": head[len(SPARE):], "gms_server": gms.strip(), "agent": agent.strip()})
    return spares


# -- the same table as data (shadowline status -o json|yaml) ---------------------------------------------------- #

def status_document(rows: list[tuple[str, ...]], holder: str | None, failover: str | None = None,
                    spares: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """The table's rows and lock holder as data: one record per row, with the table's columns as keys (ports split
    into master/system/nixl, numbers as numbers, the lock column as ``holder``), and ``whole`` as the exit status
    judges it; ``spares`` (table_spares) where the deployment has any."""
    ranks = []
    for row in rows:
        fleet = len(row) == len(FLEET_COLUMNS)
        cell = dict(zip(FLEET_COLUMNS if fleet else COLUMNS, row))
        master, system, nixl = (cell["ports (master/system/nixl)"].split("/") + ["", "", ""])[:3]
        ranks.append({"cohort": _number(cell["cohort"]), "role": cell["role"], "node": cell["node"],
                      "rank": _number(cell["rank"]), "pid": None if cell["pid"] in ("", "-") else _number(cell["pid"]),
                      "state": cell["state"], "holder": cell["lock"] == "holder",
                      "ports": {"master": _number(master), "system": _number(system), "nixl": _number(nixl)},
                      "model": cell["model"], **({"replica": _number(cell["replica"])} if fleet else {})})
    document = {"ranks": ranks, "lock_holder": holder if holder and holder != NO_HOLDER else None,
                "whole": whole([r["state"] for r in ranks])}
    if failover is not None:
        document["failover"] = failover
    if spares:
        document["spares"] = spares
    return document


def table_rows(lines: list[str]) -> tuple[list[tuple[str, ...]], str | None]:
    """A printed table's rows and lock holder, read back by the column spans its dashed line marks (a blank lock
    cell stays blank). ([], None) when the lines are not a status table."""
    header = lines[0].split() if lines else []
    columns = FLEET_COLUMNS if header[:1] == ["replica"] else COLUMNS
    if len(lines) < 2 or header[len(columns) - len(COLUMNS):][:3] != ["cohort", "role", "node"] \
            or set(lines[1]) - {"-", " "}:
        return [], None
    spans, start = [], 0
    for dashes in lines[1].split("  "):
        spans.append((start, start + len(dashes)))
        start += len(dashes) + 2
    if len(spans) != len(columns):
        return [], None
    rows, holder = [], None
    for line in lines[2:]:
        if line.startswith("lock holder:"):
            holder = line.split(":", 1)[1].strip()
            continue
        if line.startswith(SUMMARIES):
            continue
        if line.strip():
            rows.append(tuple(line[a:b].strip() if i < len(spans) - 1 else line[a:].strip()
                              for i, (a, b) in enumerate(spans)))
    return rows, holder


def replica_holders(lines: list[str]) -> dict[int, str | None]:
    """A fleet's table's lock holder per replica, read back from its "replica q: lock holder ...; ..." lines
    (render_status_table); {} for a table of one replica."""
    holders: dict[int, str | None] = {}
    for line in lines[2:]:
        head, _colon, rest = line.partition(": lock holder ")
        if line.startswith("replica ") and rest and head[len("replica "):].isdigit():
            holder = rest.split(";", 1)[0].strip()
            holders[int(head[len("replica "):])] = None if holder == NO_HOLDER else holder
    return holders


def _number(text: str) -> int | str:
    return int(text) if text.isdigit() else text
