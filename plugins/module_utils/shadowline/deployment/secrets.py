"""A deployment's secrets on the Ansible controller (``gms_secrets_dir``) and which of them each host gets.

``ensure_secrets`` creates once, and keeps: etcd passwords for the identities root, agent and dynamo
(cluster/access.py), the engines' EnvironmentFile built from dynamo's password, and the deployment's CA with
every host's NATS certificates (deployment/pki.py). Everything is 0600 in 0700 directories (certificates 0644).
``host_files`` says what to copy where on one host (paths only: a caller never sees a secret). Rotation: delete
the file (or the directory) on the controller and run the playbook again (docs/security.md).
"""

from __future__ import annotations

import os
import secrets as random

from .pki import JWT_KEY, JWT_PUB, _private_dir, _write, ensure_pki
from .plan import ETCD_USERS, Plan


def controller_dir(plan: Plan) -> str:
    if plan.security is None:
        raise ValueError("the plan has no security settings")
    return plan.security.controller_path


def ensure_secrets(plan: Plan) -> list[str]:
    """Create what is missing under the controller directory; the paths written (no content)."""
    root = controller_dir(plan)
    _private_dir(root)
    written: list[str] = []
    for user in ETCD_USERS:
        path = os.path.join(root, f"etcd-{user}.password")
        if not os.path.exists(path):
            _write(path, (random.token_urlsafe(32) + "\n").encode(), 0o600)
            written.append(path)
    env_path = os.path.join(root, "dynamo.env")
    with open(os.path.join(root, "etcd-dynamo.password"), encoding="utf-8") as handle:
        env = f"ETCD_AUTH_USERNAME=dynamo\nETCD_AUTH_PASSWORD={handle.read().strip()}\n"
    if not os.path.exists(env_path) or open(env_path, encoding="utf-8").read() != env:  # noqa: SIM115
        _write(env_path, env.encode(), 0o600)
        written.append(env_path)
    hosts = [(n.host, n.address) for n in plan.nodes + plan.spares]
    infra = [(n.host, n.address) for n in plan.infra.hosts]
    written += ensure_pki(os.path.join(root, "pki"), plan.deployment, hosts, infra, etcd_clients=plan.etcd_tls)
    return written


def host_files(plan: Plan, host: str) -> list[dict[str, str]]:
    """What ``host`` gets: [{src (controller), dest (host), owner, mode}], by what runs there."""
    if plan.security is None:
        return []
    root, dest, user = controller_dir(plan), plan.security.dir, plan.service_user
    pki = os.path.join(root, "pki")
    files = [(os.path.join(pki, "ca.crt"), "ca.crt", "root", "0644"),
             (os.path.join(pki, "hosts", host, "client.crt"), "client.crt", user, "0644"),
             (os.path.join(pki, "hosts", host, "client.key"), "client.key", user, "0600"),
             (os.path.join(pki, "hosts", host, "server.crt"), "server.crt", user, "0644"),  # NATS, the agent
             (os.path.join(pki, "hosts", host, "server.key"), "server.key", user, "0600"),
             (os.path.join(root, "dynamo.env"), "dynamo.env", "root", "0600"),
             (os.path.join(root, "etcd-agent.password"), "etcd-agent.password", "root", "0600")]
    if plan.etcd_tls:  # etcd's clients over TLS: the etcd proxy's, and the agent's and the modules' (root)
        files += [(os.path.join(pki, "hosts", host, "client.pem"), "client.pem", user, "0600"),
                  (os.path.join(pki, "hosts", host, "etcd-client.crt"), "etcd-client.crt", "root", "0644"),
                  (os.path.join(pki, "hosts", host, "etcd-client.key"), "etcd-client.key", "root", "0600")]
    if host in plan.infra_hosts:  # etcd: its root password, and the key pair it signs its auth tokens with
        files += [(os.path.join(root, "etcd-root.password"), "etcd-root.password", "root", "0600"),
                  (os.path.join(pki, JWT_KEY), "etcd-jwt.key", user, "0600"),
                  (os.path.join(pki, JWT_PUB), "etcd-jwt.pub", user, "0644")]
    return [{"src": src, "dest": f"{dest}/{name}", "owner": owner, "mode": mode} for src, name, owner, mode in files]
