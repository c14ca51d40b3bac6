"""The drill report, computed from what a drill recorded: the fault, the agents' events of every node, the
requests of the load, and the state before and after (slots, lock, leaders, engine processes, GMS, agents).

Pure functions of one ``evidence`` dict (JSON-able, see ``compute_report``), so a recorded drill can be
recomputed and the computation is unit-tested on recorded event lists. Every time in the report is in seconds
relative to the fault injection (``t0``; for cut-node, the moment the link really went down).

Definitions (docs/drills.md):

- ``detect_s``: the first ``failure-declared`` event after the fault, on any node (its reason and node too).
- ``teardown_s``: the last of the ``ranks-gone`` events of the failed generation, one per node: every rank of
  it gone on every node (``teardown_per_node`` has each node's).
- ``promote_s``: the driver's ``promoted`` event of a cohort other than the one serving before the fault, whose
  generation was not itself declared failed: the driver has verified it (failover state ``active``, its
  registration in discovery, a completion through the frontend). ``lock_s``: when the driver saw that cohort
  take the failover lock (``lock-acquired``); ``active_s``: when its leader entered ``active``, from its own
  failover metrics.
- ``first_ok_s``: when the first successful request ended that started after the first failed request (after
  the fault); with no failed request, the first successful request started after the fault.
- ``failed_before_promotion`` / ``failed_after_promotion``: failed requests that were in flight at the fault
  or started after it, split by their start against the promotion (all count as "before" when nothing was
  promoted). ``failed_before_fault`` are failures of requests that ended before the fault.
- ``relaunch_s``: the driver's ``relaunch-complete`` of the failed cohort's next generation (the slot refilled
  with a parked shadow).
- ``orphans``: processes of a failed generation (the engine units' processes before the fault, by pid and
  start time) still alive on any node after the agents settled.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields
from typing import Any, Dict

from ..common.frontend import first_attempt_ok
from ..common.lock import parse_holder
from .faults import FAULTS, Fault
from .outage import outage, rel
from .report_checks import check
from .report_text import timeline
from .serving import serving

Evidence = Dict[str, Any]


def _key(event: dict[str, Any]) -> tuple[int, int]:
    return int(event["cohort"]), int(event["generation"])


def fault_time(evidence: Evidence) -> float:
    fault = evidence["fault"]
    cut = fault.get("cut") or {}
    return float(cut.get("down") or fault["injected_at"])


Event = Dict[str, Any]


@dataclass(frozen=True)
class Drill:
    """The evidence of one drill, read once: the fault, its time t0, the events from t0 on and the requests, both
    in time order."""
    fault: dict[str, Any]
    spec: Fault
    t0: float
    nodes: list[str]
    before: dict[str, Any]
    after: dict[str, Any]
    events: list[Event]
    requests: list[dict[str, Any]]

    @classmethod
    def of(cls, evidence: Evidence) -> Drill:
        t0 = fault_time(evidence)
        return cls(fault=evidence["fault"], spec=FAULTS[evidence["fault"]["name"]], t0=t0,
                   nodes=list(evidence.get("nodes") or []),
                   before=evidence.get("before") or {}, after=evidence.get("after") or {},
                   events=sorted((e for e in evidence.get("events") or [] if e.get("time", 0) >= t0 - 1e-6),
                                 key=lambda e: e["time"]),
                   requests=sorted(evidence.get("requests") or [], key=lambda r: r["start"]))

    def rel(self, t: float | None) -> float | None:
        """Seconds from the fault."""
        return rel(t, self.t0)


@dataclass(frozen=True)
class Failures:
    """The failures declared after the fault, the first per (cohort, generation); ``primary``: the one of the
    faulted cohort (else the earliest)."""
    declared: dict[tuple[int, int], Event]
    primary: Event | None


def failures(d: Drill) -> Failures:
    declared: dict[tuple[int, int], Event] = {}
    for e in d.events:
        if e["event"] == "failure-declared" and e.get("cohort") is not None:
            declared.setdefault(_key(e), e)
    primary = None
    if d.fault.get("cohort") is not None:
        primary = next((e for k, e in declared.items() if k[0] == int(d.fault["cohort"])), None)
    if primary is None and declared:
        primary = min(declared.values(), key=lambda e: e["time"])
    return Failures(declared, primary)


@dataclass(frozen=True)
class Detection:
    detect_s: float | None
    detect_reason: str | None
    detected_by: str | None
    culprit: dict[str, Any] | None  # what the declaration names: signal, node, rank (GPU, Xid), evidence
    failed_generations: list[dict[str, Any]]


def culprit_of(event: Event | None) -> dict[str, Any] | None:
    """The culprit a failure declaration names (Declare.evidence): the signal, the node and rank that showed it
    first, the GPU and Xid of a GPU fault, what was seen. None for a declaration that names none."""
    detail = event["detail"] if event else {}
    if "signal" not in detail:
        return None
    return {"signal": detail["signal"], "node": detail.get("culprit_node"), "rank": detail.get("culprit_rank"),
            "gpu": detail.get("gpu"), "xid": detail.get("xid"), "evidence": detail.get("evidence"),
            "still_s": detail.get("still_s")}


def detection(d: Drill, f: Failures) -> Detection:
    primary = f.primary
    return Detection(
        detect_s=d.rel(primary["time"]) if primary else None,
        detect_reason=primary["detail"].get("reason") if primary else None,
        detected_by=primary["node"] if primary else None,
        culprit=culprit_of(primary),
        failed_generations=[{"cohort": c, "generation": g, "reason": e["detail"].get("reason"), "by": e["node"],
                             "at_s": d.rel(e["time"])}
                            for (c, g), e in sorted(f.declared.items(), key=lambda kv: kv[1]["time"])])


@dataclass(frozen=True)
class Teardown:
    """The failed generation's ranks gone on every node."""
    teardown_per_node: dict[str, float | None]
    teardown_s: float | None
    teardown_missing: list[str]
    generation_gone_s: float | None


