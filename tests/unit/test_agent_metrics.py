"""shadowline.control.agent_metrics: the agent's exposition, parsed with prometheus_client's own parser, served by
the agent's HTTP server, and agreeing with the alert rules and the dashboard."""

from __future__ import annotations

import json
import re
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from shadowline.common.coordination import Slot
from shadowline.common.http import http_get
from shadowline.control import metrics_server
from shadowline.control.agent_metrics import (
    BUCKETS,
    CONTENT_TYPE,
    COUNTERS,
    DETECTION_REASONS,
    GAUGES,
    HISTOGRAMS,
    PREFIX,
    AgentMetrics,
)
from shadowline.control.view import Active, DeploymentView, SlotEntry
from shadowline.model.spec import status_path_for
from shadowline.model.status import DOWNLOADING, READY, ModelStatus, write_status

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "roles" / "monitoring" / "files" / "rules" / "shadowline-alerts.yml"
DASHBOARD = ROOT / "roles" / "monitoring" / "files" / "grafana" / "dashboards" / "shadowline.json"
LABELS = {"deployment": "demo", "node": "node0"}


def families(metrics: AgentMetrics) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}


def samples(metrics: AgentMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, over the whole exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}


def value(metrics: AgentMetrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, tuple(sorted({**LABELS, **labels}.items()))))


def test_every_metric_is_exported_from_the_start_with_its_type_and_help():
    metrics = AgentMetrics("demo", "node0", [0, 1])
    found = families(metrics)
    expected = {**{PREFIX + n: ("counter", h) for n, h in COUNTERS.items()},
                **{PREFIX + n: ("histogram", h) for n, h in HISTOGRAMS.items()},
                **{PREFIX + n: ("gauge", h) for n, (h, _unused) in GAUGES.items()}}
    assert {name: (f.type, f.documentation) for name, f in found.items()} == expected
    for name in COUNTERS:
        if name != "detections":
            assert value(metrics, f"{PREFIX}{name}_total") == 0.0, name
    for reason in DETECTION_REASONS:  # at 0 already, so that increase() sees the first one
        assert value(metrics, f"{PREFIX}detections_total", reason=reason) == 0.0
    for name in HISTOGRAMS:
        buckets = [s for s in found[PREFIX + name].samples if s.name.endswith("_bucket")]
        assert [float(s.labels["le"]) for s in buckets] == [*BUCKETS, float("inf")]
        assert BUCKETS[0] == 0.01 and BUCKETS[-1] == 60.0
    assert value(metrics, f"{PREFIX}active_cohort") == -1.0
    assert value(metrics, f"{PREFIX}parked_shadows") == 0.0
    assert value(metrics, f"{PREFIX}driver") == 0.0
    assert value(metrics, f"{PREFIX}slot_state", cohort="1", state="dead") == 0.0
    assert not any(name.endswith("_created") for name, _unused in samples(metrics))
    assert AgentMetrics("demo", "node0", [0], driver=True).gauges["driver"].labels(**LABELS)._value.get() == 1


def test_counts_and_durations_move_the_exported_samples():
    metrics = AgentMetrics("demo", "node0", [0, 1])
    metrics.count("detections_total", "rank-exited")
    metrics.count("detections_total", "something-new")
    for name in ("teardowns_total", "promotions_total", "promotions_unverified_total", "relaunches_total",
                 "slots_dead_total", "agents_lost_total"):
        metrics.count(name)
    metrics.observe("teardown_seconds", 0.03)
    metrics.observe("promotion_seconds", 0.7)
    metrics.observe("relaunch_seconds", 75.0)
    assert value(metrics, f"{PREFIX}detections_total", reason="rank-exited") == 1.0
    assert value(metrics, f"{PREFIX}detections_total", reason="something-new") == 1.0
    assert value(metrics, f"{PREFIX}detections_total", reason="leader-hung") == 0.0
    for name in ("teardowns", "promotions", "promotions_unverified", "relaunches", "slots_dead", "agents_lost"):
        assert value(metrics, f"{PREFIX}{name}_total") == 1.0, name
    assert value(metrics, f"{PREFIX}teardown_seconds_bucket", le="0.025") == 0.0
    assert value(metrics, f"{PREFIX}teardown_seconds_bucket", le="0.05") == 1.0
    assert value(metrics, f"{PREFIX}promotion_seconds_bucket", le="1.0") == 1.0
    assert value(metrics, f"{PREFIX}relaunch_seconds_bucket", le="60.0") == 0.0
    assert value(metrics, f"{PREFIX}relaunch_seconds_bucket", le="+Inf") == 1.0
    assert value(metrics, f"{PREFIX}relaunch_seconds_count") == 1.0
    assert value(metrics, f"{PREFIX}relaunch_seconds_sum") == pytest.approx(75.0)


