"""Secure by default (issue #13), without a testbed: what the plan and the units say about credentials, the
controller's secrets (modes, what each host gets, nothing secret in a plan or unit), the opt-out, and the units'
`systemd-analyze security` exposure."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from shadowline.deployment import units
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan import Plan
from shadowline.deployment.plan_builder import PYTHON_PROXY, REQUEST_PLANE_IDLE_TTL_S, build_plan
from shadowline.deployment.ports import port_uses
from shadowline.deployment.secrets import ensure_secrets, host_files

from .helpers import hostvars


def plan_of(tmp_path: Path | None = None, nodes: int = 2, **shared) -> Plan:
    if tmp_path is not None:
        shared.setdefault("gms_secrets_dir", str(tmp_path / "secrets"))
    hv, hosts = hostvars(nodes, gms_engine={"tensor_parallel_size": 8 * nodes}, **shared)
    contract, problems = parse_contract(hv, hosts)
    assert not problems, problems
    return build_plan(contract)


def all_units(plan: Plan) -> dict[str, str]:
    host = plan.hosts[0]
    return {"etcd": units.etcd_unit(plan, host), "nats": units.nats_unit(plan, host),
            "frontend": units.frontend_unit(plan), "gms": units.gms_unit(plan, host),
            "agent": units.agent_unit(plan, host),
            "engine": units.engine_template(plan) + "\n" + units.engine_dropin(plan, host, 0)}


def test_secure_by_default():
    plan = plan_of()
    assert plan.secure and plan.security is not None
    assert plan.security.controller_dir == "~/.shadowline/secrets/llama"
    env = plan.cohort(0).ranks[0].process.env
    assert env["NATS_SERVER"].startswith("tls://") and env["NATS_TLS_CA_CERT_PATH"] == plan.security.ca
    assert "ETCD_AUTH_PASSWORD" not in env and "ETCD_AUTH_PASSWORD" not in plan.infra.frontend.env
    nats_conf = next(iter(plan.infra.nats[0].files.values()))
    assert f'ca_file: "{plan.security.ca}", verify_and_map: true' in nats_conf  # clients: a user per certificate
    assert f'ca_file: "{plan.security.ca}", verify: true' not in nats_conf  # one infra host: no routes
    text = all_units(plan)
    assert f"EnvironmentFile={plan.security.dynamo_env}" in text["frontend"]
    assert f"EnvironmentFile={plan.security.dynamo_env}" in text["engine"]
    assert Plan.from_dict(plan.to_dict()) == plan


def test_the_request_plane_client_drops_a_dead_workers_connection():
    """Dynamo 1.6.1's request-plane client over TLS spins on a dead worker's connection until its pool is dropped
    as idle (300 s by default): the frontend and the engines get REQUEST_PLANE_IDLE_TTL_S; plain TCP does not
    need it (tests/e2e/test_drills.py measures the frontend after the drills)."""
    plan = plan_of()
    for env in (plan.infra.frontend.env, plan.cohort(1).ranks[0].process.env):
        assert env["DYN_TCP_HOST_IDLE_TTL_SECS"] == str(REQUEST_PLANE_IDLE_TTL_S) == "3"
    assert "DYN_TCP_HOST_IDLE_TTL_SECS" not in plan_of(gms_insecure=True).infra.frontend.env


def test_insecure_is_an_explicit_opt_out():
    plan = plan_of(gms_insecure=True)
    assert not plan.secure
    env = plan.cohort(0).ranks[0].process.env
    assert env["NATS_SERVER"].startswith("nats://") and "NATS_TLS_CA_CERT_PATH" not in env
    assert "EnvironmentFile" not in all_units(plan)["frontend"]
    assert "tls {" not in next(iter(plan.infra.nats[0].files.values()))


@pytest.mark.parametrize("value, ok", [("/srv/secrets/x", True), ("~/.shadowline/x", True), ("relative", False),
                                       ("/a b", False), (7, False)])
def test_secrets_dir_is_checked(value, ok):
    hv, hosts = hostvars(1, gms_secrets_dir=value)
    _unused, problems = parse_contract(hv, hosts)
    assert [p.field for p in problems] == ([] if ok else ["gms_secrets_dir"])
    if not ok:
        assert "outside any checkout" in problems[0].fix


def test_secrets_are_private_and_never_in_the_plan_or_a_unit(tmp_path: Path):
    plan = plan_of(tmp_path, nodes=3)
    written = ensure_secrets(plan)
    assert ensure_secrets(plan) == []  # kept
    root = tmp_path / "secrets"
    for path in map(Path, written):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o644 if path.suffix in (".crt", ".pub") else 0o600), (path, oct(mode))
    for directory in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    secrets = [p.read_text().strip() for p in root.rglob("*.password")]
    secrets += [p.read_text() for p in root.rglob("*.key")]
    # passwords; CA key; 3 client keys; the controller's; 3 server keys; 3 + 1 etcd client keys (hosts, controller);
    # etcd's token signing key
    assert len(secrets) == 3 + 1 + 3 + 1 + 3 + 4 + 1
    rendered = str(plan.to_dict()) + "".join(all_units(plan).values())
    assert not [s for s in secrets if s.strip() in rendered]
    files = {f["dest"].rsplit("/", 1)[1]: f for f in host_files(plan, "node0")}
    assert files["client.key"]["owner"] == plan.service_user and files["client.key"]["mode"] == "0600"
    assert files["etcd-root.password"]["owner"] == "root" and "server.key" in files  # node0 is the infra host
    node1 = {f["dest"].rsplit("/", 1)[1] for f in host_files(plan, "node1")}
    assert "etcd-root.password" not in node1 and "server.key" in node1  # every node: the agent's endpoint
    # etcd's token signing key: the infra host's etcd (its service user) alone
    assert (files["etcd-jwt.key"]["owner"], files["etcd-jwt.key"]["mode"]) == (plan.service_user, "0600")
    assert "etcd-jwt.pub" in files and not {"etcd-jwt.key", "etcd-jwt.pub"} & node1


def test_etcd_client_certificates_only_where_etcds_clients_use_tls(tmp_path: Path):
    """A plan of a collection from before etcd's client TLS (etcd's clients plain) gets no etcd client certificates
    and no proxy file."""
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16}, gms_secrets_dir=str(tmp_path / "tls"))
    contract, _unused = parse_contract(hv, hosts)
    assert contract is not None
    with_tls = [os.path.basename(p) for p in ensure_secrets(build_plan(contract))]
    assert with_tls.count("etcd-client.key") == 3 and with_tls.count("client.pem") == 2  # 2 hosts, the controller
    contract = dataclasses.replace(contract, secrets_dir=str(tmp_path / "plain"))
    older = build_plan(contract)
    older = dataclasses.replace(older, security=dataclasses.replace(older.security, etcd_tls=False))
    plain = [os.path.basename(p) for p in ensure_secrets(older)]
    assert "client.key" in plain and not {"etcd-client.crt", "etcd-client.key", "client.pem"} & set(plain)


def test_a_host_certificate_follows_its_address(tmp_path: Path):
    plan = plan_of(tmp_path)
    ensure_secrets(plan)
    moved = plan_of(tmp_path, **{})  # same addresses: nothing to do
    assert ensure_secrets(moved) == []
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16}, gms_secrets_dir=str(tmp_path / "secrets"))
    hv["node1"]["ansible_host"] = "198.18.0.99"
    contract, _unused = parse_contract(hv, hosts)
    again = ensure_secrets(build_plan(contract))
    # client and server (certificate and key), and the client's in one file for the etcd proxy
    assert sorted(os.path.basename(os.path.dirname(p)) for p in again) == ["node1"] * 5


def test_a_certificate_of_another_deployment_is_issued_again(tmp_path: Path):
    """One gms_secrets_dir used by two deployments (Molecule's scenarios do): the hosts' certificates follow the
    deployment whose plan runs, since their subject is its NATS user; the CA stays."""
    from cryptography import x509

    ensure_secrets(plan_of(tmp_path))
    ca = (tmp_path / "secrets" / "pki" / "ca.crt").read_bytes()
    other = plan_of(tmp_path, gms_deployment="other")
    again = ensure_secrets(other)
    assert any(p.endswith("hosts/node0/client.crt") for p in again), again
    cert = x509.load_pem_x509_certificate((tmp_path / "secrets" / "pki" / "hosts" / "node0" / "client.crt").read_bytes())
    assert cert.subject.rfc4514_string() == "CN=node0.other.shadowline,O=shadowline other"
    assert (tmp_path / "secrets" / "pki" / "ca.crt").read_bytes() == ca
    assert ensure_secrets(other) == []


EXPOSURE_LIMITS = {"etcd": 3.0, "nats": 3.0, "frontend": 3.0, "gms": 3.0, "engine": 4.0, "agent": 5.0}


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_units_exposure(tmp_path: Path):
    """`systemd-analyze security --offline` of every rendered unit within the issue's limits (docs/security.md)."""
    figures = {}
    for name, text in all_units(plan_of()).items():
        path = tmp_path / f"shadowline-x-{name}.service"
        path.write_text(text)
        out = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(path)],
                             capture_output=True, text=True, check=False).stdout
        match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", out)
        if match is None:
            pytest.skip(f"this systemd-analyze has no --offline: {out[-200:]}")
        figures[name] = float(match.group(1))
    assert all(figures[n] <= EXPOSURE_LIMITS[n] for n in figures), figures