def teardown(d: Drill, f: Failures) -> Teardown:
    per_node: dict[str, float | None] = {}
    generation_gone = None
    if f.primary:
        key = _key(f.primary)
        for e in d.events:
            if e.get("cohort") is None or e.get("generation") is None or _key(e) != key:
                continue  # (gms-republish and lock-replaced name a cohort and no generation)
            if e["event"] == "ranks-gone":
                per_node.setdefault(e["node"], d.rel(e["time"]))
            elif e["event"] == "generation-gone" and generation_gone is None:
                generation_gone = d.rel(e["time"])
    missing = [n for n in d.nodes if n not in per_node]
    return Teardown(teardown_per_node=per_node,
                    teardown_s=max(per_node.values()) if per_node and not missing else None,  # type: ignore[type-var]
                    teardown_missing=missing if f.primary else [], generation_gone_s=generation_gone)


def promoted_event(d: Drill, f: Failures) -> Event | None:
    """The driver's promotion of another cohort (or a new generation) after the fault."""
    serving = parse_holder(d.before.get("holder") or "")
    serving_generation = ((d.before.get("slots") or {}).get(str(serving)) or {}).get("generation")
    for e in d.events:
        if e["event"] != "promoted" or e.get("cohort") is None:
            continue
        if e["cohort"] == serving and e.get("generation") == serving_generation:
            continue  # the serving cohort seen again (a restarted agent), not a promotion
        if not (e.get("detail") or {}).get("previous") and e["cohort"] == serving:
            continue
        if (e["cohort"], e.get("generation") or 0) in f.declared:
            continue  # a shadow that took the lock but was itself failing (cut-node: every cohort stalls)
        return e
    return None


@dataclass(frozen=True)
class Promotion:
    promote_s: float | None
    promoted_cohort: int | None
    lock_s: float | None  # the driver saw the promoted cohort take the lock
    active_s: float | None  # its leader entered active (its own metrics)


def promotion(d: Drill, promoted: Event | None) -> Promotion:
    if promoted is None:
        return Promotion(None, None, None, None)
    locked = next((e for e in d.events if e["event"] == "lock-acquired"
                   and (e["cohort"], e.get("generation")) == (promoted["cohort"], promoted.get("generation"))
                   and e["time"] <= promoted["time"]), None)
    view = (d.after.get("leaders") or {}).get(str(promoted["cohort"])) or {}
    active = view.get("state") == "active" and view.get("entered") and view["entered"] >= d.t0
    return Promotion(promote_s=d.rel(promoted["time"]), promoted_cohort=promoted["cohort"],
                     lock_s=d.rel(locked["time"]) if locked else None,
                     active_s=d.rel(view["entered"]) if active else None)