def test_the_view_sets_slot_states_one_hot_the_active_cohort_and_the_parked_shadows():
    metrics = AgentMetrics("demo", "node0", [0, 1, 2])
    view = DeploymentView(slots={0: SlotEntry(Slot(0, 2, "launching"), 5), 1: SlotEntry(Slot(1, 1, "running"), 3),
                                 2: SlotEntry(Slot(2, 1, "running"), 4)}, active=Active(1, 1, 0.0))
    metrics.show_view(view)
    states = {(c, s): value(metrics, f"{PREFIX}slot_state", cohort=c, state=s)
              for c in "012" for s in ("launching", "running", "failed", "dead")}
    assert {k for k, v in states.items() if v == 1.0} == {("0", "launching"), ("1", "running"), ("2", "running")}
    assert set(states.values()) == {0.0, 1.0}
    assert value(metrics, f"{PREFIX}active_cohort") == 1.0
    assert value(metrics, f"{PREFIX}parked_shadows") == 1.0  # cohort 2; cohort 1 serves, cohort 0 launches
    metrics.show_view(DeploymentView(slots={0: SlotEntry(Slot(0, 2, "dead"), 6)}))
    assert value(metrics, f"{PREFIX}active_cohort") == -1.0
    assert value(metrics, f"{PREFIX}slot_state", cohort="0", state="dead") == 1.0
    assert value(metrics, f"{PREFIX}slot_state", cohort="1", state="running") == 0.0  # no slot: all off


def test_node_gauges_follow_the_gms_server_and_the_model_status_file(tmp_path: Path):
    model_dir = str(tmp_path / "models" / "llama")
    metrics = AgentMetrics("demo", "node0", [0], model_dir=model_dir)
    metrics.show_node(gms_server_up=False)
    assert value(metrics, f"{PREFIX}gms_server_up") == 0.0
    assert value(metrics, f"{PREFIX}model_ready") is None  # no status file: the model is not shadowline's
    (tmp_path / "models").mkdir()
    status = ModelStatus(state=READY, model_id="m", revision="r", local_dir=model_dir, digest="aaa")
    write_status(status_path_for(model_dir), status)
    metrics.show_node(gms_server_up=True)
    assert value(metrics, f"{PREFIX}gms_server_up") == 1.0
    assert value(metrics, f"{PREFIX}model_ready") == 1.0
    assert value(metrics, f"{PREFIX}model_info", digest="aaa") == 1.0
    status.digest = "bbb"
    write_status(status_path_for(model_dir), status)
    metrics.show_node(gms_server_up=True)
    infos = [k for k in samples(metrics) if k[0] == f"{PREFIX}model_info"]
    assert infos == [(f"{PREFIX}model_info", tuple(sorted({**LABELS, "digest": "bbb"}.items())))]
    write_status(status_path_for(model_dir), ModelStatus(state=DOWNLOADING, model_id="m", revision="r",
                                                         local_dir=model_dir))
    metrics.show_node(gms_server_up=True)
    assert value(metrics, f"{PREFIX}model_ready") == 0.0
    assert not [k for k in samples(metrics) if k[0] == f"{PREFIX}model_info"]


def test_label_values_are_escaped_by_the_library():
    metrics = AgentMetrics('de"mo\\', "node\n0", [0])
    text = metrics.render().decode()
    assert 'deployment="de\\"mo\\\\"' in text and 'node="node\\n0"' in text
    parsed = {s.labels["deployment"] + "|" + s.labels["node"]
              for f in text_string_to_metric_families(text) for s in f.samples}
    assert parsed == {'de"mo\\|node\n0'}


