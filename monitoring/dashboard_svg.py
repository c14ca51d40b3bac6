#!/usr/bin/env python3
"""A picture of the Grafana dashboard's layout for the README, drawn from its JSON (no Grafana, no plotting
dependency): each panel at its grid position with its title, its kind and a sketch of what it shows.

Usage: monitoring/dashboard_svg.py [DASHBOARD.json] [OUT.svg]
(defaults: roles/monitoring/files/grafana/dashboards/shadowline.json -> docs/img/dashboard.svg;
tests/unit/test_monitoring.py checks that the committed picture is what this draws.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "roles" / "monitoring" / "files" / "grafana" / "dashboards" / "shadowline.json"
OUT = ROOT / "docs" / "img" / "dashboard.svg"
COLUMN, ROW, PAD, HEADER = 40, 26, 4, 34  # Grafana's grid: 24 columns; pixels per grid unit
STATE_COLOURS = ["#5794f2", "#fade2a", "#ff9830", "#73bf69"]  # init, standby, waking, active
LINE_COLOURS = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c"]


def sketch(panel: dict[str, Any], x: float, y: float, w: float, h: float) -> list[str]:
    """What the panel shows, roughly: a number, state bands, lines or table rows."""
    kind = panel["type"]
    if kind == "stat":
        steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
        colour = "#73bf69" if any(s["color"] == "green" for s in steps) else "#ff9830"
        return [f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="3" fill="{colour}" opacity="0.25"/>',
                f'<text x="{x + w / 2}" y="{y + h / 2 + 9}" font-size="26" text-anchor="middle" fill="#222">'
                '1</text>']
    if kind == "state-timeline":
        out, lanes = [], 2
        pattern = [[3, 3, 3, 3, 3, 3, 2, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 2, 3, 3, 3, 3, 3]]
        lane_h = (h - 6) / lanes
        for lane in range(lanes):
            seg = w / len(pattern[lane])
            for i, state in enumerate(pattern[lane]):
                out.append(f'<rect x="{x + i * seg:.1f}" y="{y + lane * lane_h + 2:.1f}" width="{seg:.1f}" '
                           f'height="{lane_h - 4:.1f}" fill="{STATE_COLOURS[state]}"/>')
        return out
    if kind == "table":
        rows = max(1, int(h // 14))
        return [f'<line x1="{x}" y1="{y + 14 * (i + 1)}" x2="{x + w}" y2="{y + 14 * (i + 1)}" stroke="#ccc"/>'
                for i in range(rows - 1)]
    out = []
    for n, _target in enumerate(panel.get("targets", [])):
        points = []
        for i in range(13):
            level = 0.25 + 0.5 * ((i * (n + 3) + n * 5) % 7) / 7
            points.append(f"{x + i * w / 12:.1f},{y + h - level * h:.1f}")
        out.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="{LINE_COLOURS[n % 5]}" '
                   f'stroke-width="1.5"/>')
    return out


def render(dashboard: dict[str, Any]) -> str:
    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    width, height = 24 * COLUMN + 2 * PAD, HEADER + rows * ROW + 2 * PAD
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
           f'<rect width="{width}" height="{height}" fill="#f4f5f5"/>',
           f'<text x="{PAD + 4}" y="22" font-size="15" font-weight="bold">{escape(dashboard["title"])}</text>',
           f'<text x="{width - PAD - 4}" y="22" font-size="11" text-anchor="end" fill="#555">'
           f'variables: {escape(", ".join(v["name"] for v in dashboard["templating"]["list"]))}</text>']
    for panel in panels:
        g = panel["gridPos"]
        x, y = PAD + g["x"] * COLUMN + 2, HEADER + g["y"] * ROW + 2
        w, h = g["w"] * COLUMN - 4, g["h"] * ROW - 4
        out.append(f'<g><title>{escape(panel["title"])}: {escape(panel.get("description", ""))}</title>')
        out.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="3" fill="#fff" stroke="#c7d0d9"/>')
        out.append(f'<text x="{x + 8}" y="{y + 16}" font-size="12" font-weight="bold">{escape(panel["title"])}</text>')
        out.append(f'<text x="{x + w - 8}" y="{y + 16}" font-size="10" text-anchor="end" fill="#888">'
                   f'{escape(panel["type"])}</text>')
        out += sketch(panel, x + 8, y + 24, w - 16, h - 32)
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    source = Path(argv[1]) if len(argv) > 1 else DASHBOARD
    target = Path(argv[2]) if len(argv) > 2 else OUT
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(json.loads(source.read_text())))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