@dataclass(frozen=True)
class Requests:
    """The load: failures split by the promotion, and when serving came back."""
    requests: dict[str, Any]
    failed_before_fault: int
    failed_before_promotion: int
    failed_after_promotion: int
    first_failed_s: float | None
    last_failed_s: float | None
    first_ok_s: float | None
    serving_resumed: bool


def request_figures(d: Drill, promoted: Event | None) -> Requests:
    requests = d.requests
    # The window is what the service did: each request's first attempt (a client without retries); the SDK's
    # retries may still have served it, which failed_sdk counts. The same computation as the Slurm drill's.
    seen = outage(requests, d.t0)
    failed = seen.failed
    before, after = seen.split(promoted["time"] if promoted else None)
    failed_raw = sum(1 for r in requests if not first_attempt_ok(r))
    return Requests(
        requests={"sent": len(requests), "ok": len(requests) - failed_raw, "failed": failed_raw,
                  "failed_raw": failed_raw, "failed_sdk": sum(1 for r in requests if not r["ok"]),
                  "client": "openai" if any(r.get("first_ok") is not None for r in requests) else "raw",
                  "streams": sum(1 for r in requests if r.get("stream")),
                  "errors": dict(Counter(_error_class(r) for r in failed))},
        failed_before_fault=sum(1 for r in requests if r["end"] < d.t0 and not first_attempt_ok(r)),
        failed_before_promotion=before,
        failed_after_promotion=after,
        first_failed_s=d.rel(seen.first_failed["start"]) if seen.first_failed else None,
        last_failed_s=d.rel(max(r["end"] for r in failed)) if failed else None,
        first_ok_s=d.rel(seen.first_ok["end"]) if seen.first_ok else None,
        serving_resumed=bool(requests and first_attempt_ok(requests[-1])))


@dataclass(frozen=True)
class Relaunch:
    """The failed cohorts' slots refilled (or given up)."""
    relaunch_per_cohort: dict[str, float | None]
    relaunch_s: float | None
    slots_dead: list[dict[str, Any]]


def relaunch(d: Drill, f: Failures) -> Relaunch:
    per_cohort: dict[str, float | None] = {}
    for (c, g), _e in f.declared.items():
        done = next((e for e in d.events if e["event"] == "relaunch-complete" and e.get("cohort") == c
                     and (e.get("generation") or 0) > g), None)
        if done:
            per_cohort[str(c)] = d.rel(done["time"])
    dead = [{"cohort": e["cohort"], "generation": e["generation"], "at_s": d.rel(e["time"])}
            for e in d.events if e["event"] == "slot-dead"]
    return Relaunch(relaunch_per_cohort=per_cohort,
                    relaunch_s=per_cohort.get(str(f.primary["cohort"])) if f.primary else None, slots_dead=dead)


@dataclass(frozen=True)
class Processes:
    """Orphans of the failed generations; processes of the others that did not survive."""
    orphans: list[dict[str, Any]]
    ranks_restarted: list[dict[str, Any]] | None  # None: no survivors recorded


def processes(d: Drill, f: Failures) -> Processes:
    failed_now = {c for (c, _g) in f.declared}
    survivors = d.after.get("survivors") or {}
    snapshot = d.before.get("processes") or {}
    alive = {(h, p["pid"], p["start"]) for h, procs in survivors.items() for p in procs}
    restarted = [{"host": h, "cohort": int(c), "pid": p["pid"], "cmd": p.get("cmd", "")}
                 for h, units in sorted(snapshot.items()) for c, unit in units.items()
                 if int(c) not in failed_now
                 for p in unit.get("processes", []) if (h, p["pid"], p["start"]) not in alive]
    return Processes(orphans=[{"host": h, **p} for h, procs in sorted(survivors.items()) for p in procs
                              if p["cohort"] in failed_now],
                     ranks_restarted=restarted if survivors else None)


