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

Evidence = Dict[str, Any]

# Events shown in the timeline, and how (None: not shown).
TIMELINE_EVENTS = {
    "rank-exited": "rank exited (pid {pid})",
    "failure-declared": "failure declared: {reason}",
    "declare-failed-error": "could not declare {reason}: etcd unreachable",
    "fenced": "fenced itself (cut off for {isolated_s} s)",
    "ranks-gone": "its ranks here are gone",
    "ranks-not-gone": "RANKS NOT GONE after {seconds} s",
    "registration-revoked": "discovery lease revoked",
    "lock-free": "lock free",
    "generation-gone": "generation gone on every node",
    "relaunch-scheduled": "relaunch scheduled (delay {delay_s} s, attempt {attempts})",
    "rank-launched": "rank launched (pid {pid})",
    "launch-failed": "LAUNCH FAILED",
    "lock-acquired": "lock acquired, waking",
    "lock-taken-by-failing": "lock taken by a failing generation ({slot})",
    "registered": "registered in discovery",
    "promoted": "promoted: cohort {cohort} active, registered, serving through the frontend",
    "promotion-unverified": "PROMOTION UNVERIFIED: no {missing}",
    "promotion-abandoned": "promotion abandoned (lock now {holder})",
    "launch-abandoned": "launch abandoned (slot at generation {slot_generation})",
    "relaunch-complete": "relaunch complete: new shadow parked",
    "slot-dead": "SLOT DEAD: crash loop, relaunches stopped",
    "agent-started": "agent started, adopted {adopted}",
    "agent-stopped": "agent stopped",
    "gms-lost": "GMS server lost",
    "gms-republish": "writer relaunch to republish weights",
    "gms-degraded": "GMS degraded: no shadow can take over to republish",
    "etcd-unreachable": "etcd unreachable",
    "etcd-reachable": "etcd reachable again (after {after_s} s)",
}


