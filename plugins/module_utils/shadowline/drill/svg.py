"""The drill timeline as a hand-written SVG picture (no plotting dependency).

One lane for the requests (each a bar from its start to its end: green served, red failed), one lane per
node with its agent's events as markers (hover for the text), and dashed lines across all lanes at the
milestones: fault, detection, all ranks gone, promotion, first successful request, relaunch complete.
"""

from __future__ import annotations

import math
from typing import Any
from xml.sax.saxutils import escape

from ..common.frontend import first_attempt_ok

COLOURS = {"fault": "#d62728", "detect": "#ff7f0e", "teardown": "#9467bd", "promote": "#1f77b4",
           "relaunch": "#17becf", "request": "#2ca02c", "problem": "#000000", "info": "#7f7f7f"}
OK, FAILED = "#2ca02c", "#d62728"
WIDTH, LEFT, RIGHT = 1000, 90, 20
LANE, REQUEST_LANE = 34, 64


def _ticks(lo: float, hi: float) -> list[float]:
    span = max(hi - lo, 1e-3)
    raw = span / 10
    step = min((s for s in (0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60) if s >= raw), default=60)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 3) for i in range(int((hi - first) / step) + 1)]


def _place_labels(milestones: list[tuple[str, float, str]], x: Any) -> list[tuple[str, float, str, float, int]]:
    """(kind, t, text, text x, row): each label in the first row where it does not overlap the one before."""
    row_ends: list[float] = []
    placed = []
    for kind, t, label in sorted(milestones, key=lambda m: m[1]):
        text = f"{label} {t:+.2f} s"
        width = 6.2 * len(text)
        start = min(x(t) + 2, WIDTH - RIGHT - width)
        row = next((i for i, end in enumerate(row_ends) if start > end + 6), None)
        if row is None:
            row_ends.append(0.0)
            row = len(row_ends) - 1
        row_ends[row] = start + width
        placed.append((kind, t, text, start, row))
    return placed


def render_svg(report: dict[str, Any], requests: list[dict[str, Any]], nodes: list[str]) -> str:
    """The SVG document (text) for a report (``compute_report``) and the load's requests."""
    t0 = report["injected_at"]
    rows = report["timeline"]
    rel_requests = [(r["start"] - t0, r["end"] - t0, first_attempt_ok(r)) for r in requests]
    lo = min([-0.5] + [s for s, _e, _ok in rel_requests] + [r["t"] for r in rows])
    hi = max([1.0] + [e for _s, e, _ok in rel_requests] + [r["t"] for r in rows]) + 0.2
    lanes = list(nodes) + sorted({r["node"] for r in rows if r["node"] not in nodes and r["node"] not in
                                  ("client", "engine", "")})
    plot_w = WIDTH - LEFT - RIGHT

    def x(t: float) -> float:
        return LEFT + (t - lo) / (hi - lo) * plot_w

    milestones = [(kind, t, label) for kind, t, label in (
        ("fault", 0.0, "fault"), ("detect", report["detect_s"], "detect"),
        ("teardown", report["teardown_s"], "all ranks gone"), ("promote", report.get("lock_s"), "lock taken"),
        ("promote", report["promote_s"], "promoted"),
        ("request", report["first_ok_s"], "first ok"), ("relaunch", report["relaunch_s"], "relaunched"))
        if t is not None]
    placed = _place_labels(milestones, x)
    top = 44 + 13 * (max((p[4] for p in placed), default=0) + 1)
    lane_bottom = top + REQUEST_LANE + LANE * len(lanes)
    height = lane_bottom + 60

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>']
    title = (f"drill {report['fault']} on {report['target'].get('host')}: "
             f"serving {report['serving_before']} \u2192 {report['serving_after']}; "
             f"{report['requests']['failed']} of {report['requests']['sent']} requests failed; "
             + ("PASS" if report["passed"] else "FAIL"))
    out.append(f'<text x="{LEFT}" y="18" font-size="14" font-weight="bold">{escape(title)}</text>')
    for kind, t, text, start, row in placed:
        out.append(f'<line x1="{x(t):.1f}" y1="{30 + row * 13}" x2="{x(t):.1f}" y2="{lane_bottom}" '
                   f'stroke="{COLOURS[kind]}" stroke-dasharray="4,3" stroke-width="1.2"/>')
        out.append(f'<text x="{start:.1f}" y="{38 + row * 13}" fill="{COLOURS[kind]}">{escape(text)}</text>')

    # Requests.
    out.append(f'<text x="8" y="{top + REQUEST_LANE / 2 + 4}" font-weight="bold">requests</text>')
    out.append(f'<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{REQUEST_LANE - 6}" fill="#f7f7f7"/>')
    for i, (start, end, ok) in enumerate(rel_requests):
        width = max(1.5, x(end) - x(start))
        out.append(f'<rect x="{x(start):.1f}" y="{top + 4 + (i % 6) * 9}" width="{width:.1f}" height="6" '
                   f'fill="{OK if ok else FAILED}"><title>{start:+.3f} .. {end:+.3f} s '
                   f'{"ok" if ok else "failed"}</title></rect>')

    # Node lanes.
    for n, node in enumerate(lanes):
        ly = top + REQUEST_LANE + n * LANE
        out.append(f'<rect x="{LEFT}" y="{ly}" width="{plot_w}" height="{LANE - 4}" '
                   f'fill="{"#fbfbfb" if n % 2 else "#f2f2f2"}"/>')
        out.append(f'<text x="8" y="{ly + LANE / 2 + 2}" font-weight="bold">{escape(node)}</text>')
        for row in (r for r in rows if r["node"] == node):
            colour = COLOURS.get(row["kind"], COLOURS["info"])
            out.append(f'<circle cx="{x(row["t"]):.1f}" cy="{ly + (LANE - 4) / 2:.1f}" r="4.5" fill="{colour}" '
                       f'stroke="#ffffff" stroke-width="0.8"><title>{row["t"]:+.3f} s {escape(row["what"])}'
                       '</title></circle>')

    # Axis and legend.
    axis_y = lane_bottom + 8
    out.append(f'<line x1="{LEFT}" y1="{axis_y}" x2="{WIDTH - RIGHT}" y2="{axis_y}" stroke="#333"/>')
    for t in _ticks(lo, hi):
        px = x(t)
        out.append(f'<line x1="{px:.1f}" y1="{axis_y}" x2="{px:.1f}" y2="{axis_y + 5}" stroke="#333"/>')
        out.append(f'<text x="{px:.1f}" y="{axis_y + 18}" text-anchor="middle">{t:g}</text>')
    out.append(f'<text x="{WIDTH - RIGHT}" y="{axis_y + 34}" text-anchor="end">seconds after the fault '
               '(machine clock; hover a marker for the event)</text>')
    legend_x = LEFT
    for kind in ("fault", "detect", "teardown", "promote", "relaunch", "problem", "info"):
        out.append(f'<circle cx="{legend_x}" cy="{axis_y + 30}" r="4.5" fill="{COLOURS[kind]}"/>')
        out.append(f'<text x="{legend_x + 8}" y="{axis_y + 34}">{kind}</text>')
        legend_x += 70
    out.append("</svg>")
    return "\n".join(out) + "\n"
