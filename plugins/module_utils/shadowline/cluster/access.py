"""One home for "a client of this deployment": every caller (the agent, the modules, drills, the Slurm side, the
watchdog) gets its etcd connection from here, with the deployment's credentials when it has them; and the TLS
settings of the agents' own endpoint (``/metrics``, ``/health``: TLS with client certificates of the deployment's
CA unless insecure), for the agent, its clients and Prometheus; and a frontend client's TLS (gms_frontend_tls).

etcd runs with role-based access unless the plan is insecure (gms_insecure: true). Identities
(``ensure_etcd_auth`` creates them, idempotently):
  root    etcd's administrator; used only to set up access (its password is on the infra hosts and the controller).
  agent   read-write on the deployment's coordination keys (/shadowline/<deployment>/) and on Dynamo's
          discovery keys (v1/: reading registrations, revoking a dead worker's lease).
  dynamo  the engines and the frontend (ETCD_AUTH_USERNAME/PASSWORD from the units' EnvironmentFile): read-write
          on Dynamo's discovery keys (v1/) only, so an engine cannot forge a slot record.
A client without credentials can read and write nothing. Stdlib only.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
from typing import Any, Callable, Dict, Optional

from ..common.etcd_client import Etcd, EtcdAuth, EtcdError, error_message, prefix_end
from ..common.http import KeptConnections
from ..deployment.plan import Plan

DISCOVERY_PREFIX = "v1/"  # every key Dynamo 1.6.1 writes (instances, model cards, event channels)
AGENT, DYNAMO, ROOT = "agent", "dynamo", "root"


def read_secret(path: str) -> str:
    """A password file's content (one line); OSError naming the file when it cannot be read."""
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip()


def etcd_tls_files(plan: Plan, on_controller: bool = False) -> dict[str, str]:
    """What a client of etcd over TLS needs: the deployment's CA and an etcd client certificate (without a common
    name, pki.py says why) - a host's own or, ``on_controller``, the controller's; {} when etcd is plain."""
    security = plan.security
    if not plan.etcd_tls or security is None:
        return {}
    if on_controller:
        return controller_tls_files(plan, "etcd-client")
    return {"ca": security.ca, "cert": security.etcd_client_cert, "key": security.etcd_client_key}


def controller_tls_files(plan: Plan, certificate: str) -> dict[str, str]:
    """The deployment's CA and one of the controller's client certificates (``client``: NATS, the agents'
    endpoint, the frontend; ``etcd-client``: etcd) in ``gms_secrets_dir`` (deployment/pki.py's layout)."""
    if plan.security is None:
        raise ValueError("the plan has no security settings")
    pki = os.path.join(plan.security.controller_path, "pki")
    return {"ca": os.path.join(pki, "ca.crt"), "cert": os.path.join(pki, "controller", f"{certificate}.crt"),
            "key": os.path.join(pki, "controller", f"{certificate}.key")}


def etcd_context(plan: Plan, on_controller: bool = False) -> ssl.SSLContext | None:
    """The TLS context of a client of the deployment's etcd (None when its clients are plain); EtcdError naming
    the certificate when the files cannot be read."""
    files = etcd_tls_files(plan, on_controller)
    try:
        return files_context(files)
    except (OSError, ssl.SSLError) as err:
        raise EtcdError(f"cannot read the etcd client certificate ({files['cert']}, its key or the CA: "
                        f"{getattr(err, 'strerror', None) or err}); run the playbook again to install the "
                        "deployment's secrets") from None


def etcd_for(plan: Plan, timeout: float = 2.0, *, user: str = AGENT, password_file: str | None = None,
             deadline: float = 3.0, on_controller: bool = False) -> Etcd:
    """The deployment's etcd as ``user`` (the agent's identity by default), password from the host's secrets
    directory (or ``password_file``, e.g. on the controller), over TLS with the host's etcd client certificate
    (the controller's, ``on_controller``); no credentials for an insecure plan. ``timeout`` per endpoint,
    ``deadline`` per call (etcd_client.Etcd)."""
    if not plan.secure or plan.security is None:
        return Etcd(plan.infra.etcd_endpoints, timeout=timeout, deadline=deadline)
    context = etcd_context(plan, on_controller)
    path = password_file or plan.security.password_file(user)
    try:
        password = read_secret(path)
    except OSError as err:
        raise EtcdError(f"cannot read the etcd password of user {user} ({path}: {err.strerror or err}); "
                        "this host holds no copy of the deployment's secrets: run the playbook again to install "
                        "them, or for a Slurm job, run this on one of the job's nodes") from None
    return Etcd(plan.infra.etcd_endpoints, timeout=timeout, deadline=deadline, ssl_context=context,
                auth=EtcdAuth(user, password))


# An operator's calls (a playbook's module, the CLI, status, a drill's reads) each from a fresh client: a TLS
# handshake and an authentication before the first answer, under whatever load the cluster has. More patient than
# the agents' 2 s on their kept connections, which a loaded etcd exceeded (CI, 2026-11-29: status.yml printed
# "failover: unknown" while the agents ran on).
OPERATOR_TIMEOUT_S = 5.0  # per endpoint
OPERATOR_DEADLINE_S = 8.0  # per call


