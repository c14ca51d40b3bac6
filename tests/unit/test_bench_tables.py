"""The tables scripts/bench-failover prints (drill/bench_tables.py), from recorded trials: a phase whose setup
failed prints no figure (issue #37), and a ratio is printed only where both sides were measured."""

from __future__ import annotations

from shadowline.drill.bench_tables import table_lines

EMPTY = {"agent": [], "slurm": [], "upstream": [], "cold": [], "quiet": [], "teardown": [], "security": []}
KILL = {"nodes": 2, "fault": "kill-leader", "detect_s": 0.1, "teardown_s": 0.2, "lock_s": 0.3, "active_s": 0.4,
        "first_ok_s": 0.5, "promote_s": 0.6, "relaunch_s": 1.0}


def test_a_failed_cold_phase_prints_no_figure():
    results = {**EMPTY, "agent": [KILL], "cold": [{"nodes": 2, "first_ok_s": 1.1}],
               "failed": [{"nodes": 2, "phase": "cold restart", "error": "Unit shadowline-demo-gms.service not found"}]}
    text = "\n".join(table_lines(results, 10.0, 1.0))
    assert "the cold restart phase FAILED, no figure: Unit shadowline-demo-gms.service not found" in text
    assert "cold / promotion" not in text


def test_the_cold_ratio_is_printed_when_both_sides_were_measured():
    results = {**EMPTY, "agent": [KILL], "cold": [{"nodes": 2, "first_ok_s": 2.5}]}
    text = "\n".join(table_lines(results, 10.0, 1.0))
    assert "cold restart 2.500 s (n=1), promotion 0.500 s (n=1): cold / promotion = 5.0x" in text


def test_the_latency_table_has_one_row_per_size_and_fault():
    lines = table_lines({**EMPTY, "agent": [KILL, {**KILL, "nodes": 4}]}, 10.0, 1.0)
    rows = [line for line in lines if line.startswith(("2 ", "4 "))]
    assert [row.split()[:2] for row in rows] == [["2", "kill-leader"], ["4", "kill-leader"]]
