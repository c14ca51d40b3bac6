"""A drill report for people: the rows of its timeline (computed with the report, drill/report.py), and the
timeline table and figures that ``playbooks/drill.yml`` and ``shadowline drill-report`` print."""

from __future__ import annotations

from typing import Any, Dict

from .outage import rel

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


def timeline(evidence: Evidence, report: dict[str, Any], events: list[dict[str, Any]], t0: float
             ) -> list[dict[str, Any]]:
    """The rows of the timeline: {t, node, what, kind}; kind is fault, detect, teardown, promote, relaunch,
    request or info (the SVG colours by it)."""
    fault = evidence["fault"]
    rows = [{"t": 0.0, "node": fault.get("host") or "", "what": f"FAULT {fault['name']}: {fault.get('action', '')}",
             "kind": "fault"}]
    cut = fault.get("cut") or {}
    if cut.get("up"):
        rows.append({"t": rel(cut["up"], t0), "node": fault.get("host") or "", "what": "link up again",
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
        rows.append({"t": rel(e["time"], t0), "node": e["node"], "what": what, "kind": kind})
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
        *_serving_lines(report),
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


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _serving_lines(report: dict[str, Any]) -> list[str]:
    """Which replica served the load before the fault and from it on, and the latency the fault added
    (drill/serving.py); nothing for a report computed before these figures existed."""
    served, latency = report.get("served_by"), report.get("latency_s")
    if not served or not latency:
        return []

    def counts(phase: str) -> str:
        return ", ".join(f"{n} by {'replica ' + k if k != 'unknown' else 'an unnamed worker'}"
                         for k, n in served[phase].items()) or "none"
    return [f"served            before the fault {counts('before_fault')}; from the fault on {counts('from_fault')}",
            f"added latency     p50 {_ms(latency['added_p50'])}, p99 {_ms(latency['added_p99'])} "
            f"(baseline before the fault: p50 {_ms(latency['baseline_p50'])}, p99 {_ms(latency['baseline_p99'])},"
            f" {latency['baseline_n']} requests)"]


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