def operator_etcd(plan: Plan) -> Etcd:
    """The deployment's etcd for an operator's action on a host (etcd_for, at the operator's patience)."""
    return etcd_for(plan, OPERATOR_TIMEOUT_S, deadline=OPERATOR_DEADLINE_S)


def controller_etcd(plan: Plan, timeout: float = 2.0, deadline: float = 3.0, user: str = AGENT) -> Etcd:
    """The deployment's etcd from the Ansible controller (benchmarks, tests): the agents' identity by default
    (``root`` for maintenance such as defragmenting), its password from ``gms_secrets_dir`` where
    ``shadowline.gms.secrets`` keeps it."""
    if not plan.secure or plan.security is None:
        return etcd_for(plan, timeout, deadline=deadline)
    password_file = os.path.join(plan.security.controller_path, f"etcd-{user}.password")
    return etcd_for(plan, timeout, user=user, password_file=password_file, deadline=deadline, on_controller=True)


def etcd_from_env(timeout: float = 2.0, environ: dict[str, str] | None = None, endpoints: str | None = None,
                  context: ssl.SSLContext | None = None) -> Etcd | None:
    """etcd as a Dynamo process of this node (ETCD_AUTH_USERNAME/PASSWORD) at its ETCD_ENDPOINTS, or at
    ``endpoints`` over TLS with ``context`` (its ETCD_ENDPOINTS may be the host's etcd proxy, which carries gRPC
    only); None without endpoints."""
    env = os.environ if environ is None else environ
    endpoints = endpoints or env.get("ETCD_ENDPOINTS", "")
    if not endpoints.strip():
        return None
    user, password = env.get("ETCD_AUTH_USERNAME"), env.get("ETCD_AUTH_PASSWORD")
    return Etcd(endpoints, timeout=timeout, ssl_context=context,
                auth=EtcdAuth(user, password) if user and password else None)


# -- setting up access (the etcd role, on one infra host) ------------------------------------------------------ #

Post = Callable[[str, Dict[str, Any], Optional[str]], Dict[str, Any]]  # (path, body, token) -> etcd's answer


def _poster(endpoint: str, timeout: float, context: ssl.SSLContext | None) -> Post:
    """POSTs to one member's JSON gateway (``context``: its TLS, etcd_context) over one kept-alive connection,
    with root's token where given; EtcdError with etcd's own message when refused or unanswered."""
    connections = KeptConnections(context)
    origin = endpoint.rstrip("/")

    def post(path: str, body: dict[str, Any], token: str | None) -> dict[str, Any]:
        headers = {"Content-Type": "application/json", **({"Authorization": token} if token else {})}
        try:
            status, payload = connections.post(origin, path, json.dumps(body).encode(), headers, timeout)
        except (OSError, http.client.HTTPException) as err:
            raise EtcdError(f"etcd at {endpoint} did not answer {path}: {err}", endpoint) from None
        if status >= 400:
            message = error_message(payload).get("message") or http.client.responses.get(status, "")
            raise EtcdError(f"etcd at {endpoint} refused {path}: {message} (HTTP {status})", endpoint)
        return json.loads(payload or b"{}")

    return post


def _b64(data: str | bytes) -> str:
    import base64  # noqa: PLC0415

    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode("ascii")


def _authenticates(post: Post, user: str, password: str) -> bool:
    """Does etcd take this user's password as it is?"""
    try:
        post("/v3/auth/authenticate", {"name": user, "password": password}, None)
    except EtcdError:
        return False
    return True


def _role_grants(post: Post, role: str, token: str | None) -> set[tuple[str, str]]:
    """The (key, range_end) of the role's read-write permissions, base64 as etcd's JSON gateway gives them."""
    perms = post("/v3/auth/role/get", {"role": role}, token).get("perm") or []
    return {(p.get("key", ""), p.get("range_end", "")) for p in perms if p.get("permType") == "READWRITE"}


def _user_roles(post: Post, user: str, token: str | None) -> set[str]:
    return set(post("/v3/auth/user/get", {"name": user}, token).get("roles") or [])


def role_permissions(deployment: str) -> dict[str, list[str]]:
    """Each role's read-write key prefixes."""
    return {AGENT: [f"/shadowline/{deployment}/", DISCOVERY_PREFIX], DYNAMO: [DISCOVERY_PREFIX]}


