"""The tables scripts/bench-failover prints from its trials (make bench-failover): failover latency per size and
fault, cold restart against promotion, hang detection, false positives, teardown against Slurm's own (the anchor),
and the secure default against the plain control plane. Pure: the trials in, text out."""

from __future__ import annotations

import collections
import statistics
from typing import Any

from .figures import percentile


def fmt(value: float | None, never: str = "-") -> str:
    return never if value is None else f"{value:.3f}"


def cell_of(values: list[float]) -> str:
    """Median / p99 of ``values`` (n), or '-' when there are none."""
    return f"{statistics.median(values):.3f} / {percentile(values, 0.99):.3f} s (n={len(values)})" if values else "-"


def cell(trials: list[dict[str, Any]], key: str, bound: float | None = None) -> str:
    values = [t[key] for t in trials if t.get(key) is not None]
    misses = len(trials) - len(values)
    if not trials:
        return "-"
    if not values:
        return f"never (>{bound:g} s)" if bound else "-"
    text = f"{statistics.median(values):.3f} / {percentile(values, 0.99):.3f}"
    return text + (f" ({misses} never)" if misses and bound else f" ({misses} missing)" if misses else "")


def table_lines(results: dict[str, list[dict[str, Any]]], bound: float, stall: float) -> list[str]:
    """Every table of a run, side by side per size (``stall``: the deployment's progress_stall_s), as the lines
    the bench prints."""
    out: list[str] = []
    rows = [["nodes", "fault", "trials", "detect", "teardown", "lock taken", "active (engine)", "first ok",
             "promoted (verified)", "relaunch", "| no agent: teardown", "active (engine)"]]
    sizes = sorted({t["nodes"] for key in ("agent", "slurm") for t in results[key]})  # --trials 0: the anchor alone
    for n in sizes:
        for fault in ("kill-leader", "kill-worker", "hang-leader", "hang-worker", "stall-generation",
                      "hang-worker-idle"):
            agent = [t for t in results["agent"] if t["nodes"] == n and t["fault"] == fault]
            upstream = [t for t in results["upstream"] if t["nodes"] == n and t["fault"] == fault]
            if not agent and not upstream:
                continue
            rows.append([str(n), fault, str(len(agent)), cell(agent, "detect_s"), cell(agent, "teardown_s"),
                         cell(agent, "lock_s"), cell(agent, "active_s"), cell(agent, "first_ok_s"),
                         cell(agent, "promote_s"), cell(agent, "relaunch_s"), "| " + cell(upstream, "teardown_s", bound),
                         cell(upstream, "active_s", bound)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out.append("\nFailover latency, seconds from the fault, median / p99 over the trials; no agent = the upstream recipe")
    for row in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    out.append("\nCold restart (fresh writer cohort, weights from disk) against promotion of a parked shadow:"
               " death to first successful request")
    for n in sizes:
        cold = [t["first_ok_s"] for t in results["cold"] if t["nodes"] == n and t["first_ok_s"] is not None]
        warm = [t["first_ok_s"] for t in results["agent"] if t["nodes"] == n and t["fault"] == "kill-leader"
                and t["first_ok_s"] is not None]
        failed = [f for f in results.get("failed", []) if f["nodes"] == n and f["phase"] == "cold restart"]
        if failed:
            out.append(f"  {n} node(s): the cold restart phase FAILED, no figure: {failed[0]['error'][:200]}")
        elif cold and warm:
            ratio = statistics.median(cold) / statistics.median(warm)
            out.append(f"  {n} node(s): cold restart {statistics.median(cold):.3f} s (n={len(cold)}), promotion "
                       f"{statistics.median(warm):.3f} s (n={len(warm)}): cold / promotion = {ratio:.1f}x")
        else:
            out.append(f"  {n} node(s): cold {cell_of(cold)}, promotion {cell_of(warm)}"
                       + ("" if cold else " (no cold restart in this run: --cold-trials)"))
    out.append(f"\nHang detection (progress_stall_s {stall:g} s; goal: last progress to teardown within it + 0.2 s, "
               "median), median / p99")
    for n in sizes:
        for fault in ("hang-worker", "stall-generation", "hang-worker-idle"):
            trials = [t for t in results["agent"] if t["nodes"] == n and t["fault"] == fault]
            if trials:
                reasons = sorted({t.get("detect_reason") or "none" for t in trials})
                out.append(f"  {n} node(s) {fault}: fault to declaration {cell(trials, 'detect_s')}, to every rank gone "
                           f"{cell(trials, 'teardown_s')}; last token to every rank gone "
                           f"{cell(trials, 'from_last_progress_s')} ({', '.join(reasons)})")
    if results["quiet"]:
        out.append("\nFalse positives: failures declared while nothing failed")
        for t in results["quiet"]:
            out.append(f"  {t['nodes']} node(s) {t['what']} for {t['seconds']:g} s: {t['declared']} declared"
                       + (f" ({', '.join(t['reasons'])})" if t["reasons"] else "")
                       + (f"; {t['long_prompts_ok']} of {t['long_prompts']} long prompts answered" if t["long_prompts"]
                          else ""))
    anchor_lines(results, sizes, out)
    if results["security"]:
        security_lines([t for t in results["security"] if not t["insecure"]],
                       [t for t in results["security"] if t["insecure"]], out)
    return out


def anchor_lines(results: dict[str, list[dict[str, Any]]], sizes: list[int], out: list[str]) -> None:
    """Our teardown as a ratio to Slurm's own, at each size."""
    out.append("\nTeardown against Slurm's own (srun --kill-on-bad-exit=1, one task per host; SIGKILL of the last host's"
               " task to every task gone, each host waiting on its task's pidfd): ours is the serving"
               " cohort's rank on the last host SIGKILLed the same way, to every host's rank process gone, watched the same"
               " way; 'agents saw' is when the last agent confirmed its rank's whole cgroup empty. Slurm's tasks are"
               " `sleep`, and rank-sized: processes with the threads and resident memory of the rank's on its host"
               " (the goal is judged against these: the same processes to end, Slurm's mechanism against ours)")
    for n in sizes:
        for standby in (False, True):
            trials = [t for t in results["teardown"] if t["nodes"] == n and t.get("standby", False) == standby]
            if trials:
                teardown_lines(n, trials, results["slurm"], "a parked shadow's rank" if standby else "", out)


def teardown_lines(n: int, trials: list[dict[str, Any]], anchor: list[dict[str, Any]], what: str,
                   out: list[str]) -> None:
    """One size's line of how the other agents heard of the death, and ours against Slurm's (rank-sized; sleep)."""
    label = f"{n} node(s){f' ({what})' if what else ''}"
    ours = [t["teardown_s"] for t in trials if t["teardown_s"] is not None]
    saw = [t["agents_saw_s"] for t in trials if t.get("agents_saw_s") is not None]
    heard = collections.Counter(how for t in trials for how in t.get("via", {}).values() if how != "pidfd")
    told = [t for trial in trials for t in trial.get("told_per_host", {}).values()]
    after = [trial["per_host"][h] - t for trial in trials for h, t in trial.get("told_per_host", {}).items()
             if h in trial["per_host"]]
    if heard and told and after:
        out.append(f"  {label}: the other hosts' agents heard of the death by "
                   + ", ".join(f"{how} {count}x" for how, count in sorted(heard.items()))
                   + f", {statistics.median(told):.3f} / {percentile(told, 0.99):.3f} s after the kill; their rank's"
                   f" process gone {statistics.median(after):.3f} / {percentile(after, 0.99):.3f} s after that")
    for rank_sized in (True, False):
        slurm = [t["teardown_s"] for t in anchor if t["nodes"] == n and t["teardown_s"] is not None
                 and t.get("rank_sized", False) == rank_sized]
        if not ours or not slurm:
            continue
        med, p99 = statistics.median(ours) / statistics.median(slurm), percentile(ours, 0.99) / percentile(slurm, 0.99)
        out.append(f"  {label}: ours {statistics.median(ours):.3f} / {percentile(ours, 0.99):.3f} s, Slurm "
                   f"({'rank-sized' if rank_sized else 'sleep'}, n={len(slurm)}) {statistics.median(slurm):.3f} / "
                   f"{percentile(slurm, 0.99):.3f} s: ours / Slurm = {med:.2f}x median, {p99:.2f}x p99"
                   + (" (goal: at most 1.5x at p99)" if rank_sized and not what else "")
                   + (f"; agents saw it {statistics.median(saw):.3f} / {percentile(saw, 0.99):.3f} s"
                      if saw and rank_sized else ""))


def security_lines(secure: list[dict[str, Any]], plain: list[dict[str, Any]], out: list[str]) -> None:
    """The secure default (etcd authentication, NATS and the request plane over mutual TLS) against the plain
    control plane (gms_insecure), the same faults taken in turn on two testbeds side by side: median seconds and
    secure / plain."""
    out.append("\nThe secure default against gms_insecure (plain etcd and NATS), two testbeds side by side, trials in turn:"
               " median seconds from the fault, secure / plain (goal: at most 1.10x on teardown and promotion)")
    for n in sorted({t["nodes"] for t in plain}):
        for fault in ("kill-leader", "kill-worker"):
            ours = [t for t in secure if t["nodes"] == n and t["fault"] == fault]
            base = [t for t in plain if t["nodes"] == n and t["fault"] == fault]
            if not ours or not base:
                continue
            parts = []
            for key in ("detect_s", "teardown_s", "promote_s"):
                a = [t[key] for t in ours if t.get(key) is not None]
                b = [t[key] for t in base if t.get(key) is not None]
                if a and b:
                    ma, mb = statistics.median(a), statistics.median(b)
                    parts.append(f"{key[:-len('_s')]} {ma:.3f} vs {mb:.3f} = "
                                 + (f"{ma / mb:.2f}x" if mb > 0 else "-"))
            out.append(f"  {n} node(s) {fault} (n={len(ours)} / {len(base)}): " + "; ".join(parts))