def test_firewall_protects_the_deployments_ports_only():
    from shadowline.deployment import firewall

    plan = plan_of()
    node0 = firewall.protected_ports(plan, "node0")
    node1 = firewall.protected_ports(plan, "node1")
    assert {8080, 8081, 8280, 8281, 29500, 29600, 8480} <= set(node1) and 8000 not in node0
    assert {2379, 2380, 4222, 6222} <= set(node0) and 2379 not in node1  # infra ports on the infra host only
    v4, v6 = firewall.allowed_addresses(plan)
    assert v4 == ["127.0.0.0/8", "198.18.0.10", "198.18.0.11"] and v6 == ["::1"]
    rules = firewall.firewall_rules(plan, "node1")
    assert "table inet shadowline_llama {" in rules and "tcp dport @protected drop" in rules
    unit = firewall.firewall_unit(plan, "node1")
    assert "ExecStop=-/usr/sbin/nft delete table inet shadowline_llama" in unit


@pytest.mark.skipif(not shutil.which("nft") or os.geteuid() != 0, reason="needs nft and root")
def test_firewall_rules_pass_nft_check(tmp_path: Path):
    from shadowline.deployment import firewall

    path = tmp_path / "firewall.nft"
    path.write_text(firewall.firewall_rules(plan_of(), "node0"))
    proc = subprocess.run(["nft", "-c", "-f", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(not shutil.which("nats-server"), reason="needs nats-server (bindep)")
@pytest.mark.parametrize("infra", [1, 3])
def test_nats_configuration_with_tls_passes_nats_server_check(tmp_path: Path, infra: int):
    """nats-server's own configuration check (`-t`) accepts what the plan renders, a 3-member cluster with TLS on
    its routes included, with the deployment's real certificates in place."""
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16}, gms_secrets_dir=str(tmp_path / "controller"))
    infra_hosts = [f"infra{i}" for i in range(infra)] if infra > 1 else []
    for i, host in enumerate(infra_hosts):
        hv[host] = {"ansible_host": f"198.18.0.{50 + i}"}
    contract, problems = parse_contract(hv, hosts, infra_hosts)
    assert not problems and contract is not None, problems
    plan = build_plan(contract, state_dir=str(tmp_path / "state"), config_dir=str(tmp_path / "config"))
    ensure_secrets(plan)
    for host in plan.infra_hosts:
        for item in host_files(plan, host):
            Path(item["dest"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(item["src"], item["dest"])
        (path, text), = plan.infra.nats[plan.infra_hosts.index(host)].files.items()
        Path(path).write_text(text)
        proc = subprocess.run(["nats-server", "-c", path, "-t"], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, f"{host}: {proc.stdout}{proc.stderr}\n{text}"


def _nats_session(port: int, ca: Path, cert: Path | None, commands: str = "", user: str | None = None,
                  password: str = "") -> str:
    """A NATS client over TLS with the deployment's CA and ``cert`` (its .crt, beside it its .key; None: no
    certificate): CONNECT (as ``user`` with ``password``, as Dynamo does with the plan's NATS_AUTH_* variables;
    None: no user), ``commands``, PING; what the server answered up to its PONG (or why it refused)."""
    import json
    import socket
    import ssl
    import time

    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    if cert is not None:
        context.load_cert_chain(str(cert), str(cert.with_suffix(".key")))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.recv(4096)  # INFO, in plain text
        try:
            with context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
                connect = {"verbose": False, **({"user": user, "pass": password} if user is not None else {})}
                tls.sendall(f"CONNECT {json.dumps(connect)}\r\n{commands}PING\r\n".encode())
                answer, deadline = b"", time.monotonic() + 5
                while b"PONG" not in answer and b"Authorization" not in answer and time.monotonic() < deadline:
                    data = tls.recv(4096)
                    if not data:
                        break
                    answer += data
                return answer.decode(errors="replace")
        except (ssl.SSLError, OSError) as err:
            return f"refused: {err}"


@pytest.mark.skipif(not shutil.which("nats-server"), reason="needs nats-server (bindep)")
def test_nats_maps_each_hosts_certificate_to_a_user_with_dynamos_subjects_only(tmp_path: Path):
    """The rendered NATS configuration, run by the real nats-server on loopback with the deployment's
    certificates: a host's certificate is its user and may use Dynamo's subjects (its namespace, replies,
    JetStream); a subscription to everything, to the system account or to another namespace, and a publish outside
    them are refused as permission violations; the controller's certificate, of the same CA, is no NATS user."""
    from tests.loopback import free_port, wait_until

    plan = plan_of(tmp_path)
    ensure_secrets(plan)
    pki = tmp_path / "secrets" / "pki"
    (config_path, text), = plan.infra.nats[0].files.items()
    port, monitor = free_port(), free_port()
    text = re.sub(r'listen: "[^"]+"', f'listen: "127.0.0.1:{port}"', text)
    text = re.sub(r'http: "[^"]+"', f'http: "127.0.0.1:{monitor}"', text)
    text = re.sub(r'store_dir: "[^"]+"', f'store_dir: "{tmp_path / "js"}"', text)
    text = text.replace(plan.security.dir, str(pki / "hosts" / plan.infra.hosts[0].host)).replace(
        str(pki / "hosts" / plan.infra.hosts[0].host) + "/ca.crt", str(pki / "ca.crt"))
    config = tmp_path / "nats-server.conf"
    config.write_text(text)
    server = subprocess.Popen(["nats-server", "-c", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        wait_until(lambda: _listening(port), 10, 0.05, f"nats-server on 127.0.0.1:{port}")
        ca, node1 = pki / "ca.crt", pki / "hosts" / "node1" / "client.crt"
        env = plan.cohort(0).ranks[1].process.env  # node1's engine: who it says it is
        dynamos = ("SUB namespace.dynamo.> 1\r\nSUB _INBOX.x.> 2\r\n"
                   "PUB namespace.dynamo.component.backend.kv_metrics 2\r\nok\r\nPUB $JS.API.INFO _INBOX.x.1 0\r\n\r\n")
        allowed = _nats_session(port, ca, node1, dynamos, user=env["NATS_AUTH_USERNAME"])
        assert "PONG" in allowed and "Violation" not in allowed, allowed
        assert "MSG namespace.dynamo.component.backend.kv_metrics 1 2" in allowed, allowed
        outside = "SUB > 1\r\nSUB $SYS.> 2\r\nSUB namespace.other.> 3\r\nPUB shadowline.slots 2\r\nno\r\n"
        refused = _nats_session(port, ca, node1, outside)
        for what in ('Subscription to ">"', 'Subscription to "$SYS.>"', 'Subscription to "namespace.other.>"',
                     'Publish to "shadowline.slots"'):
            assert f"Permissions Violation for {what}" in refused, refused
        controller = _nats_session(port, ca, pki / "controller" / "client.crt")
        assert "Authorization Violation" in controller and "PONG" not in controller, controller
        default = _nats_session(port, ca, node1, user="user", password="user")  # Dynamo 1.6.1 without NATS_AUTH_*
        assert "Authorization Violation" in default and "PONG" not in default, default
        assert "PONG" not in _nats_session(port, ca, None)
    finally:
        server.terminate()
        log = server.communicate(timeout=10)[0]
    assert 'User "CN=node1.llama.shadowline,O=shadowline llama", Subject ">"' in log, log


def _listening(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_dynamo_namespace_follows_the_engines_endpoint():
    """NATS's subjects follow the namespace the engines register in: Dynamo's default, or --endpoint's."""
    from shadowline.deployment.plan_builder import dynamo_namespace

    assert dynamo_namespace(()) == "dynamo"
    assert dynamo_namespace(("--max-model-len", "8192", "--endpoint", "dyn://prod.backend.generate")) == "prod"
    assert dynamo_namespace(("--endpoint=dyn://team-a.backend.generate",)) == "team-a"
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16,
                                        "extra_args": ["--endpoint", "dyn://prod.backend.generate"]})
    contract, problems = parse_contract(hv, hosts)
    assert not problems and contract is not None, problems
    (text,) = build_plan(contract).infra.nats[0].files.values()
    assert '"namespace.prod.>"' in text and "namespace.dynamo" not in text


def test_a_hosts_nats_user_is_its_certificates_subject(tmp_path: Path):
    """The user names in NATS's configuration are exactly the subjects of the certificates the CA issued (RFC 2253,
    as nats-server writes them), for every host; the controller has none."""
    from cryptography import x509

    plan = plan_of(tmp_path, nodes=3)
    ensure_secrets(plan)
    (text,) = plan.infra.nats[0].files.values()
    users = re.findall(r'user: "([^"]+)"', text)
    pki = tmp_path / "secrets" / "pki"
    issued = [x509.load_pem_x509_certificate((pki / "hosts" / h / "client.crt").read_bytes()).subject.rfc4514_string()
              for h in ("node0", "node1", "node2")]
    assert users == issued
    controller = x509.load_pem_x509_certificate((pki / "controller" / "client.crt").read_bytes())
    assert controller.subject.rfc4514_string() not in users
    for rank in plan.cohort(1).ranks:  # every Dynamo client names its own host's user (and no password)
        assert rank.process.env["NATS_AUTH_USERNAME"] == issued[rank.node_rank]
        assert rank.process.env["NATS_AUTH_PASSWORD"] == ""
    assert plan.infra.frontend.env["NATS_AUTH_USERNAME"] == issued[0]
    insecure = plan_of(gms_insecure=True)
    assert "NATS_AUTH_USERNAME" not in insecure.cohort(0).ranks[0].process.env
    assert "authorization" not in next(iter(insecure.infra.nats[0].files.values()))


def test_each_dynamo_client_gets_one_member_of_each_cluster():
    """Dynamo 1.6.1 does not connect to a list of NATS servers and fails calls to a stopped etcd member of a list:
    with 3 infra hosts each cohort gets one member of each (all its ranks the same), spread by cohort number, the
    frontend the first; with TLS or without. The agents keep every member."""
    hv, hosts = hostvars(3, gms_engine={"tensor_parallel_size": 24}, gms_cohorts=3)
    for i in range(3):
        hv[f"infra{i}"] = {"ansible_host": f"198.18.0.{50 + i}"}
    infra = ["infra0", "infra1", "infra2"]
    contract, problems = parse_contract(hv, hosts, infra)
    assert not problems and contract is not None
    plan = build_plan(contract)
    for cohort in range(3):
        envs = [r.process.env for r in plan.cohort(cohort).ranks]
        assert {e["NATS_SERVER"] for e in envs} == {f"tls://198.18.0.{50 + cohort}:4222"}
        assert {e["ETCD_ENDPOINTS"] for e in envs} == {f"http://127.0.0.1:{23790 + cohort}"}  # its etcd proxy
    assert plan.infra.frontend.env["NATS_SERVER"] == "tls://198.18.0.50:4222"
    assert plan.infra.frontend.env["ETCD_ENDPOINTS"] == "http://127.0.0.1:23790"
    assert plan.infra.etcd_endpoints.count("https://") == 3
    hv_insecure = {h: {**v, "gms_insecure": True} if h in hosts else v for h, v in hv.items()}
    contract, _unused = parse_contract(hv_insecure, hosts, infra)
    assert contract is not None
    assert build_plan(contract).cohort(1).ranks[0].process.env["NATS_SERVER"] == "nats://198.18.0.51:4222"
    assert build_plan(contract).cohort(1).ranks[0].process.env["ETCD_ENDPOINTS"] == "http://198.18.0.51:2379"


def test_frontend_allow_keeps_the_frontend_to_its_sources(tmp_path: Path):
    """gms_frontend_allow: on the frontend's host its port is for those sources and the deployment's own hosts;
    empty (the default), anyone; a bad entry is refused naming the field."""
    from shadowline.deployment import firewall

    assert "8000" not in firewall.firewall_rules(plan_of(), "node0")
    plan = plan_of(gms_frontend_allow=["10.20.0.0/16", "2001:db8::/32"])
    rules = firewall.firewall_rules(plan, "node0")
    assert "tcp dport 8000 ip saddr { 127.0.0.0/8, 198.18.0.10, 198.18.0.11, 10.20.0.0/16 } accept" in rules
    assert "tcp dport 8000 ip6 saddr { ::1, 2001:db8::/32 } accept" in rules and "tcp dport 8000 drop" in rules
    assert "8000" not in firewall.firewall_rules(plan, "node1")  # not the frontend's host
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16}, gms_frontend_allow=["anywhere"])
    _unused, problems = parse_contract(hv, hosts)
    assert [p.field for p in problems] == ["gms_frontend_allow"] and "CIDR" in str(problems[0])
    if shutil.which("nft") and os.geteuid() == 0:
        path = tmp_path / "firewall.nft"
        path.write_text(rules)
        proc = subprocess.run(["nft", "-c", "-f", str(path)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr


def test_etcd_peers_and_clients_talk_tls_unless_insecure():
    """Peer TLS and client TLS, each with client certificates of the deployment's CA required (three members);
    plain with gms_insecure, and a Slurm job's clients plain (no etcd proxy on its nodes)."""
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16})
    for i in range(3):
        hv[f"infra{i}"] = {"ansible_host": f"198.18.0.{50 + i}"}
    contract, _unused = parse_contract(hv, hosts, ["infra0", "infra1", "infra2"])
    plan = build_plan(contract)
    argv = plan.infra.etcd[1].argv
    assert argv[argv.index("--listen-peer-urls") + 1] == "https://198.18.0.51:2380"
    assert "infra0=https://198.18.0.50:2380" in argv[argv.index("--initial-cluster") + 1]
    assert argv[argv.index("--peer-trusted-ca-file") + 1] == plan.security.ca and "--peer-client-cert-auth" in argv
    assert argv[argv.index("--listen-client-urls") + 1] == "https://198.18.0.51:2379"
    assert argv[argv.index("--advertise-client-urls") + 1] == "https://198.18.0.51:2379"
    assert argv[argv.index("--trusted-ca-file") + 1] == plan.security.ca and "--client-cert-auth" in argv
    assert argv[argv.index("--cert-file") + 1] == plan.security.server_cert
    # signed tokens, valid a year on every member and across restarts: a shadow parked for weeks, or across an etcd
    # restart, still wakes (etcd's default simple tokens die unused after 300 s, and with the member)
    token = dict(o.split("=", 1) for o in argv[argv.index("--auth-token") + 1].split(",")[1:])
    assert argv[argv.index("--auth-token") + 1].startswith("jwt,") and token["sign-method"] == "ES256"
    assert (token["pub-key"], token["priv-key"]) == (plan.security.etcd_jwt_pub, plan.security.etcd_jwt_key)
    assert int(token["ttl"].rstrip("s")) >= 30 * 24 * 3600
    insecure = build_plan(parse_contract({h: {**v, "gms_insecure": True} if h in hosts else v for h, v in hv.items()},
                                         hosts, ["infra0", "infra1", "infra2"])[0])
    assert "--peer-client-cert-auth" not in insecure.infra.etcd[1].argv
    assert "--client-cert-auth" not in insecure.infra.etcd[1].argv and not insecure.infra.etcd_proxies
    assert insecure.infra.etcd_endpoints.count("http://") == 3
    job = build_plan(contract, etcd_proxy=PYTHON_PROXY)  # a Slurm job's: etcd over TLS, the job's own proxy
    assert job.secure and job.etcd_tls and "--client-cert-auth" in job.infra.etcd[1].argv
    assert job.infra.etcd_endpoints.count("https://") == 3
    assert job.cohort(1).ranks[0].process.env["ETCD_ENDPOINTS"] == "http://127.0.0.1:23791"
    proxy = job.infra.etcd_proxies[0]
    assert proxy.argv[1:] == ("-m", "shadowline.slurm.etcd_proxy", "--ca", job.security.ca,
                              "--cert", job.security.client_pem, "--route", "23790=infra0@198.18.0.50:2379",
                              "--route", "23791=infra1@198.18.0.51:2379", "--route", "23792=infra2@198.18.0.52:2379")
    assert not proxy.files and [p.host for p in job.infra.etcd_proxies] == [*hosts, "infra0", "infra1", "infra2"]


def test_every_host_gets_an_etcd_proxy_to_every_member():
    """Dynamo's processes reach etcd through their host's HAProxy: on loopback a port per member, TLS to the
    member with the host's client certificate and ALPN h2 (etcd's gRPC wants it), the member's certificate
    checked against the deployment's CA and its host name. Its unit runs as the service user, hardened; the
    engines and the frontend want it."""
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16})
    for i in range(3):
        hv[f"infra{i}"] = {"ansible_host": f"198.18.0.{50 + i}"}
    contract, _unused = parse_contract(hv, hosts, ["infra0", "infra1", "infra2"])
    plan = build_plan(contract)
    assert [p.host for p in plan.infra.etcd_proxies] == [*hosts, "infra0", "infra1", "infra2"]
    proxy = plan.infra.etcd_proxies[1]
    (path, config), = proxy.files.items()
    assert proxy.argv == ("/usr/sbin/haproxy", "-db", "-f", path) and path == f"{plan.config_dir}/etcd-proxy.cfg"
    for i in range(3):
        assert f"    bind 127.0.0.1:{23790 + i}\n" in config
        assert (f"server member-{i} 198.18.0.{50 + i}:2379 ssl verify required ca-file {plan.security.ca} "
                f"crt {plan.security.client_pem} alpn h2 verifyhost infra{i}\n") in config
    assert "bind 0.0.0.0" not in config and "bind *" not in config
    unit = units.etcd_proxy_unit(plan, hosts[1])
    assert f"User={plan.service_user}" in unit and "CapabilityBoundingSet=\n" in unit
    assert f"Wants=network-online.target {plan.unit_name('gms')} {plan.unit_name('etcd-proxy')}" in \
        units.engine_template(plan)
    assert f"Wants={plan.unit_name('etcd-proxy')}" in units.frontend_unit(plan)
    assert {use.port for use in port_uses(plan.ports, 2) if use.field == "gms_ports.etcd_proxy"} == {23790, 23791, 23792}


