"""Failover drills: constant request load through the frontend, fault injection on a node, the report
(detect, teardown, promotion, first good request, failed requests, relaunch, orphans) computed from the
agents' event logs, and its timeline as a table and an SVG picture. Standard library only, like the rest of
the package; used by the drill modules, playbooks/drill.yml, scripts/bench-failover and the tests."""
