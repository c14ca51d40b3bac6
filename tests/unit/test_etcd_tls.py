"""etcd's clients over TLS as the plan renders it, against a real etcd 3.4 on loopback, with a real HAProxy and the
Slurm job's Python proxy (issue #13): the member the plan starts takes only TLS with a client certificate of the
deployment's CA; the agents' and the controller's JSON-gateway clients (cluster/access.py) work with their
certificates without a common name; Dynamo's gRPC reaches etcd through the host's etcd proxy with its own identity
and no more; the proxy checks the member's certificate names the member."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from shadowline.cluster.access import (
    AGENT,
    DYNAMO,
    client_context,
    controller_etcd,
    ensure_etcd_auth,
    etcd_context,
    etcd_for,
    read_secret,
)
from shadowline.common.etcd_client import Etcd, EtcdAuth, EtcdError
from shadowline.common.http import http_get
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan import Plan
from shadowline.deployment.plan_builder import HAPROXY as HAPROXY_KIND
from shadowline.deployment.plan_builder import PYTHON_PROXY, build_plan
from shadowline.deployment.secrets import ensure_secrets, host_files
from shadowline.slurm.watchdog import EtcdSettings, Revoker, Target, revoke_registration
from shadowline.standin.worker import etcd_has_key_suffix
from tests.loopback import ETCD, free_port, start_server, stop_server, wait_until

from .helpers import hostvars

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
REPO = Path(__file__).resolve().parents[2]
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"


@dataclasses.dataclass
class Secured:
    plan: Plan
    endpoint: str
    workdir: Path
    inputs: tuple[dict, list[str]]  # the hostvars and hosts the plan was built from


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
        yield Secured(plan, endpoint, work, (hv, hosts))
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


def start_proxy(secured: Secured, kind: str) -> subprocess.Popen:
    """The plan's etcd proxy of its one host: HAProxy from the plan's configuration (a playbook deployment's), or
    the Python proxy with the plan's argv (a Slurm job's), run by this interpreter."""
    if kind == HAPROXY_KIND:
        proxy = secured.plan.infra.etcd_proxies[0]
        for path, text in proxy.files.items():
            Path(path).write_text(text)
        check = subprocess.run([*proxy.argv, "-c"], capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        return start_server(proxy.argv, secured.workdir / "haproxy.log")
    contract, _problems = parse_contract(*secured.inputs)
    assert contract is not None
    plan = build_plan(contract, state_dir=secured.plan.state_dir, config_dir=secured.plan.config_dir,
                      etcd_proxy=PYTHON_PROXY)
    argv = plan.infra.etcd_proxies[0].argv
    assert argv[1:3] == ("-m", "shadowline.slurm.etcd_proxy") and not plan.infra.etcd_proxies[0].files
    return start_server([sys.executable, *argv[1:]], secured.workdir / "python-proxy.log",
                        env={"PYTHONPATH": str(REPO / "plugins" / "module_utils")})


@pytest.mark.skipif(not os.path.exists(ETCDCTL), reason="no etcdctl")
@pytest.mark.parametrize("kind", [HAPROXY_KIND, PYTHON_PROXY])
def test_dynamos_grpc_reaches_etcd_through_the_hosts_proxy(secured: Secured, kind: str):
    """The plan's etcd proxy, HAProxy (a playbook deployment's host) or the Python proxy (a Slurm job's node):
    etcdctl's gRPC (what Dynamo's client speaks) on the loopback port of Dynamo's ETCD_ENDPOINTS reaches the
    member over TLS, as the engines' identity and no more."""
    if kind == HAPROXY_KIND and not os.path.exists(HAPROXY):
        pytest.skip("no haproxy")
    plan = secured.plan
    proc = start_proxy(secured, kind)
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


@pytest.mark.skipif(not os.path.exists(ETCDCTL), reason="no etcdctl")
def test_the_python_proxy_refuses_a_member_its_certificate_does_not_name(secured: Secured):
    """A route to the member under a host name its certificate does not hold: no connection is carried (the
    proxy says why on stderr), as HAProxy's ``verifyhost`` refuses it."""
    plan, port = secured.plan, free_port()
    member = secured.endpoint.split("//", 1)[1]
    argv = [sys.executable, "-m", "shadowline.slurm.etcd_proxy", "--ca", plan.security.ca,
            "--cert", plan.security.client_pem, "--route", f"{port}=not-the-member@{member}"]
    log = secured.workdir / "wrong-host.log"
    proc = start_server(argv, log, env={"PYTHONPATH": str(REPO / "plugins" / "module_utils")})
    try:
        wait_until(lambda: http_get(f"http://127.0.0.1:{port}/health", 1) is None and "Hostname mismatch" in
                   log.read_text(), 20, what="a refused member")
        put = subprocess.run([ETCDCTL, f"--endpoints=http://127.0.0.1:{port}", "--command-timeout=3s", "put", "k",
                              "v"], capture_output=True, text=True, check=False, timeout=30)
        assert put.returncode != 0
        assert "not-the-member" in log.read_text()
    finally:
        stop_server(proc)


def test_the_python_proxy_names_a_bad_route():
    bad = subprocess.run([sys.executable, "-m", "shadowline.slurm.etcd_proxy", "--ca", "/nonexistent", "--cert", "x",
                          "--route", "23790=member@10.0.0.1"], capture_output=True, text=True, check=False, timeout=30,
                         env={"PYTHONPATH": str(REPO / "plugins" / "module_utils")})
    assert bad.returncode == 2
    assert "--route '23790=member@10.0.0.1': expected PORT=NAME@ADDRESS:PORT" in bad.stderr


def test_the_watchdogs_revocation_client_is_ready_before_a_revocation_is_due(
        secured: Secured, monkeypatch: pytest.MonkeyPatch):
    """A Slurm rank's watchdog revokes its cohort's registration right after it killed a hung rank (or was told
    to stop); until then the frontend routes requests to the dead rank. Its client is made and authenticated when
    the watchdog starts (Revoker.keep_warm): a client made at revocation time first pays a TLS handshake and a
    bcrypt-checked authentication (68-70 ms on the testbed)."""
    plan = secured.plan
    monkeypatch.setenv("ETCD_AUTH_USERNAME", DYNAMO)
    monkeypatch.setenv("ETCD_AUTH_PASSWORD", read_secret(f"{secured.workdir}/controller/etcd-dynamo.password"))
    settings = EtcdSettings(secured.endpoint, plan.security.ca, plan.security.etcd_client_cert,
                            plan.security.etcd_client_key)
    target = Target(leader=True, node_rank=0, engine_id="0", health_url=None, metrics_url=None,
                    address="127.0.0.1", system_port=free_port(), model="m")

    def revocation(revoker: Revoker) -> float:
        started = time.perf_counter()
        assert revoke_registration(target, {free_port()}, revoker) == []  # nothing registered: found none
        return time.perf_counter() - started

    cold = [revocation(Revoker(settings)) for _attempt in range(3)]
    warm = Revoker(settings)
    stop = threading.Event()
    keeper = threading.Thread(target=warm.keep_warm, args=(stop,), daemon=True)
    keeper.start()
    try:
        wait_until(lambda: revocation(warm) < min(cold) / 3 or None, 5, 0.2,
                   what=f"a warm revocation three times faster than a cold one ({min(cold) * 1000:.1f} ms)")
    finally:
        stop.set()
        keeper.join(timeout=5)
    assert not keeper.is_alive()
