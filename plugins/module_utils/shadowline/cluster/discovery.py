"""Dynamo's discovery records in etcd: who is registered, which cohort a registration belongs to, fencing.

What a Dynamo 1.6.1 worker (``dynamo.vllm``, or ``dynamo.mocker`` behind the stand-in) writes, all on one
lease whose id is the worker's instance id (measured, see docs/slurm.md):

- ``v1/instances/<ns>/<component>/<endpoint>/<lease hex>``: ``{"type": "Endpoint", "namespace", "component",
  "endpoint", "instance_id": <lease>, "transport": {"tcp": "<host>:<port>/<lease hex>/<ns>/<component>/<endpoint>"}}``
  for ``generate`` and a ``worker_kv_query_source_*`` endpoint. ``<host>`` is ``DYN_TCP_RPC_HOST``; the port
  is chosen by the kernel, so it is in no plan.
- ``v1/mdc/<ns>/<component>/<endpoint>/<lease hex>``: the model card: ``display_name`` (the served model
  name), ``source_path`` (``--model``), and the URLs the frontend downloads the tokenizer and config from,
  ``http://<DYN_SYSTEM_HOST>:<DYN_SYSTEM_PORT>/v1/metadata/...``: the worker's system address.
- ``v1/event_channels/...`` and ``v1/event_sources/...``: its event publishers (NATS subjects).

Which cohort a registration belongs to:

1. A real ``dynamo.vllm`` leader runs its Dynamo worker in-process, so the card's system address is the
   cohort's own ``<leader address>:<system port>`` from the plan, one per cohort: an exact match.
2. The stand-in's worker is a separate ``dynamo.mocker`` with a free system port (20000-28999), so on one
   host the records of two cohorts differ only in kernel-chosen ports. A caller on the leader's node can
   pass the ports its processes listen on (``listening_ports(pids)``), which match the request-plane or
   system port of its registration exactly. Remote callers (the agent) should remember the leases that
   appear when a cohort wakes (``new_registrations``), since only the lock holder is ever registered.

Revoking a lease deletes every key on it at once; the frontend drops the instance a few ms later, and a
live worker whose lease is revoked exits (a clean fence).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..common.etcd_client import KV, Etcd, EtcdError
from ..deployment.plan import Plan

PREFIX = "v1/"
INSTANCES = "v1/instances/"
MODEL_CARDS = "v1/mdc/"


@dataclass
class Registration:
    """One Dynamo worker as discovery sees it: everything hanging on one lease."""

    lease: int
    keys: list[str] = field(default_factory=list)
    namespace: str | None = None
    component: str | None = None
    endpoints: list[str] = field(default_factory=list)  # endpoint names of its v1/instances records
    request_address: str | None = None  # host:port of its TCP request plane
    system_address: str | None = None  # host:port its model card points at (the worker's DYN_SYSTEM_PORT)
    model_name: str | None = None  # the card's display_name: the served model name
    model_path: str | None = None  # the card's source_path: --model
    created_revision: int = 0  # the oldest create_revision of its keys

    @property
    def instance_id(self) -> str:
        """The lease in hex, as Dynamo prints it and as keys end."""
        return f"{self.lease:x}"

    @property
    def host(self) -> str | None:
        address = self.request_address or self.system_address
        return _split(address)[0] if address else None

    @property
    def ports(self) -> set[int]:
        return {p for p in (_split(self.request_address)[1], _split(self.system_address)[1]) if p}

    def to_dict(self) -> dict[str, Any]:
        return {"lease": self.lease, "instance_id": self.instance_id, "keys": list(self.keys),
                "namespace": self.namespace, "component": self.component, "endpoints": list(self.endpoints),
                "request_address": self.request_address, "system_address": self.system_address,
                "model_name": self.model_name, "model_path": self.model_path}


def registrations(etcd: Etcd) -> list[Registration]:
    """Every leased registration under ``v1/``, one per lease, oldest first."""
    by_lease: dict[int, Registration] = {}
    for kv in etcd.get_prefix(PREFIX):
        if not kv.lease:
            continue
        reg = by_lease.setdefault(kv.lease, Registration(lease=kv.lease, created_revision=kv.create_revision))
        reg.keys.append(kv.key)
        reg.created_revision = min(reg.created_revision, kv.create_revision)
        if kv.key.startswith(INSTANCES):
            _read_instance(reg, _json(kv.value))
        elif kv.key.startswith(MODEL_CARDS):
            _read_card(reg, _json(kv.value))
    return sorted(by_lease.values(), key=lambda r: (r.created_revision, r.lease))


def _read_instance(reg: Registration, record: dict[str, Any]) -> None:
    reg.namespace = reg.namespace or record.get("namespace")
    reg.component = reg.component or record.get("component")
    endpoint = record.get("endpoint")
    if endpoint and endpoint not in reg.endpoints:
        reg.endpoints.append(endpoint)
    tcp = (record.get("transport") or {}).get("tcp")
    if isinstance(tcp, str) and (reg.request_address is None or endpoint == "generate"):
        reg.request_address = tcp.split("/", 1)[0]


def _read_card(reg: Registration, record: dict[str, Any]) -> None:
    reg.namespace = reg.namespace or record.get("namespace")
    reg.component = reg.component or record.get("component")
    card = record.get("card_json") or {}
    reg.model_name = card.get("display_name") or reg.model_name
    reg.model_path = card.get("source_path") or reg.model_path
    for url in _urls(card):
        parts = urlsplit(url)
        if parts.scheme in ("http", "https") and parts.hostname and parts.port:
            host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
            reg.system_address = f"{host}:{parts.port}"
            return


def _urls(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _urls(item)
    elif isinstance(value, list):
        for item in value:
            yield from _urls(item)
    elif isinstance(value, str) and value.startswith(("http://", "https://")):
        yield value


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _split(address: str | None) -> tuple[str | None, int | None]:
    if not address:
        return None, None
    host, _unused, port = address.rpartition(":")
    return host.strip("[]"), int(port) if port.isdigit() else None


# -- cohorts -------------------------------------------------------------------------------------------- #

def cohort_registrations(etcd: Etcd, plan: Plan, cohort: int,
                         ports: Iterable[int] = ()) -> list[Registration]:
    """The registrations of ``cohort``'s leader.

    A registration matches when its host is the cohort leader's address and either its card names the
    cohort's system port (the real dynamo.vllm: exact), or one of its ports is in ``ports`` (the ports the
    leader's processes listen on, for callers on that node: exact for the stand-in too). Registrations of
    another model are never matched.
    """
    entry = plan.cohort(cohort)
    return worker_registrations(etcd, entry.leader.address, entry.ports.system, ports, plan.model_id)


def worker_registrations(etcd: Etcd, address: str, system_port: int | None = None, ports: Iterable[int] = (),
                         model: str | None = None) -> list[Registration]:
    """Registrations of the worker at ``address`` whose card names ``system_port`` or that use one of ``ports``."""
    wanted_ports = set(ports)
    found = []
    for reg in registrations(etcd):
        if reg.host != address or (model and reg.model_name and reg.model_name != model):
            continue
        if (system_port and reg.system_address == f"{address}:{system_port}") or reg.ports & wanted_ports:
            found.append(reg)
    return found


def new_registrations(before: Iterable[Registration], after: Iterable[Registration]) -> list[Registration]:
    """Registrations in ``after`` whose lease was not in ``before``: what a cohort registered when it woke."""
    known = {r.lease for r in before}
    return [r for r in after if r.lease not in known]


def revoke_leases(etcd: Etcd, leases: Iterable[int]) -> list[int]:
    """Revoke the leases concurrently (one request each, all at once); returns those etcd knew."""
    leases = list(dict.fromkeys(leases))
    done: dict[int, bool] = {}
    errors: list[str] = []

    def revoke(lease: int) -> None:
        try:
            done[lease] = etcd.lease_revoke(lease)
        except EtcdError as err:
            errors.append(str(err))

    threads = [threading.Thread(target=revoke, args=(lease,), name=f"revoke-{lease:x}") for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors and not done:
        raise EtcdError("; ".join(errors))
    return [lease for lease in leases if done.get(lease)]


def deroute(etcd: Etcd, leases: Iterable[int]) -> list[KV]:
    """Take the workers on ``leases`` out of the frontend's routing and keep their model cards: delete their
    ``v1/instances/`` records, which Dynamo 1.6.1 does not write again. With no instance left the frontend keeps
    the model and answers 503 ("not ready to serve requests yet", which clients retry; not the 404 of a model
    whose card went), and the streams already on the worker go on to their end (tests/slurm/test_discovery.py).
    Returns the records removed, for ``reroute``."""
    wanted = set(leases)
    removed: list[KV] = []
    try:
        for kv in [kv for kv in etcd.get_prefix(INSTANCES) if kv.lease in wanted]:
            etcd.delete(kv.key)
            removed.append(kv)
    except EtcdError:
        reroute(etcd, removed)  # all or nothing
        raise
    return removed


def reroute(etcd: Etcd, removed: Iterable[KV]) -> int:
    """Put ``deroute``'s records back on their leases; returns how many took (none of a lease that ended)."""
    done = 0
    for kv in removed:
        try:
            etcd.put(kv.key, kv.value, lease=kv.lease)
            done += 1
        except EtcdError:
            continue
    return done


def revoke_cohort(etcd: Etcd, plan: Plan, cohort: int, ports: Iterable[int] = ()) -> list[int]:
    """Revoke every registration of ``cohort`` at once (see cohort_registrations); returns the lease ids."""
    return revoke_leases(etcd, [r.lease for r in cohort_registrations(etcd, plan, cohort, ports)])


def wait_unregistered(etcd: Etcd, leases: Iterable[int], timeout: float, interval: float = 0.02) -> bool:
    """True once none of ``leases`` has a key left (bounded by ``timeout``)."""
    wanted = set(leases)
    deadline = time.monotonic() + timeout
    while True:
        if not wanted & {r.lease for r in registrations(etcd)}:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