# -- gms_frontend_tls ----------------------------------------------------------------------------------------- #

@pytest.mark.parametrize("mode", ["plain", "tls", "mutual"])
def test_frontend_tls_renders_dynamos_https_options(mode: str):
    """plain: http:// and no DYN_TLS_*; tls: https:// with the frontend host's server certificate; mutual: also
    the deployment's CA as the client CA. Monitoring scrapes the frontend the same way."""
    from shadowline.deployment.monitoring import scrape_configs

    plan = plan_of(gms_frontend_tls=mode)
    env, security = plan.infra.frontend.env, plan.security
    assert plan.infra.frontend_url.startswith("http://" if mode == "plain" else "https://")
    assert ("DYN_TLS_CERT_PATH" in env) == (mode != "plain")
    assert env.get("DYN_TLS_CLIENT_CA_CERT_PATH") == (security.ca if mode == "mutual" else None)
    if mode != "plain":
        assert env["DYN_TLS_CERT_PATH"] == security.server_cert and env["DYN_TLS_KEY_PATH"] == security.server_key
    job = next(c for c in scrape_configs(plan) if c["job_name"] == "shadowline-frontend")
    assert job.get("scheme", "http") == ("http" if mode == "plain" else "https")
    assert Plan.from_dict(plan.to_dict()) == plan