@dataclass(frozen=True)
class Services:
    """The agents and GMS servers: which restarted (when), what the agents adopted, whether weights stayed."""
    agents_restarted: dict[str, float | None]
    agent_adopted: dict[str, Any]
    gms_restarted: dict[str, float | None]
    gms_resident: dict[str, bool | None]


def services(d: Drill) -> Services:
    agents_before, agents_after = d.before.get("agents") or {}, d.after.get("agents") or {}
    gms_before, gms_after = d.before.get("gms") or {}, d.after.get("gms") or {}
    return Services(
        agents_restarted={h: d.rel(a.get("started_at")) for h, a in sorted(agents_after.items())
                          if (agents_before.get(h) or {}).get("pid") != a.get("pid")},
        agent_adopted={e["node"]: e["detail"].get("adopted") for e in d.events if e["event"] == "agent-started"},
        gms_restarted={h: d.rel(g.get("started_at")) for h, g in sorted(gms_after.items())
                       if (gms_before.get(h) or {}).get("pid") != g.get("pid")},
        gms_resident={h: g.get("resident") for h, g in sorted(gms_after.items())})


@dataclass(frozen=True)
class EndState:
    leaders_after: dict[str, str | None]
    slots_after: dict[str, str]
    settled: bool
    settle_note: str
    cut: dict[str, float | None] | None  # cut-node: when the link went down and up


def end_state(d: Drill) -> EndState:
    leaders = d.after.get("leaders") or {}
    return EndState(
        leaders_after={c: v.get("state") for c, v in sorted(leaders.items())},
        slots_after={c: f"{s['state']} gen {s['generation']}" for c, s in sorted((d.after.get("slots") or {}).items())},
        settled=bool(d.after.get("settled")), settle_note=d.after.get("settle_note", ""),
        cut={k: d.rel(v) for k, v in (d.fault.get("cut") or {}).items()} or None)


def _entries(section: Any) -> dict[str, Any]:
    """A section's fields as report entries (in field order)."""
    return {f.name: getattr(section, f.name) for f in fields(section)}


def compute_report(evidence: Evidence) -> dict[str, Any]:
    """The drill report (JSON-able) from the evidence of one drill:

    ``fault`` {name, host, cohort, injected_at, action, pids, cut: {down, up}}; ``nodes`` [host...];
    ``cohorts`` (number); ``before`` / ``after`` {holder, slots, leaders, gms: {host: {pid, resident}},
    agents: {host: pid}} plus ``before.processes`` {host: {cohort: {main_pid, processes}}} and
    ``after.survivors`` {host: [{cohort, pid, start, cmd}]}, ``after.settled``, ``after.settle_note``;
    ``events`` (every node's events); ``requests`` [{seq, start, end, status, ok, error, worker}]; ``workers``
    {worker instance id (hex): replica} (drill/serving.py: which replica served each request).
    """
    d = Drill.of(evidence)
    found = failures(d)
    promoted = promoted_event(d, found)
    report: dict[str, Any] = {
        "fault": d.fault["name"], "summary": d.spec.summary,
        "target": {k: d.fault.get(k) for k in ("host", "cohort", "unit", "pids", "action")},
        "injected_at": d.t0, "serving_before": d.before.get("holder"), "serving_after": d.after.get("holder"),
    }
    for section in (detection(d, found), teardown(d, found), promotion(d, promoted), request_figures(d, promoted),
                    serving(d.requests, d.t0, evidence.get("workers") or {}),
                    relaunch(d, found), processes(d, found), services(d), end_state(d)):
        report.update(_entries(section))
    report["timeline"] = timeline(evidence, report, d.events, d.t0)
    report["problems"], report["notes"] = check(evidence, report, d.spec)
    report["passed"] = not report["problems"]
    return report


def _error_class(request: dict[str, Any]) -> str:
    """What a failed request met: its HTTP status, or no answer. For one the SDK retried, its first attempt's
    (the retry may have been served: 200 is not what failed)."""
    status = request.get("first_status")
    if status is None:  # a plain request: its only attempt
        status = request.get("status")
    if status:
        return str(status)
    error = str(request.get("error") or "error")
    return "timeout" if "timeout" in error or "within" in error else "no answer"