def ensure_etcd_auth(endpoint: str, deployment: str, passwords: dict[str, str], timeout: float = 5.0,
                     context: ssl.SSLContext | None = None) -> list[str]:
    """Users root, agent and dynamo with their roles and passwords, then authentication on; what changed.

    Idempotent: when authentication is already on, root's token is used to bring users, passwords and
    permissions to what they must be (a rotated password is set again). ``passwords`` maps user to password;
    ``context``: the TLS of an https:// endpoint (etcd_context).
    """
    changed: list[str] = []
    post = _poster(endpoint, timeout, context)
    try:
        token = post("/v3/auth/authenticate", {"name": ROOT, "password": passwords[ROOT]}, None)["token"]
        enabled = True
    except EtcdError as err:
        if "authentication is not enabled" not in str(err):
            raise
        token, enabled = None, False
    users = set(post("/v3/auth/user/list", {}, token).get("users") or [])
    roles = set(post("/v3/auth/role/list", {}, token).get("roles") or [])
    for user in (ROOT, AGENT, DYNAMO):
        if user not in users:
            post("/v3/auth/user/add", {"name": user, "password": passwords[user]}, token)
            changed.append(f"user {user}")
        elif user != ROOT or not enabled:
            # only a password that differs: etcd drops every token of a user whose password is set, even to the
            # same value, and a Dynamo runtime holding one (a parked shadow) then fails to register at its wake
            if not (enabled and _authenticates(post, user, passwords[user])):
                post("/v3/auth/user/changepw", {"name": user, "password": passwords[user]}, token)
    # grants only where missing: each one is a change of etcd's auth store (its auth revision), which makes etcd
    # refuse requests under the older revision, for a moment, to every client
    if ROOT not in roles:
        post("/v3/auth/role/add", {"name": ROOT}, token)
    if ROOT not in _user_roles(post, ROOT, token):
        post("/v3/auth/user/grant", {"user": ROOT, "role": ROOT}, token)
        changed.append(f"user {ROOT}: role {ROOT}")
    for role, prefixes in role_permissions(deployment).items():
        name = f"shadowline-{role}"
        granted: set[tuple[str, str]] = set()
        if name not in roles:
            post("/v3/auth/role/add", {"name": name}, token)
            changed.append(f"role {name}")
        else:
            granted = _role_grants(post, name, token)
        for prefix in prefixes:
            if (_b64(prefix), _b64(prefix_end(prefix))) not in granted:
                post("/v3/auth/role/grant", {"name": name, "perm": {
                    "permType": "READWRITE", "key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}},
                    token)
                changed.append(f"role {name}: {prefix}")
        if name not in _user_roles(post, role, token):
            post("/v3/auth/user/grant", {"user": role, "role": name}, token)
            changed.append(f"user {role}: role {name}")
    if not enabled:
        post("/v3/auth/enable", {}, None)
        changed.append("authentication enabled")
    return changed


# -- the agents' endpoint ------------------------------------------------------------------------------------ #

def agent_url(plan: Plan, host: str) -> str:
    """The base URL of ``host``'s agent endpoint: https unless the plan is insecure."""
    scheme = "https" if plan.secure else "http"
    return f"{scheme}://{plan.gpu_node(host).address}:{plan.ports.agent_metrics}"


def agent_server_context(plan: Plan) -> ssl.SSLContext | None:
    """The agent endpoint's TLS: the node's server certificate, a client certificate of the deployment's CA
    required of every client (Prometheus, the agent role's wait, tests); None when insecure (plain HTTP)."""
    if not plan.secure or plan.security is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=plan.security.ca)
    context.load_cert_chain(plan.security.server_cert, plan.security.server_key)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def agent_client_context(plan: Plan) -> ssl.SSLContext | None:
    """The TLS context of a host's client of the other agents' endpoints (failure notices): its own client
    certificate; None when the plan is insecure."""
    return files_context(host_tls_files(plan))


def host_tls_files(plan: Plan) -> dict[str, str]:
    """The client TLS files every host of the deployment has (the CA, its client certificate and key); {} when the
    plan is insecure."""
    security = plan.security
    if not plan.secure or security is None:
        return {}
    return {"ca": security.ca, "cert": security.client_cert, "key": security.client_key}


def client_context(ca: str, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """A client of the deployment's TLS endpoints: trusts its CA, presents ``cert`` when given; the host name is
    checked against the certificate's addresses."""
    context = ssl.create_default_context(cafile=ca)
    if cert:
        context.load_cert_chain(cert, key)
    return context


def files_context(files: dict[str, str]) -> ssl.SSLContext | None:
    """client_context of the files a ``*_tls_files`` gives (the CA, a certificate and its key); None for {}."""
    return client_context(files["ca"], files["cert"], files["key"]) if files else None


# -- the frontend (gms_frontend_tls) ------------------------------------------------------------------------- #

def frontend_tls_files(plan: Plan, on_controller: bool = False) -> dict[str, str]:
    """What a client of the frontend needs when it is HTTPS (gms_frontend_tls): the deployment's CA and a client
    certificate (presented always, required with ``mutual``) - a host's own (the agent's canary, the roles'
    waits) or the controller's (drills, status); {} when the frontend is plain HTTP."""
    security = plan.security
    if security is None or not security.frontend_https:
        return {}
    if on_controller:
        return controller_tls_files(plan, "client")
    return host_tls_files(plan)


def frontend_context(plan: Plan, on_controller: bool = False) -> ssl.SSLContext | None:
    """The TLS context of a client of the frontend (None when it is plain HTTP)."""
    return files_context(frontend_tls_files(plan, on_controller))