@pytest.mark.parametrize(("shared", "words"), [
    ({"gms_frontend_tls": "on"}, "not one of plain, tls, mutual"),
    ({"gms_frontend_tls": False}, "not one of plain, tls, mutual"),  # an unquoted YAML off
    ({"gms_frontend_tls": "tls", "gms_insecure": True}, "gms_insecure"),
    ({"gms_frontend_tls": "mutual", "gms_frontend_bind": "198.18.0.77"}, "does not name"),
])
def test_frontend_tls_refusals_name_the_field(shared: dict, words: str):
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16}, **shared)
    contract, problems = parse_contract(hv, hosts)
    assert contract is None and [p.field for p in problems] == ["gms_frontend_tls"], problems
    assert words in str(problems[0])


def test_a_slurm_job_refuses_frontend_tls():
    from shadowline.slurm.job import job_context

    model = {"id": "meta-llama/Llama-3.3-70B-Instruct", "revision": "0123456789abcdef0123456789abcdef01234567"}
    shared = {"gms_deployment": "llama", "gms_model": model, "gms_frontend_tls": "tls",
              "gms_engine": {"backend": "dynamo_vllm", "tensor_parallel_size": 8, "gpus_per_node": 8}}
    context, problems = job_context(shared)
    assert context is None and [p.field for p in problems] == ["gms_frontend_tls"], problems


