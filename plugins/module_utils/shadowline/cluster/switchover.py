"""Which cohort of which replica a switchover hands over (``shadowline switchover``), from the status table
read back (cluster/status_table.py): pure decisions, each refusal a ``Refused`` that says why and the fix, before
anything changes."""

from __future__ import annotations

from ..common.lock import parse_holder
from .status_table import COLUMNS, NO_HOLDER


class Refused(Exception):
    """A switchover that must not run: why, and the fix."""


def replica_rows(rows: list[tuple[str, ...]], holder: str | None, holders: dict[int, str | None],
                 replica: int | None) -> tuple[list[tuple[str, ...]], str | None]:
    """The status rows (without the replica column) and the lock holder of the replica a switchover hands over:
    a fleet's table has a row per rank of every replica and a holder per replica (``holders``), and needs
    --replica; a table of one replica is replica 0's."""
    if not holders:
        if replica not in (None, 0):
            raise Refused(f"--replica {replica}: the deployment is one replica (replica 0). Fix: leave --replica out")
        return rows, holder
    there = ", ".join(str(q) for q in sorted(holders))
    if replica is None:
        raise Refused(f"the deployment is a fleet of {len(holders)} replicas ({there}), each "
                      "with its own serving cohort. Fix: --replica N")
    if replica not in holders:
        raise Refused(f"--replica {replica}: the deployment has no replica {replica} "
                      f"(replicas: {there})")
    return [row[1:] for row in rows if row[0] == str(replica)], holders[replica]


def switchover_cohort(rows: list[tuple[str, ...]], holder: str | None, asked: int | None) -> int:
    """The cohort a switchover hands over: the lock holder's, when a shadow of another cohort is parked to take
    over (what failover.yml's planned and handover modes require too). ``asked``: the cohort the person named."""
    serving = parse_holder(holder or "")
    if serving is None:
        held = "nobody holds the failover lock" if holder in (None, "", NO_HOLDER) else f"the lock holder is {holder}"
        raise Refused(f"no cohort serves ({held}): nothing to hand over. Fix: see "
                      "`shadowline status`; `shadowline failover --cohort N` relaunches a cohort")
    if asked is not None and asked != serving:
        raise Refused(f"--cohort {asked} does not serve (engine-{serving} holds the lock): a "
                      f"switchover hands the serving cohort over. Fix: --cohort {serving}, or "
                      f"`shadowline failover --cohort {asked}` to relaunch cohort {asked}")
    cells = [dict(zip(COLUMNS, row)) for row in rows]
    if not any(c["state"] == "parked" and c["cohort"] != str(serving) for c in cells):
        raise Refused(f"cohort {serving} serves and no shadow is parked to take over: serving "
                      "would stop until the relaunch. Fix: wait for a parked shadow (`shadowline status`), or "
                      f"`shadowline failover --cohort {serving} --mode forced`")
    return serving