def _rel(t: float | None, t0: float) -> float | None:
    return None if t is None else round(t - t0, 3)


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
        return _rel(t, self.t0)


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
    promo_at = promoted["time"] if promoted else None
    requests = d.requests
    # The window is what the service did: each request's first attempt (a client without retries); the SDK's
    # retries may still have served it, which failed_sdk counts.
    served = {id(r): first_attempt_ok(r) for r in requests}
    failed = [r for r in requests if r["end"] >= d.t0 and not served[id(r)]]  # in flight at the fault, or after
    first_failed = min(failed, key=lambda r: r["start"]) if failed else None
    after_from = first_failed["start"] if first_failed else d.t0
    first_ok = min((r for r in requests if served[id(r)] and r["start"] >= after_from), key=lambda r: r["end"],
                   default=None)
    failed_raw = sum(1 for r in requests if not served[id(r)])
    return Requests(
        requests={"sent": len(requests), "ok": len(requests) - failed_raw, "failed": failed_raw,
                  "failed_raw": failed_raw, "failed_sdk": sum(1 for r in requests if not r["ok"]),
                  "client": "openai" if any(r.get("first_ok") is not None for r in requests) else "raw",
                  "streams": sum(1 for r in requests if r.get("stream")),
                  "errors": dict(Counter(_error_class(r) for r in failed))},
        failed_before_fault=sum(1 for r in requests if r["end"] < d.t0 and not served[id(r)]),
        failed_before_promotion=sum(1 for r in failed if promo_at is None or r["start"] < promo_at),
        failed_after_promotion=sum(1 for r in failed if promo_at is not None and r["start"] >= promo_at),
        first_failed_s=d.rel(first_failed["start"]) if first_failed else None,
        last_failed_s=d.rel(max(r["end"] for r in failed)) if failed else None,
        first_ok_s=d.rel(first_ok["end"]) if first_ok else None,
        serving_resumed=bool(requests and served[id(requests[-1])]))


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
    ``events`` (every node's events); ``requests`` [{seq, start, end, status, ok, error}].
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


def check(evidence: Evidence, report: dict[str, Any], spec: Any) -> tuple[list[str], list[str]]:  # noqa: C901, PLR0912, PLR0915 (over the size limits of pyproject.toml; split it when it changes next)
    """What the drill expects of this fault (problems fail the drill) and what it only reports (notes)."""
    problems: list[str] = []
    notes: list[str] = []
    name = spec.name
    before, after = evidence.get("before") or {}, evidence.get("after") or {}
    cohorts = int(evidence.get("cohorts") or len(before.get("slots") or {}) or 1)
    if not report["settled"]:
        problems.append(f"the agents did not settle: {report['settle_note']}")
    if report["orphans"]:
        problems.append(f"{len(report['orphans'])} process(es) of the failed generation still alive: "
                        + ", ".join(f"{o['host']} pid {o['pid']}" for o in report["orphans"][:5]))
    if report["failed_before_fault"]:
        notes.append(f"{report['failed_before_fault']} request(s) failed before the fault")
    if after.get("holder") is None:
        problems.append("no cohort holds the failover lock at the end")
    active = [c for c, s in report["leaders_after"].items() if s == "active"]
    if len(active) != 1:
        problems.append(f"{len(active)} cohort leaders are active at the end (exactly one must serve): {active}")
    elif after.get("holder") and after["holder"] != f"engine-{active[0]}":
        problems.append(f"the lock holder {after['holder']} is not the active cohort {active[0]}")
    parked = [c for c, s in report["leaders_after"].items() if s == "standby"]
    if cohorts > 1 and not parked and not report["slots_dead"]:
        problems.append("no shadow is parked at the end")
    if spec.fences:
        problems += fenced_problems(evidence, report)
    elif not report["serving_resumed"]:
        problems.append("serving did not resume: the last request of the load failed")
    if report["slots_dead"]:
        problems.append("slot(s) marked dead: " + ", ".join(f"cohort {d['cohort']}" for d in report["slots_dead"]))
    if spec.expect_failure:
        if report["detect_s"] is None:
            problems.append("no failure was declared")
        elif report["detect_reason"] not in spec.expect_reason:
            problems.append(f"declared as {report['detect_reason']}, expected {' or '.join(spec.expect_reason)}")
        if report["detect_s"] is not None and report["teardown_s"] is None:
            problems.append("the failed generation is not reported gone on "
                            + (", ".join(report["teardown_missing"]) or "every node"))
    dead = {d["cohort"] for d in report["slots_dead"]}
    unfilled = sorted({g["cohort"] for g in report["failed_generations"]} - {int(c) for c in report["relaunch_per_cohort"]}
                      - dead)
    if unfilled:
        problems.append("the slot of cohort(s) " + ", ".join(map(str, unfilled)) + " was not refilled "
                        "(no relaunch-complete after the failure)")
    if spec.expect_promotion and report["promoted_cohort"] is None:
        problems.append("no other cohort was promoted")
    if spec.zero_failed and report["failed_before_promotion"] + report["failed_after_promotion"]:
        problems.append(f"{report['failed_before_promotion'] + report['failed_after_promotion']} request(s) "
                        "failed: this fault must not interrupt serving")
    if name == "kill-standby" and before.get("holder") != after.get("holder"):
        problems.append(f"the serving cohort changed ({before.get('holder')} -> {after.get('holder')})")
    if name == "kill-agent":
        host = evidence["fault"].get("host")
        if host not in report["agents_restarted"]:
            problems.append(f"the agent on {host} was not restarted")
        elif host not in report["agent_adopted"]:
            problems.append(f"the restarted agent on {host} wrote no agent-started event")
        else:
            adopted = {str(c): int(p) for c, p in (report["agent_adopted"][host] or {}).items()}
            running = {str(c): int(u.get("main_pid") or 0)
                       for c, u in ((before.get("processes") or {}).get(host) or {}).items() if u.get("main_pid")}
            if adopted != running:
                problems.append(f"the restarted agent on {host} adopted {adopted}, but the ranks running were {running}")
        if report["ranks_restarted"]:
            problems.append(f"{len(report['ranks_restarted'])} engine process(es) were restarted; the new agent "
                            "must adopt the running ranks")
        if report["failed_generations"]:
            problems.append("a generation was declared failed although every rank ran")
    if name == "kill-gms":
        host = evidence["fault"].get("host")
        if host not in report["gms_restarted"]:
            problems.append(f"the GMS server on {host} was not restarted")
        if report["gms_resident"].get(host) is False:
            problems.append(f"the weights are not resident again in {host}'s GMS server: a shadow relaunched there "
                            "cannot import them (no writer republished)")
        writer_served = before.get("holder") == "engine-0"
        failed = report["failed_before_promotion"] + report["failed_after_promotion"]
        if failed and not writer_served:
            problems.append(f"{failed} request(s) failed although the writer cohort was parked")
        elif failed:
            notes.append(f"{failed} request(s) failed during the agent's planned failover away from the writer "
                         "cohort 0 (it relaunches to republish the weights)")
        if report["failed_generations"]:
            notes.append("the agent relaunched the writer cohort to republish the weights: "
                         + ", ".join(f"cohort {g['cohort']} gen {g['generation']} ({g['reason']})"
                                     for g in report["failed_generations"]))
        else:
            notes.append("the agent did not relaunch anything")
    if name == "cut-node":
        gens = report["failed_generations"]
        notes.append(f"{len(gens)} generation(s) declared failed: "
                     + (", ".join(f"cohort {g['cohort']} ({g['reason']} by {g['by']})" for g in gens) or "none"))
        failed = report["failed_before_promotion"] + report["failed_after_promotion"]
        notes.append(f"{failed} request(s) failed; serving {'resumed' if report['serving_resumed'] else 'DID NOT resume'}"
                     + (f" at +{report['first_ok_s']} s" if report["first_ok_s"] is not None and failed else ""))
    return problems, notes


def fenced_problems(evidence: Evidence, report: dict[str, Any]) -> list[str]:
    """A GPU out of service: its node's agent fenced it, every cohort was declared failed and held (nothing can
    serve without that node), the driver said loudly that serving needs other hardware, and after the drill's
    unfence (its restore) every slot was relaunched and the deployment served again."""
    host = evidence["fault"].get("host")
    events = evidence.get("events") or []
    t0 = fault_time(evidence)
    seen = {(e["event"], e.get("node")) for e in events if e["time"] >= t0}
    problems = []
    if ("node-fenced", host) not in seen:
        problems.append(f"{host} was not fenced (no node-fenced event)")
    if not any(name == "serving-needs-hardware" for name, _node in seen):
        problems.append("the driver did not say that serving needs other hardware (serving-needs-hardware)")
    cohorts = int(evidence.get("cohorts") or 1)
    declared = {g["cohort"] for g in report["failed_generations"]}
    if len(declared) < cohorts:
        problems.append(f"only cohort(s) {sorted(declared)} were declared failed; a GPU out of service on {host} "
                        f"takes all {cohorts}")
    unfenced = min((e["time"] for e in events if e["event"] == "unfenced" and e["time"] >= t0), default=float("inf"))
    early = [e for e in events if e["event"] == "promoted" and t0 <= e["time"] < unfenced]
    if early:
        problems.append(f"cohort {early[0].get('cohort')} was promoted while {host} was fenced")
    if not (evidence.get("restored") or {}).get("steady_after_unfence"):
        problems.append("the deployment did not serve again after the drill unfenced the node")
    return problems


def timeline(evidence: Evidence, report: dict[str, Any], events: list[dict[str, Any]], t0: float
             ) -> list[dict[str, Any]]:
    """The rows of the timeline: {t, node, what, kind}; kind is fault, detect, teardown, promote, relaunch,
    request or info (the SVG colours by it)."""
    fault = evidence["fault"]
    rows = [{"t": 0.0, "node": fault.get("host") or "", "what": f"FAULT {fault['name']}: {fault.get('action', '')}",
             "kind": "fault"}]
    cut = fault.get("cut") or {}
    if cut.get("up"):
        rows.append({"t": _rel(cut["up"], t0), "node": fault.get("host") or "", "what": "link up again",
                     "kind": "fault"})
    for host, t in report["agents_restarted"].items():
        if t is not None:
            rows.append({"t": t, "node": host, "what": "agent process started again (systemd)", "kind": "info"})
    for host, t in report["gms_restarted"].items():
        if t is not None:
            rows.append({"t": t, "node": host, "what": "GMS server started again (systemd)", "kind": "info"})
    kinds = {"rank-exited": "detect", "failure-declared": "detect", "fenced": "teardown",
             "ranks-gone": "teardown", "ranks-not-gone": "problem", "generation-gone": "teardown",
             "promoted": "promote", "lock-acquired": "promote", "promotion-unverified": "problem",
             "relaunch-complete": "relaunch", "rank-launched": "relaunch",
             "relaunch-scheduled": "relaunch", "slot-dead": "problem", "launch-failed": "problem"}
    for e in events:
        text = TIMELINE_EVENTS.get(e["event"])
        if text is None:
            continue
        detail = dict(e.get("detail") or {})
        detail.setdefault("cohort", e.get("cohort"))
        try:
            what = text.format(**detail)
        except (KeyError, IndexError, ValueError):
            what = e["event"]
        if e["event"] == "promoted" and not detail.get("previous"):
            what = f"cohort {e['cohort']} serving (verified by the driver at its start)"
            kind = "info"
        else:
            kind = kinds.get(e["event"], "info")
        if e.get("cohort") is not None and e["event"] != "promoted":
            what = f"cohort {e['cohort']} gen {e['generation']}: {what}"
        rows.append({"t": _rel(e["time"], t0), "node": e["node"], "what": what, "kind": kind})
    if report["first_failed_s"] is not None:
        rows.append({"t": report["first_failed_s"], "node": "client", "what": "first failed request sent",
                     "kind": "request"})
    if report["last_failed_s"] is not None:
        rows.append({"t": report["last_failed_s"], "node": "client", "what": "last failed request answered",
                     "kind": "request"})
    if report["first_ok_s"] is not None:
        rows.append({"t": report["first_ok_s"], "node": "client", "what": "first successful request after the fault",
                     "kind": "request"})
    if report.get("active_s") is not None:
        rows.append({"t": report["active_s"], "node": "engine",
                     "what": f"cohort {report['promoted_cohort']} leader active (its failover metrics)",
                     "kind": "promote"})
    return sorted(rows, key=lambda r: r["t"])


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _culprit_text(culprit: dict[str, Any]) -> str:
    where = f"{culprit['node']} rank {culprit['rank']}" if culprit.get("node") else "?"
    gpu = f", GPU {culprit['gpu']} Xid {culprit['xid']}" if culprit.get("gpu") else ""
    return f"{culprit['signal']} on {where}{gpu}: {culprit.get('evidence') or ''}"


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The figures, one line each, for people."""
    teardown = ", ".join(f"{h} {t:.3f}" for h, t in sorted(report["teardown_per_node"].items()))
    req = report["requests"]
    errors = ", ".join(f"{n}x {k}" for k, n in sorted(report["requests"]["errors"].items()))
    lines = [
        f"detect            {_fmt(report['detect_s'])}"
        + (f"  ({report['detect_reason']}, by {report['detected_by']})" if report["detect_reason"] else ""),
        *([f"culprit           {_culprit_text(report['culprit'])}"] if report.get("culprit") else []),
        f"all ranks gone    {_fmt(report['teardown_s'])}" + (f"  ({teardown})" if teardown else ""),
        f"lock taken        {_fmt(report.get('lock_s'))}",
        f"promotion         {_fmt(report['promote_s'])}"
        + (f"  (cohort {report['promoted_cohort']}"
           + (f", active at {report['active_s']:.3f} s" if report["active_s"] is not None else "")
           + "; verified: registered, served a completion)" if report["promoted_cohort"] is not None else ""),
        f"first ok request  {_fmt(report['first_ok_s'])}",
        f"failed requests   {report['failed_before_promotion']} before promotion, "
        f"{report['failed_after_promotion']} after" + (f"  ({errors})" if errors else "")
        + f"; {req['sent']} sent, {req['ok']} ok"
        + (f"; through the OpenAI SDK: {req['failed_sdk']} failed after its retries" if req.get("client") == "openai"
           else ""),
        f"relaunch complete {_fmt(report['relaunch_s'])}",
        f"orphans           {len(report['orphans'])}",
    ]
    if report["fault"] == "kill-agent":
        restarted = ", ".join(f"{h} at {_fmt(t)}" for h, t in report["agents_restarted"].items()) or "none"
        adopted = "; ".join(f"{h}: {len(a or {})} rank(s)" for h, a in report["agent_adopted"].items()) or "-"
        lines.append(f"agent restarted   {restarted}; adopted {adopted}; "
                     f"engine processes restarted: {len(report['ranks_restarted'] or [])}")
    if report["fault"] == "kill-gms":
        restarted = ", ".join(f"{h} at {_fmt(t)}" for h, t in report["gms_restarted"].items()) or "none"
        resident = ", ".join(f"{h} {'yes' if r else 'NO' if r is False else '?'}"
                             for h, r in report["gms_resident"].items())
        lines.append(f"GMS restarted     {restarted}; weights resident: {resident}")
    if report.get("cut"):
        lines.append(f"link down         {_fmt(report['cut'].get('down'))} .. up {_fmt(report['cut'].get('up'))}")
    return lines


def _compress_launches(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per generation for its ranks launched on every node (the per-node rows stay in the timeline)."""
    launches: dict[str, list[dict[str, Any]]] = {}
    out = []
    for row in rows:
        if "rank launched" in row["what"] and ": " in row["what"]:
            launches.setdefault(row["what"].split(": ", 1)[0], []).append(row)
        else:
            out.append(row)
    for prefix, group in launches.items():
        first, last = group[0]["t"], group[-1]["t"]
        span = f"+{first:.3f}" if len(group) == 1 else f"+{first:.3f} .. +{last:.3f}"
        out.append({"t": last, "node": group[0]["node"] if len(group) == 1 else "all",
                    "what": f"{prefix}: ranks launched on {len(group)} node(s) ({span})", "kind": "relaunch"})
    return sorted(out, key=lambda r: r["t"])


def render_timeline_table(report: dict[str, Any], max_rows: int = 40) -> list[str]:
    """The timeline table and the figures: what ``drill.yml`` prints."""
    target = report["target"]
    where = target.get("host") or "?"
    if target.get("cohort") is not None:
        where += f", cohort {target['cohort']}"
    lines = [f"drill {report['fault']} on {where}: serving {report['serving_before']} -> {report['serving_after']}",
             "      t  node    what"]
    rows = _compress_launches(report["timeline"])
    if len(rows) > max_rows:
        keep = [r for r in rows if r["kind"] in ("fault", "detect", "promote", "problem", "request")]
        rest = [r for r in rows if r not in keep][: max(0, max_rows - len(keep))]
        rows = sorted(keep + rest, key=lambda r: r["t"])
    for row in rows:
        lines.append(f"{row['t']:+7.3f}  {row['node'][:6]:<6}  {row['what']}")
    lines.append("")
    lines += summary_lines(report)
    for note in report["notes"]:
        lines.append(f"note: {note}")
    for problem in report["problems"]:
        lines.append(f"PROBLEM: {problem}")
    lines.append("result: " + ("PASS" if report["passed"] else f"FAIL ({len(report['problems'])} problem(s))"))
    return lines