def test_a_frontend_client_speaks_mutual_tls_with_the_deployments_certificates(tmp_path: Path):
    """A real HTTPS server with the frontend host's certificate that requires a client certificate of the CA
    (what Dynamo's frontend does with gms_frontend_tls: mutual): the controller's context (frontend_context,
    the drills' load) is served; a client with only the CA is refused in the handshake."""
    import http.server
    import ssl
    import threading

    from shadowline.cluster.access import client_context, frontend_context, frontend_tls_files
    from shadowline.common.frontend import completion_body, send

    pytest.importorskip("cryptography")
    plan = plan_of(tmp_path, gms_frontend_tls="mutual")
    ensure_secrets(plan)
    pki = tmp_path / "secrets" / "pki" / "hosts" / plan.infra.frontend.host
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tmp_path / "secrets" / "pki" / "ca.crt"))
    server_context.load_cert_chain(str(pki / "server.crt"), str(pki / "server.key"))
    server_context.verify_mode = ssl.CERT_REQUIRED

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"choices": [{"message": {"content": "ok"}}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = server_context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}"
        files = frontend_tls_files(plan, on_controller=True)
        assert files["cert"].endswith("pki/controller/client.crt") and os.path.exists(files["key"])
        served = send(url, completion_body(plan.model_id), 5.0, 0, frontend_context(plan, on_controller=True))
        assert served.ok and served.status == 200, served
        anonymous = send(url, completion_body(plan.model_id), 5.0, 0, client_context(files["ca"]))  # the CA only
        assert not anonymous.ok and anonymous.status == 0, anonymous
        plain = send(url.replace("https", "http"), completion_body(plan.model_id), 5.0, 0)
        assert not plain.ok, plain
    finally:
        server.shutdown()
        server.server_close()
    assert frontend_tls_files(plan_of(), on_controller=True) == {}


