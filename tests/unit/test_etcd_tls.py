"""etcd's clients over TLS as the plan renders it, against a real etcd 3.4 and a real HAProxy on loopback
(issue #13): the member the plan starts takes only TLS with a client certificate of the deployment's CA; the
agents' and the controller's JSON-gateway clients (control/access.py) work with their certificates without a
common name; Dynamo's gRPC reaches etcd through the host's etcd proxy with its own identity and no more."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from shadowline.control.access import (
    AGENT,
    DYNAMO,
    client_context,
    controller_etcd,
    ensure_etcd_auth,
    etcd_context,
    etcd_for,
    read_secret,
)
from shadowline.control.etcd_client import Etcd, EtcdAuth, EtcdError
from shadowline.control.http import http_get
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan import Plan, build_plan
from shadowline.deployment.secrets import ensure_secrets, host_files
from shadowline.standin.worker import etcd_has_key_suffix
from tests.loopback import ETCD, free_port, start_server, stop_server, wait_until

from .helpers import hostvars

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"


@dataclasses.dataclass
class Secured:
    plan: Plan
    endpoint: str
    workdir: Path


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """A one-node deployment on 127.0.0.1: the controller's secrets made, the host's share installed where the plan
    says, the plan's own etcd member started and its authentication turned on over TLS."""
    if not os.path.exists(ETCD):
        pytest.skip("no etcd binary")
    work = tmp_path_factory.mktemp("etcd-tls")
    hv, hosts = hostvars(1, gms_engine={"tensor_parallel_size": 8}, gms_secrets_dir=str(work / "controller"),
                         gms_ports={"etcd_client": free_port(), "etcd_peer": free_port(), "etcd_proxy": free_port()})
    hv[hosts[0]]["ansible_host"] = "127.0.0.1"
    contract, problems = parse_contract(hv, hosts)
    assert contract is not None, problems
    plan = build_plan(contract, state_dir=str(work / "state"), config_dir=str(work / "config"))
    assert plan.etcd_tls
    ensure_secrets(plan)
    for item in host_files(plan, hosts[0]):
        os.makedirs(os.path.dirname(item["dest"]), exist_ok=True)
        shutil.copyfile(item["src"], item["dest"])
        os.chmod(item["dest"], int(item["mode"], 8))
    os.makedirs(f"{plan.state_dir}/etcd", mode=0o700, exist_ok=True)
    etcd = start_server(plan.infra.etcd[0].argv, work / "etcd.log")
    endpoint = plan.infra.etcd_endpoints
    try:
        context = etcd_context(plan)
        wait_until(lambda: (http_get(f"{endpoint}/health", 1, context) or (0, ""))[0] == 200, 20, what="etcd /health")
        passwords = {user: read_secret(plan.security.password_file(user)) for user in ("root", AGENT)}
        passwords[DYNAMO] = read_secret(f"{work}/controller/etcd-dynamo.password")
        assert "authentication enabled" in ensure_etcd_auth(endpoint, plan.deployment, passwords, context=context)
        yield Secured(plan, endpoint, work)
    finally:
        stop_server(etcd)


def test_the_member_takes_only_tls_with_a_certificate_of_the_deployment(secured: Secured):
    plan, endpoint = secured.plan, secured.endpoint
    assert endpoint.startswith("https://127.0.0.1:")
    assert http_get(endpoint.replace("https://", "http://") + "/health", 2) is None  # plain text: no answer
    assert http_get(f"{endpoint}/health", 2, client_context(plan.security.ca)) is None  # no certificate
    agent = etcd_for(plan)  # the host's etcd client certificate and the agents' password
    assert agent.put(f"/shadowline/{plan.deployment}/slots/0", "ok") > 0
    assert controller_etcd(plan).get(f"/shadowline/{plan.deployment}/slots/0").value == b"ok"
    anonymous = Etcd(endpoint, ssl_context=etcd_context(plan))  # a certificate, no password
    with pytest.raises(EtcdError):
        anonymous.put(f"/shadowline/{plan.deployment}/slots/0", "forged")


def test_the_gateway_refuses_a_certificate_with_a_common_name(secured: Secured):
    """Why the agents and the controller have etcd client certificates without a common name: etcd 3.4's JSON
    gateway refuses a request that presents one while authentication is on (the proxy's has one: gRPC takes it)."""
    plan = secured.plan
    named = client_context(plan.security.ca, plan.security.client_cert, plan.security.client_key)
    password = read_secret(plan.security.password_file(AGENT))
    etcd = Etcd(secured.endpoint, ssl_context=named, auth=EtcdAuth(AGENT, password))
    with pytest.raises(EtcdError, match="CommonName of client"):
        etcd.get("v1/")


def test_a_missing_certificate_is_named(secured: Secured):
    plan = secured.plan
    moved = dataclasses.replace(plan.security, dir=str(secured.workdir / "nowhere"))
    with pytest.raises(EtcdError, match="etcd client certificate .*nowhere/etcd-client.crt.*run the playbook"):
        etcd_for(dataclasses.replace(plan, security=moved), password_file=plan.security.password_file(AGENT))


@pytest.mark.skipif(not (os.path.exists(HAPROXY) and os.path.exists(ETCDCTL)), reason="no haproxy or etcdctl")
def test_dynamos_grpc_reaches_etcd_through_the_hosts_proxy(secured: Secured):
    """The plan's HAProxy configuration, run by HAProxy: etcdctl's gRPC (what Dynamo's client speaks) on the
    loopback port of Dynamo's ETCD_ENDPOINTS reaches the member over TLS, as the engines' identity and no more."""
    plan = secured.plan
    proxy = plan.infra.etcd_proxies[0]
    for path, text in proxy.files.items():
        Path(path).write_text(text)
    check = subprocess.run([*proxy.argv, "-c"], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    proc = start_server(proxy.argv, secured.workdir / "haproxy.log")
    endpoint = plan.cohort(0).ranks[0].process.env["ETCD_ENDPOINTS"]
    assert endpoint == f"http://127.0.0.1:{plan.ports.etcd_proxy}"
    user = f"{DYNAMO}:{read_secret(f'{secured.workdir}/controller/etcd-dynamo.password')}"

    def etcdctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([ETCDCTL, f"--endpoints={endpoint}", "--command-timeout=5s", f"--user={user}", *args],
                              capture_output=True, text=True, check=False, timeout=30)

    try:
        wait_until(lambda: etcdctl("put", "v1/instances/unit", "x").returncode == 0, 20, what="a put through the proxy")
        assert etcdctl("get", "--print-value-only", "v1/instances/unit").stdout.strip() == "x"
        forged = etcdctl("put", f"/shadowline/{plan.deployment}/slots/0", "forged")
        assert forged.returncode != 0 and "permission denied" in forged.stderr, forged
        # the stand-in's anonymous JSON read of discovery: HTTP/1.1 through the gRPC-only proxy is answered with
        # HTTP/2 frames or nothing; "unknown", never an exception (a woken stand-in crashed on BadStatusLine)
        assert all(etcd_has_key_suffix(endpoint, "v1/", "/unit") is None for _unused in range(20))
    finally:
        stop_server(proc)
