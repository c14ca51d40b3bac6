"""What Prometheus scrapes for one deployment, rendered from the plan: file_sd targets, prometheus.yml,
the blackbox exporter's probe of NATS, and the systemd units of both (gms_monitoring, role monitoring).

Scrape jobs (each one file_sd file, ``<targets_dir>/<job>.json``, with the labels ``deployment`` and, where
there is one, ``node`` and ``cohort``):

- ``shadowline-engine``: every cohort leader's system port (``DYN_SYSTEM_PORT``, /metrics): Dynamo's
  ``dynamo_component_engine_failover_*`` metrics; headless ranks serve no metrics.
- ``shadowline-agent``: every node's agent (``gms_ports.agent_metrics``), over TLS with the Prometheus host's
  client certificate of the deployment's CA unless insecure (cluster/access.py: the endpoint requires one).
- ``shadowline-frontend``: the Dynamo frontend's HTTP port (/metrics on the OpenAI port; https with
  gms_frontend_tls).
- ``shadowline-etcd``: every etcd member's client port (/metrics), over TLS with the same client certificate
  unless insecure (etcd requires one of every client).
- ``shadowline-nats``: every NATS server's client port, probed by the blackbox exporter (a TCP connect that
  must read NATS's ``INFO`` greeting): NATS serves only JSON monitoring (/varz, on loopback) and Debian
  packages no NATS Prometheus exporter.

Everything here is a pure function of the typed plan; the role only writes what these return.
"""

from __future__ import annotations

import json
from typing import Any

from ..common.settings import Monitoring
from .plan import Plan, Process
from .units import service_unit

JOBS = ("shadowline-engine", "shadowline-agent", "shadowline-frontend", "shadowline-etcd", "shadowline-nats")
PROMETHEUS = "/usr/bin/prometheus"
BLACKBOX = "/usr/bin/prometheus-blackbox-exporter"
NATS_PROBE_MODULE = "nats_info"


def monitoring_dir(plan: Plan) -> str:
    """Prometheus's configuration: prometheus.yml, rules/, targets/, blackbox.yml. Beside Debian's
    /etc/prometheus/prometheus.yml and readable by its prometheus user (an existing Prometheus, mode targets);
    nothing in it is secret."""
    return f"/etc/prometheus/shadowline-{plan.deployment}"


def targets_dir(plan: Plan) -> str:
    """The file_sd files, one per job: what an existing Prometheus is pointed at (mode targets)."""
    return f"{monitoring_dir(plan)}/targets"


def rules_dir(plan: Plan) -> str:
    return f"{monitoring_dir(plan)}/rules"


def data_dir(plan: Plan) -> str:
    return f"{plan.state_dir}/prometheus"


def prometheus_url(plan: Plan) -> str:
    """Prometheus's web address (its HTTP API), for people and tests."""
    settings = _settings(plan)
    return f"http://{_url_host(settings.address)}:{settings.port}"


def scrape_targets(plan: Plan) -> dict[str, list[dict[str, Any]]]:
    """file_sd content of every job: job -> [{"targets": [host:port], "labels": {...}}]."""
    dep = plan.deployment

    def replica(q: int) -> dict[str, str]:  # a fleet's series name their replica (one replica's as before)
        return {"replica": str(q)} if plan.fleet else {}

    engines = [_group(f"{c.leader.address}:{c.ports.system}", deployment=dep, cohort=str(c.cohort),
                      node=c.leader.host, **replica(r.id)) for r in plan.replicas for c in r.cohorts]
    agents = [_group(f"{n.address}:{plan.ports.agent_metrics}", deployment=dep, node=n.host,
                     **replica(plan.replica_of(n.host).id)) for n in plan.nodes]
    agents += [_group(f"{n.address}:{plan.ports.agent_metrics}", deployment=dep, node=n.host, spare="true")
               for n in plan.spares]  # a spare's agent: its readiness (ShadowlineSparesBelowMinimum)
    frontend_host = plan.infra.frontend_url.split("//", 1)[1]
    frontend = [_group(frontend_host, deployment=dep, node=plan.infra.frontend.host)]
    etcd = [_group(f"{n.address}:{plan.ports.etcd_client}", deployment=dep, node=n.host) for n in plan.infra.hosts]
    nats = [_group(f"{n.address}:{plan.ports.nats}", deployment=dep, node=n.host) for n in plan.infra.hosts]
    return dict(zip(JOBS, (engines, agents, frontend, etcd, nats)))


def targets_files(plan: Plan) -> dict[str, str]:
    """path -> JSON text of every job's file_sd file."""
    return {f"{targets_dir(plan)}/{job}.json": json.dumps(groups, indent=2) + "\n"
            for job, groups in scrape_targets(plan).items()}


def scrape_configs(plan: Plan) -> list[dict[str, Any]]:
    """The scrape_configs of the jobs, reading the targets files (the same list for an existing Prometheus)."""
    settings = _settings(plan)
    configs: list[dict[str, Any]] = []
    for job in JOBS:
        config: dict[str, Any] = {
            "job_name": job,
            "file_sd_configs": [{"files": [f"{targets_dir(plan)}/{job}.json"]}],
        }
        if job == "shadowline-agent":
            config["honor_labels"] = True  # the agent's own deployment and node labels, not exported_*
        https = (job == "shadowline-agent" and plan.secure) or (job == "shadowline-etcd" and plan.etcd_tls) or \
            (job == "shadowline-frontend" and plan.security is not None and plan.security.frontend_https)
        if https and plan.security is not None:  # TLS with a client certificate of the deployment's CA
            config["scheme"] = "https"
            config["tls_config"] = {"ca_file": plan.security.ca, "cert_file": plan.security.client_cert,
                                    "key_file": plan.security.client_key}
        if job == "shadowline-nats":
            config["metrics_path"] = "/probe"
            config["params"] = {"module": [NATS_PROBE_MODULE]}
            config["relabel_configs"] = [
                {"source_labels": ["__address__"], "target_label": "__param_target"},
                {"source_labels": ["__param_target"], "target_label": "instance"},
                {"target_label": "__address__", "replacement": f"127.0.0.1:{settings.blackbox_port}"},
            ]
        configs.append(config)
    return configs


