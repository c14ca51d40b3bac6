"""The drill report tooling as its own program, what ``shadowline drill-report`` and ``shadowline history
--reports`` run (``python -m shadowline.drill.report_tool``), so that no production command imports drill/:

  report_tool table FILE [--svg PATH|-]                       the timeline table of a drill report, its SVG beside it
  report_tool list PATH [--since UNIXTIME] [--limit N] [-o table|json]   drill reports, one line of figures each

Its standard output, standard error and exit status are the command's: 1 for a drill that failed (the table
printed), 1 with one line on standard error for an input it cannot use.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..cluster.history import HistoryError
from ..common import console
from .report_list import report_lines, reports_at
from .report_text import render_timeline_table
from .svg import render_svg

PROG = "shadowline"


def table(path: Path, svg_option: str | None) -> int:
    """``shadowline drill-report FILE``: the table, and the SVG timeline (FILE with .svg, or ``--svg``; - for none)."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"{PROG} drill-report: cannot read {path}: {err}") from None
    try:
        lines = render_timeline_table(report)
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        raise SystemExit(f"{PROG} drill-report: {path} is not a drill report (the JSON playbooks/drill.yml writes "
                         f"with -e drill_report=PATH): {type(err).__name__} {err}") from None
    for line in lines:
        console.out(line)
    evidence = report.get("evidence") or {}
    if svg_option != "-" and "requests" in evidence:
        svg = Path(svg_option) if svg_option else path.with_suffix(".svg")
        try:
            svg.write_text(render_svg(report, evidence["requests"], evidence.get("nodes") or []))
        except OSError as err:
            raise SystemExit(f"{PROG} drill-report: cannot write the timeline {svg}: {err.strerror}") from None
        console.out(f"timeline: {svg}")
    return 0 if report.get("passed", True) else 1


def listing(path: Path, since: float | None, limit: int | None, output: str) -> int:
    """``shadowline history --reports PATH``: the drill reports of ``path`` (a file or a directory), one line each;
    JSON files that are not reports are named on stderr and left out."""
    try:
        records, left_out = reports_at(path)
    except HistoryError as err:
        raise SystemExit(f"{PROG} history --reports: {err}") from None
    for name in left_out:
        console.err(f"{PROG} history --reports: {name} is not a drill report, left out")
    records = [r for r in records if since is None or (r["injected_at"] or 0) >= since]
    records = records[-limit:] if limit else records
    if output == "json":
        console.out(json.dumps(records, indent=2))
    else:
        for line in report_lines(records):
            console.out(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shadowline.drill.report_tool",
                                     description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("table", help="the timeline table of a drill report, and its SVG")
    one.add_argument("file")
    one.add_argument("--svg")
    many = sub.add_parser("list", help="drill reports, one line of figures each")
    many.add_argument("path")
    many.add_argument("--since", type=float)
    many.add_argument("--limit", type=int)
    many.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = parser.parse_args(argv)
    if args.what == "table":
        return table(Path(args.file), args.svg)
    return listing(Path(args.path), args.since, args.limit, args.output)


if __name__ == "__main__":
    raise SystemExit(main())
