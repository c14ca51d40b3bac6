"""The drill reports ``shadowline history --reports PATH`` lists: the JSON files ``playbooks/drill.yml`` writes with
``-e drill_report=PATH``, checked by the report code's own table (report_text.py), one line of key figures each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..cluster.history import HistoryError, stamp
from .report_text import render_timeline_table

REPORT_KEYS = ("fault", "target", "timeline", "passed")  # what every drill report has (report.py)


def report_files(path: Path) -> list[Path]:
    """The drill reports ``--reports PATH`` names: the file, or the ``*.json`` files of a directory."""
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix == ".json")
        if not found:
            raise HistoryError(f"{path} holds no drill report (*.json, what playbooks/drill.yml writes with "
                               "-e drill_report=PATH)")
        return found
    if not path.exists():
        raise HistoryError(f"{path}: no such file or directory")
    return [path]


def read_report(path: Path) -> dict[str, Any] | None:
    """A drill report, checked by the report code's own table (drill/report_text.py); None for a JSON file that is not
    one (an evidence file, anything else), an error for a file that cannot be read or is not JSON."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise HistoryError(f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
    except ValueError:
        raise HistoryError(f"{path} is not JSON: not a drill report") from None
    if not isinstance(report, dict) or any(key not in report for key in REPORT_KEYS):
        return None
    try:
        render_timeline_table(report)
    except (KeyError, TypeError, AttributeError, ValueError):
        return None
    return report


def reports_at(path: Path) -> tuple[list[dict[str, Any]], list[Path]]:
    """The key figures of every drill report ``path`` names, oldest drill first, and the JSON files that are not
    reports; an error when none is."""
    records, left_out = [], []
    for name in report_files(path):
        report = read_report(name)
        if report is None:
            left_out.append(name)
        else:
            records.append(report_record(name, report))
    if not records:
        raise HistoryError(f"{path} holds no drill report (the JSON playbooks/drill.yml writes with "
                           "-e drill_report=PATH)")
    return sorted(records, key=lambda r: r["injected_at"] or 0), left_out


def report_record(path: Path, report: dict[str, Any]) -> dict[str, Any]:
    """A report's key figures: what the list shows, and -o json gives."""
    requests = report.get("requests") if isinstance(report.get("requests"), dict) else {}
    injected = report.get("injected_at")
    return {"file": str(path), "drill": report["fault"],
            "injected_at": injected if isinstance(injected, (int, float)) and not isinstance(injected, bool) else None,
            "passed": bool(report["passed"]), "target": report.get("target"),
            "serving_before": report.get("serving_before"), "serving_after": report.get("serving_after"),
            "detect_s": report.get("detect_s"), "promote_s": report.get("promote_s"),
            "first_ok_s": report.get("first_ok_s"), "relaunch_s": report.get("relaunch_s"),
            "failed_requests": (report.get("failed_before_promotion") or 0) + (report.get("failed_after_promotion") or 0),
            "requests_sent": requests.get("sent"), "problems": len(report.get("problems") or [])}


def report_lines(records: list[dict[str, Any]]) -> list[str]:
    header = ("when (UTC)", "drill", "result", "detect", "promote", "first ok", "relaunch", "failed", "file")
    rows = [(stamp(r["injected_at"])[:19] if r["injected_at"] is not None else "-", r["drill"],
             "PASS" if r["passed"] else f"FAIL ({r['problems']})", _seconds(r["detect_s"]), _seconds(r["promote_s"]),
             _seconds(r["first_ok_s"]), _seconds(r["relaunch_s"]),
             f"{r['failed_requests']}/{r['requests_sent'] if r['requests_sent'] is not None else '?'}", r["file"])
            for r in records]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]


def _seconds(value: Any) -> str:
    return f"{value:.3f} s" if isinstance(value, (int, float)) else "-"
