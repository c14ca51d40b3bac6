"""Monitoring: gms_monitoring in the contract, the targets and Prometheus configuration rendered from the plan,
and the alert rules and dashboard checked by the real promtool (Debian's prometheus package, bindep.txt)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from shadowline.deployment import monitoring
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan import Plan
from shadowline.deployment.plan_builder import build_plan
from shadowline.deployment.secrets import ensure_secrets, host_files

from .helpers import hostvars

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "roles" / "monitoring" / "files" / "rules" / "shadowline-alerts.yml"
RULE_TESTS = ROOT / "monitoring" / "tests" / "alerts.test.yml"
DASHBOARD = ROOT / "roles" / "monitoring" / "files" / "grafana" / "dashboards" / "shadowline.json"
PROVISIONING = ROOT / "roles" / "monitoring" / "files" / "grafana" / "provisioning"


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: install Debian's prometheus packages (scripts/setup-system, bindep.txt)"
    return path


def run(*argv: str | Path) -> str:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"{' '.join(map(str, argv))} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout + proc.stderr


def plan_of(nodes: int = 2, infra: list[str] | None = None, **shared) -> Plan:
    hv, hosts = hostvars(nodes, gms_engine={"tensor_parallel_size": 8 * nodes}, **shared)
    for i, host in enumerate(infra or []):
        hv[host] = {"ansible_host": f"198.18.0.{100 + i}"}
    contract, problems = parse_contract(hv, hosts, infra)
    assert not problems, [str(p) for p in problems]
    assert contract is not None
    return build_plan(contract)


def problems_of(**shared) -> list[str]:
    hv, hosts = hostvars(2, **shared)
    _unused, problems = parse_contract(hv, hosts)
    return [str(p) for p in problems]


# -- the contract ----------------------------------------------------------------------------------------- #

def test_default_is_a_prometheus_on_the_first_infra_host():
    plan = plan_of(2)
    assert plan.monitoring is not None
    assert (plan.monitoring.mode, plan.monitoring.host, plan.monitoring.address) == ("server", "node0", "198.18.0.10")
    assert monitoring.prometheus_url(plan) == "http://198.18.0.10:9090"
    with_infra = plan_of(2, infra=["infra0"])
    assert with_infra.monitoring is not None and with_infra.monitoring.host == "infra0"
    assert Plan.from_dict(with_infra.to_dict()).monitoring == with_infra.monitoring


def test_settings_are_parsed_and_strings_accepted():
    plan = plan_of(3, gms_monitoring={"mode": "targets", "host": "node2", "port": "9191", "scrape_interval_s": 2})
    assert plan.monitoring is not None
    assert (plan.monitoring.mode, plan.monitoring.host, plan.monitoring.port) == ("targets", "node2", 9191)
    assert plan.monitoring.scrape_interval_s == 2


def test_bad_settings_are_named_with_their_fix():
    assert problems_of(gms_monitoring={"mode": "prometheus"}) == [
        "gms_monitoring.mode: is the string 'prometheus', not one of server, targets, none. "
        "Fix: set gms_monitoring.mode to one of server, targets, none."]
    assert problems_of(gms_monitoring={"host": "grafana1"}) == [
        "gms_monitoring.host: is the string 'grafana1', not a host of gms_nodes or gms_infra. "
        "Fix: set gms_monitoring.host to one of node0, node1, or leave it unset for the first infra host."]
    (msg,) = problems_of(gms_monitoring={"port": 80})
    assert msg.startswith("gms_monitoring.port: is 80, outside 1024..65535.")
    (msg,) = problems_of(gms_monitoring={"prot": 9090})
    assert msg.startswith("gms_monitoring.prot: is not a known key.") and "'port'" in msg
    (msg,) = problems_of(gms_monitoring={"blackbox_port": 9090})
    assert msg.startswith("gms_monitoring.blackbox_port: is 9090, the same as gms_monitoring.port.")


# -- what is scraped -------------------------------------------------------------------------------------- #

def test_targets_are_every_leader_agent_frontend_etcd_member_and_nats():
    plan = plan_of(3, infra=["infra0", "infra1", "infra2"], gms_cohorts=3,
                   gms_ports={"system_base": 9000, "agent_metrics": 9500})
    targets = monitoring.scrape_targets(plan)
    assert list(targets) == list(monitoring.JOBS)
    engines = [(g["targets"][0], g["labels"]) for g in targets["shadowline-engine"]]
    assert engines == [(f"198.18.0.10:{9000 + c}", {"deployment": "llama", "cohort": str(c), "node": "node0"})
                       for c in range(3)]
    assert [g["targets"][0] for g in targets["shadowline-agent"]] == [f"198.18.0.{10 + i}:9500" for i in range(3)]
    assert [g["targets"][0] for g in targets["shadowline-frontend"]] == ["198.18.0.100:8000"]
    assert [g["targets"][0] for g in targets["shadowline-etcd"]] == [f"198.18.0.{100 + i}:2379" for i in range(3)]
    assert [g["labels"]["node"] for g in targets["shadowline-nats"]] == ["infra0", "infra1", "infra2"]
    files = monitoring.targets_files(plan)
    assert sorted(files) == sorted(f"/etc/prometheus/shadowline-llama/targets/{j}.json" for j in monitoring.JOBS)
    assert all(json.loads(text) for text in files.values())


def test_prometheus_unit_is_the_deployments_own_and_hardened():
    plan = plan_of(2)
    unit = monitoring.prometheus_unit(plan)
    assert plan.unit_name("prometheus") == "shadowline-llama-prometheus.service"
    assert "User=shadowline" in unit and "ProtectSystem=strict" in unit and "NoNewPrivileges=yes" in unit
    assert "--storage.tsdb.path=/var/lib/shadowline/llama/prometheus" in unit
    assert "ReadWritePaths=/var/lib/shadowline/llama/prometheus" in unit
    assert "--web.listen-address=198.18.0.10:9090" in unit and "ExecReload=/bin/kill -HUP $MAINPID" in unit
    assert "--web.listen-address=127.0.0.1:9115" in monitoring.blackbox_unit(plan)


def installed_config(plan: Plan, tmp_path: Path) -> Path:
    """The rendered configuration, targets and rules under tmp_path instead of /etc/prometheus/shadowline-*, and the
    Prometheus host's CA and client certificate (the agents' TLS) under tmp_path/secrets instead of its config dir."""
    here = monitoring.monitoring_dir(plan)
    view = monitoring.role_view(plan)
    files = {f["path"]: f["content"] for f in view["targets_files"] + view["server_files"]}
    files[f"{view['rules_dir']}/shadowline-alerts.yml"] = RULES.read_text()
    secrets = tmp_path / "secrets"
    for path, text in files.items():
        target = tmp_path / Path(path).relative_to(here)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text.replace(here, str(tmp_path)).replace(plan.security.dir, str(secrets)))
    ensure_secrets(plan)
    secrets.mkdir()
    for item in host_files(plan, plan.monitoring.host):
        shutil.copy(item["src"], secrets / Path(item["dest"]).name)
    return tmp_path


def test_rendered_configuration_passes_promtool_and_the_blackbox_exporter(tmp_path: Path):
    config = installed_config(plan_of(3, gms_cohorts=3, gms_secrets_dir=str(tmp_path / "controller")), tmp_path)
    out = run(tool("promtool"), "check", "config", config / "prometheus.yml")
    assert "SUCCESS: 1 rule files found" in out
    run(tool("prometheus-blackbox-exporter"), "--config.file", config / "blackbox.yml", "--config.check")
    snippet = monitoring.scrape_configs_snippet(plan_of(2))
    jobs = json.loads(snippet[snippet.index("["):])
    assert [j["job_name"] for j in jobs] == list(monitoring.JOBS)


# -- alert rules ------------------------------------------------------------------------------------------ #

def test_alert_rules_pass_promtool_check_and_their_unit_tests():
    out = run(tool("promtool"), "check", "rules", RULES)
    assert re.search(r"SUCCESS: \d+ rules found", out)
    run(tool("promtool"), "test", "rules", RULE_TESTS)


def test_every_alert_has_a_unit_test_and_a_runbook_entry():
    alerts = re.findall(r"- alert: (\w+)", RULES.read_text())
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert alerts and not set(alerts) - tested, f"alerts without a promtool test: {set(alerts) - tested}"
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    assert not [a for a in alerts if f"`{a}`" not in doc], "every alert is explained in docs/monitoring.md"


# -- the Grafana dashboard -------------------------------------------------------------------------------- #

GRAFANA_VARIABLES = {"$deployment": ".+", "$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_dashboard_schema_panels_datasource_and_ids():
    board = dashboard()
    assert board["uid"] == "shadowline-failover" and board["title"] and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["deployment"]["type"] == "query"
    provisioned = (PROVISIONING / "datasources" / "shadowline.yml").read_text()
    assert f"uid: {variables['datasource']['current']['value']}" in provisioned
    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
    titles = {p["title"] for p in panels}
    for wanted in ("Active engines", "Parked shadows", "Failover state per cohort", "Switch time (waking to active)",
                   "Failovers", "Failover phases (median, from detection)", "Frontend requests", "Agent health"):
        assert wanted in titles
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["type"] in {"stat", "timeseries", "state-timeline", "table"}, panel["type"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, panel["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {panel['title']} overlaps another"
        cells |= mine
        refs = [t["refId"] for t in panel["targets"]]
        assert panel["targets"] and len(refs) == len(set(refs)), panel["title"]
        assert all(t["datasource"] == panel["datasource"] and t["expr"] for t in panel["targets"]), panel["title"]


def test_every_dashboard_query_parses(tmp_path: Path):
    """Each expression (Grafana's variables filled in) becomes a recording rule that promtool checks."""
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    count = 0
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"unknown Grafana variable in {panel['title']}: {expr}"
            lines += [f"      - record: dashboard:panel{panel['id']}:{target['refId'].lower()}",
                      f"        expr: {json.dumps(expr)}"]
            count += 1
    rules = tmp_path / "dashboard.rules.yml"
    rules.write_text("\n".join(lines) + "\n")
    out = run(tool("promtool"), "check", "rules", rules)
    assert f"SUCCESS: {count} rules found" in out


def test_dashboard_picture_is_drawn_from_the_json(tmp_path: Path):
    out = tmp_path / "dashboard.svg"
    run(ROOT / ".venv" / "bin" / "python", ROOT / "monitoring" / "dashboard_svg.py", DASHBOARD, out)
    committed = ROOT / "docs" / "img" / "dashboard.svg"
    assert out.read_text() == committed.read_text(), "run monitoring/dashboard_svg.py and commit docs/img/dashboard.svg"
    assert out.read_text().count("<g>") == len(dashboard()["panels"])
