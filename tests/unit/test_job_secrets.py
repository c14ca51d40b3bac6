"""A Slurm job's own credentials (slurm/job_secrets.py): what the bundle holds for each node, with which modes, and
what never leaves the supervisor (the CA's key, root's etcd password). The testbed's Slurm job
(tests/slurm/test_slurm_job.py) proves them in use: etcd and NATS refusing clients without them."""

from __future__ import annotations

import glob
import ipaddress
import os
import tarfile
import tempfile

import pytest
from cryptography import x509

from shadowline.deployment.pki import subject_dn
from shadowline.deployment.plan import Plan
from shadowline.slurm.allocation import Node, concrete
from shadowline.slurm.job import build_job_plan, job_context
from shadowline.slurm.job_secrets import make_bundle

SHARED = {
    "gms_deployment": "llama",
    "gms_model": {"id": "shadowline/tiny-llama", "revision": "0123456789abcdef0123456789abcdef01234567",
                  "local_dir": "/scratch/models/tiny-llama"},
    "gms_engine": {"backend": "standin", "tensor_parallel_size": 2, "nnodes": 2},
    "gms_cohorts": 2,
    "gms_python": "/opt/dynamo/venv/bin/python",
    "gms_slurm": {"model_check": False},
}
ADDRESSES = ["10.0.0.1", "10.0.0.2"]


def job_plan(**override) -> Plan:
    plan, _options, problems = build_job_plan({**SHARED, **override}, 2)
    assert plan is not None, problems
    return Plan.from_dict(concrete(plan.to_dict(), [Node(f"gpu-{i}", a) for i, a in enumerate(ADDRESSES)]))


def test_each_node_gets_its_own_certificates_and_the_job_passwords(tmp_path):
    plan = job_plan()
    bundle = tmp_path / "secrets.tar"
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "shadowline-job-secrets-*")))
    passwords = make_bundle(plan, str(bundle))
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "shadowline-job-secrets-*"))) == before, \
        "the scratch directory (the CA's key) is gone"
    assert sorted(passwords) == ["agent", "dynamo", "root"] and len(set(passwords.values())) == 3
    assert os.stat(bundle).st_mode & 0o777 == 0o600
    with tarfile.open(bundle) as tar:
        members = {m.name: m for m in tar.getmembers()}
        for rank, address in enumerate(ADDRESSES):
            files = {name.split("/", 1)[1]: m.mode for name, m in members.items() if name.startswith(f"node-{rank}/")}
            infra = plan.nodes[rank].host in plan.infra_hosts  # the job's etcd: its token signing key pair
            assert files == {"ca.crt": 0o644, "client.crt": 0o644, "client.key": 0o600, "server.crt": 0o644,
                             "server.key": 0o600, "dynamo.env": 0o600, "etcd-agent.password": 0o600,
                             "client.pem": 0o600, "etcd-client.crt": 0o644, "etcd-client.key": 0o600,
                             **({"etcd-jwt.key": 0o600, "etcd-jwt.pub": 0o644} if infra else {})}
            server = x509.load_pem_x509_certificate(tar.extractfile(f"node-{rank}/server.crt").read())
            names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert ipaddress.ip_address(address) in names.get_values_for_type(x509.IPAddress)
            client = x509.load_pem_x509_certificate(tar.extractfile(f"node-{rank}/client.crt").read())
            # the NATS user of the node's engines (nats_identity) is its certificate's subject
            assert client.subject.rfc4514_string() == subject_dn("llama", f"slurm-node-{rank}")
            env = tar.extractfile(f"node-{rank}/dynamo.env").read().decode()
            assert env == f"ETCD_AUTH_USERNAME=dynamo\nETCD_AUTH_PASSWORD={passwords['dynamo']}\n"
            agent = tar.extractfile(f"node-{rank}/etcd-agent.password").read().decode().strip()
            assert agent == passwords["agent"]
        assert not [n for n in members if n.endswith(("ca.key", "etcd-root.password"))]
    again = make_bundle(plan, str(tmp_path / "other.tar"))
    assert not set(again.values()) & set(passwords.values()), "every job its own credentials"


def test_the_script_names_the_files_and_holds_no_secret():
    context, problems = job_context(SHARED, 2)
    assert context is not None, problems
    tasks = {t["name"]: t for t in context["tasks"]}
    secrets_dir = "/tmp/shadowline-llama/config/secrets"
    assert f"tar -xf \"$SL_NODE_DIR/secrets.tar\" -C {secrets_dir} --strip-components=1 \"node-$SLURM_NODEID\"" \
        in tasks["secrets"]["pre"]
    assert [s["name"] for s in context["steps"]][:2] == ["prepare", "secrets"]
    sourcing = f"set -a && . {secrets_dir}/dynamo.env && set +a"
    assert sourcing in tasks["frontend"]["pre"]
    for name in ("cohort_0", "cohort_1"):
        assert all(sourcing in branch["pre"] for branch in tasks[name]["branches"])
    assert not any(sourcing in (tasks[name].get("pre") or []) for name in ("etcd", "nats", "gms"))
    text = repr(context)
    assert "ETCD_AUTH_PASSWORD" not in text and "NATS_TLS_CLIENT_KEY_PATH" in text


def test_insecure_jobs_have_no_credentials():
    context, _problems = job_context({**SHARED, "gms_insecure": True}, 2)
    assert context is not None
    assert "secrets" not in [t["name"] for t in context["tasks"]] + [s["name"] for s in context["steps"]]
    assert "dynamo.env" not in repr(context) and "NATS_TLS" not in repr(context)
    with pytest.raises(ValueError, match="insecure"):
        make_bundle(job_plan(gms_insecure=True), "/nonexistent/secrets.tar")