def prometheus_config(plan: Plan) -> str:
    """prometheus.yml of the deployment's own Prometheus (mode server). JSON is YAML: written as JSON."""
    settings = _settings(plan)
    interval = f"{settings.scrape_interval_s}s"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "external_labels": {"shadowline_deployment": plan.deployment}},
        "rule_files": [f"{rules_dir(plan)}/*.yml"],
        "scrape_configs": [
            {"job_name": "prometheus", "static_configs": [{"targets": [f"{_url_host(settings.address)}:"
                                                                       f"{settings.port}"],
                                                           "labels": {"deployment": plan.deployment}}]},
            *scrape_configs(plan),
        ],
    }
    return "# Rendered by shadowline (deployment/monitoring.py) from the plan; do not edit.\n" + \
        json.dumps(config, indent=2) + "\n"


def scrape_configs_snippet(plan: Plan) -> str:
    """For an existing Prometheus (mode targets): the scrape_configs entries to add to its prometheus.yml."""
    lines = [f"# shadowline {plan.deployment}: add these entries under scrape_configs: of your prometheus.yml,",
             "# and the alert rules beside them under rule_files:. The shadowline-nats job needs a blackbox",
             f"# exporter on 127.0.0.1 with the module {NATS_PROBE_MODULE} of blackbox.yml here. The",
             "# shadowline-agent and shadowline-etcd jobs' tls_config names this host's CA and client certificate: a Prometheus",
             "# elsewhere needs a client certificate of the deployment's CA (docs/monitoring.md).",
             json.dumps(scrape_configs(plan), indent=2)]
    return "\n".join(lines) + "\n"


def blackbox_config() -> str:
    """The blackbox exporter's module that checks NATS: a TCP connect that must be greeted with INFO."""
    config = {"modules": {NATS_PROBE_MODULE: {
        "prober": "tcp", "timeout": "3s",
        "tcp": {"query_response": [{"expect": "^INFO "}]},
    }}}
    return json.dumps(config, indent=2) + "\n"


def prometheus_process(plan: Plan) -> Process:
    settings = _settings(plan)
    argv = (PROMETHEUS, f"--config.file={monitoring_dir(plan)}/prometheus.yml",
            f"--storage.tsdb.path={data_dir(plan)}",
            f"--storage.tsdb.retention.time={settings.retention_days}d",
            f"--web.listen-address={_url_host(settings.address)}:{settings.port}",
            "--web.console.templates=/usr/share/prometheus/consoles",
            "--web.console.libraries=/usr/share/prometheus/console_libraries")
    return Process(host=settings.host, argv=argv, env={})


def blackbox_process(plan: Plan) -> Process:
    settings = _settings(plan)
    argv = (BLACKBOX, f"--config.file={monitoring_dir(plan)}/blackbox.yml",
            f"--web.listen-address=127.0.0.1:{settings.blackbox_port}")
    return Process(host=settings.host, argv=argv, env={})


def prometheus_unit(plan: Plan) -> str:
    """shadowline-<deployment>-prometheus.service: hardened like the others, its own data directory; SIGHUP
    (systemctl reload) rereads prometheus.yml and the rules; targets files are reread on change by themselves."""
    return service_unit(f"shadowline {plan.deployment}: Prometheus", prometheus_process(plan), [data_dir(plan)],
                        user=plan.service_user, after=[], restart="on-failure",
                        extra=("ExecReload=/bin/kill -HUP $MAINPID",))


def blackbox_unit(plan: Plan) -> str:
    return service_unit(f"shadowline {plan.deployment}: blackbox exporter (probes NATS for Prometheus)",
                        blackbox_process(plan), [], user=plan.service_user, after=[],
                        restart="on-failure")


def _settings(plan: Plan) -> Monitoring:
    if plan.monitoring is None:
        raise ValueError(f"the plan of {plan.deployment} has no monitoring settings (gms_monitoring)")
    return plan.monitoring


def _group(target: str, **labels: str) -> dict[str, Any]:
    return {"targets": [target], "labels": labels}


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def role_view(plan: Plan) -> dict[str, Any]:
    """Everything the monitoring role writes and starts, for the `shadowline.gms.monitoring` filter."""
    settings = _settings(plan)
    config_dir = monitoring_dir(plan)
    return {
        "mode": settings.mode,
        "host": settings.host,
        "url": prometheus_url(plan),
        "config_dir": config_dir,
        "targets_dir": targets_dir(plan),
        "rules_dir": rules_dir(plan),
        "data_dir": data_dir(plan),
        "targets_files": [{"path": p, "content": c} for p, c in targets_files(plan).items()],
        "server_files": [{"path": f"{config_dir}/prometheus.yml", "content": prometheus_config(plan)},
                         {"path": f"{config_dir}/blackbox.yml", "content": blackbox_config()}],
        "snippet_files": [{"path": f"{config_dir}/scrape-configs.json", "content": scrape_configs_snippet(plan)},
                          {"path": f"{config_dir}/blackbox.yml", "content": blackbox_config()}],
        "units": {
            "prometheus": {"name": plan.unit_name("prometheus"), "content": prometheus_unit(plan)},
            "blackbox": {"name": plan.unit_name("blackbox"), "content": blackbox_unit(plan)},
        },
    }