def test_the_agent_serves_metrics_and_health_on_its_port():
    metrics = AgentMetrics("demo", "node0", [0])
    metrics.count("teardowns_total")
    ticking = [True]
    server = metrics_server.serve("127.0.0.1", 0, lambda: (metrics.render(), CONTENT_TYPE), lambda: ticking[0])
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = response.read().decode()
        assert f'{PREFIX}teardowns_total{{deployment="demo",node="node0"}} 1.0' in text
        with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
            assert response.read() == b"ok\n"
        ticking[0] = False  # the loop stopped ticking: /health says so
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/health", timeout=5)
        assert err.value.code == 503
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/other", timeout=5)
        assert err.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_idle_connections_neither_exhaust_the_server_nor_block_a_scrape(monkeypatch):
    """Fault matrix row 12 in small: more idle connections than the server serves at once; a scrape still gets
    an answer, the idle ones are turned away or dropped after the idle timeout."""
    monkeypatch.setattr(metrics_server, "IDLE_TIMEOUT_S", 0.5)
    server = metrics_server.serve("127.0.0.1", 0, lambda: (b"m 1\n", CONTENT_TYPE), lambda: True)
    port = server.server_address[1]
    idle = []
    try:
        for _unused in range(metrics_server.MAX_CONNECTIONS + 40):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.2)
        assert server.turned_away >= 40  # beyond the bound: closed at once, not one thread each
        deadline = time.monotonic() + 5
        while True:  # the held ones are dropped after IDLE_TIMEOUT_S; then a scrape is served
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    assert response.read() == b"m 1\n"
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert time.monotonic() < deadline, "a scrape never got through"
                time.sleep(0.1)
    finally:
        for sock in idle:
            sock.close()
        server.shutdown()
        server.server_close()


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(shadowline_agent_[a-z_]+)", expr))


def exported_names() -> set[str]:
    names = {f"{PREFIX}{n}_total" for n in COUNTERS} | {f"{PREFIX}{n}" for n in GAUGES}
    for name in HISTOGRAMS:
        names |= {f"{PREFIX}{name}_{part}" for part in ("bucket", "count", "sum")}
    return names


def test_the_rules_and_the_dashboard_use_only_what_the_agent_exports_and_with_its_labels():
    rules = yaml.safe_load(RULES.read_text())
    used: set[str] = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            used |= metric_names(rule["expr"])
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            used |= metric_names(target.get("expr", ""))
    assert used, "the rules and the dashboard query the agent"
    assert used <= exported_names(), used - exported_names()
    label_uses = set(re.findall(r"shadowline_agent_slot_state\{[^}]*\}", RULES.read_text()))
    assert all("state=" in use for use in label_uses)


def test_with_tls_only_a_client_of_the_deployments_ca_is_served(tmp_path, monkeypatch):
    """Secure by default: the endpoint wants a client certificate of the deployment's CA; a plain-text client, a
    client without a certificate and one of another deployment's CA get nothing; the handshake runs in the
    request's thread, so a client that never sends one does not stop a scrape."""
    from shadowline.cluster.access import client_context
    from shadowline.deployment.pki import ensure_pki

    monkeypatch.setattr(metrics_server, "IDLE_TIMEOUT_S", 0.5)
    mine, other = tmp_path / "pki", tmp_path / "other"
    ensure_pki(str(mine), "demo", [("node0", "127.0.0.1")], [])
    ensure_pki(str(other), "another", [("node0", "127.0.0.1")], [])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(mine / "ca.crt"))
    context.load_cert_chain(str(mine / "hosts/node0/server.crt"), str(mine / "hosts/node0/server.key"))
    context.verify_mode = ssl.CERT_REQUIRED
    server = metrics_server.serve("127.0.0.1", 0, lambda: (b"m 1\n", CONTENT_TYPE), lambda: True, context)
    port = server.server_address[1]
    silent = socket.create_connection(("127.0.0.1", port), timeout=5)  # connects, never shakes hands
    try:
        ours = client_context(str(mine / "ca.crt"), str(mine / "controller/client.crt"),
                              str(mine / "controller/client.key"))
        assert http_get(f"https://127.0.0.1:{port}/metrics", 5, ours) == (200, "m 1\n")
        assert http_get(f"http://127.0.0.1:{port}/metrics", 2) is None  # plain text
        anonymous = ssl.create_default_context(cafile=str(mine / "ca.crt"))
        assert http_get(f"https://127.0.0.1:{port}/health", 2, anonymous) is None
        theirs = client_context(str(mine / "ca.crt"), str(other / "controller/client.crt"),
                                str(other / "controller/client.key"))
        assert http_get(f"https://127.0.0.1:{port}/health", 2, theirs) is None
    finally:
        silent.close()
        server.shutdown()
        server.server_close()
