"""What a drill expects of each fault, checked against its computed report (drill/report.py): the problems that
fail the drill and the notes it only reports."""

from __future__ import annotations

from typing import Any, Dict

Evidence = Dict[str, Any]


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
    t0 = report["injected_at"]  # the fault's time (report.fault_time)
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