def test_a_silent_frontend_is_not_blamed_on_the_engine():
    """frontend.unanswering (asked before every canary): a server that takes the connection and never answers
    (a TLS frontend that a plain-HTTP client reaches) is silent; one that answers anything, even 404, is not."""
    import socket
    import threading

    from shadowline.common.frontend import unanswering

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # accepts connections (the kernel's backlog) and never answers
    answering = socket.socket()
    answering.bind(("127.0.0.1", 0))
    answering.listen(4)

    def answer_404() -> None:
        conn, _addr = answering.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    threading.Thread(target=answer_404, daemon=True).start()
    try:
        reason = unanswering(f"http://127.0.0.1:{silent.getsockname()[1]}", 0.3)
        assert reason is not None and "/live" in reason
        assert unanswering(f"http://127.0.0.1:{answering.getsockname()[1]}", 2.0) is None
    finally:
        silent.close()
        answering.close()


def test_an_answer_that_is_not_http_is_an_error_not_an_exception():
    """Plain HTTP to a TLS frontend gets TLS bytes back: the completion is a failed request and the frontend
    counts as silent; neither raises (a probe thread that raised died unheard, and its silence read as a hang)."""
    import socket
    import threading

    from shadowline.common.frontend import completion_body, send, unanswering

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def tls_alert() -> None:
        for _attempt in range(2):
            conn, _addr = server.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"\x15\x03\x03\x00\x02\x02\x46")  # a TLS alert record, then close

    threading.Thread(target=tls_alert, daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    try:
        answer = send(url, completion_body("m"), 2.0)
        assert not answer.ok and answer.status == 0 and answer.error, answer
        assert unanswering(url, 2.0) is not None
    finally:
        server.close()
