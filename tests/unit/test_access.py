"""etcd's role-based access as cluster/access.py sets it up, against a real etcd (issue #13): a client without
credentials writes nothing, an engine's identity cannot forge a slot record, the agent's can; tokens renew."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from shadowline.cluster.access import AGENT, DYNAMO, ROOT, ensure_etcd_auth, etcd_from_env
from shadowline.common.coordination import RUNNING, Coordination, Slot
from shadowline.common.etcd_client import Etcd, EtcdAuth, EtcdError
from tests.loopback import CuttingProxy, start_etcd

PASSWORDS = {ROOT: "root-pw-0123456789", AGENT: "agent-pw-0123456789", DYNAMO: "dynamo-pw-0123456789"}


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory):
    server = start_etcd(tmp_path_factory.mktemp("etcd-auth"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def secured(etcd) -> str:
    changed = ensure_etcd_auth(etcd.url, "unit", PASSWORDS)
    assert "authentication enabled" in changed and f"user {ROOT}: role {ROOT}" in changed
    assert ensure_etcd_auth(etcd.url, "unit", PASSWORDS) == []  # idempotent
    return etcd.url


def test_no_credentials_no_access(secured: str):
    plain = Etcd(secured)
    with pytest.raises(EtcdError):
        plain.put("/shadowline/unit/slots/0", "forged")
    with pytest.raises(EtcdError):
        plain.get_prefix("v1/")
    request = urllib.request.Request(secured + "/v3/kv/put", method="POST", data=json.dumps(
        {"key": "L3NoYWRvd2xpbmUvdW5pdC9zbG90cy8w", "value": "eA=="}).encode())
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(request, timeout=2)  # noqa: S310 (a loopback etcd)


def test_wrong_password_is_refused(secured: str):
    with pytest.raises(EtcdError) as err:
        Etcd(secured, auth=EtcdAuth(AGENT, "guess")).put("/shadowline/unit/x", "y")
    assert "guess" not in str(err.value)


def test_agent_writes_slots_engine_cannot(secured: str):
    agent = Coordination(Etcd(secured, auth=EtcdAuth(AGENT, PASSWORDS[AGENT])), "unit", 0)
    assert agent.create_slot(Slot(cohort=0, generation=1, state=RUNNING))
    engine = Etcd(secured, auth=EtcdAuth(DYNAMO, PASSWORDS[DYNAMO]))
    with pytest.raises(EtcdError, match="permission denied"):
        engine.put("/shadowline/unit/slots/0", json.dumps({"forged": True}))
    engine.put("v1/instances/ns/c/e/1", "x")  # discovery is the engines' own
    other = Etcd(secured, auth=EtcdAuth(AGENT, PASSWORDS[AGENT]))
    with pytest.raises(EtcdError, match="permission denied"):
        other.put("/shadowline/another-deployment/slots/0", "x")
    assert [kv.key for kv in other.get_prefix("v1/instances/")] == ["v1/instances/ns/c/e/1"]
    lease = other.lease_grant(5)
    engine.put("v1/instances/ns/c/e/2", "x", lease=lease)
    assert other.lease_revoke(lease)  # the agent fences a dead worker


def test_an_expired_token_is_renewed(secured: str):
    auth = EtcdAuth(AGENT, PASSWORDS[AGENT])
    client = Etcd(secured, auth=auth)
    client.put("/shadowline/unit/t", "1")
    auth._tokens = {k: "bogus.token" for k in auth._tokens}  # as after etcd restarted or the token expired
    client.put("/shadowline/unit/t", "2")
    assert client.get("/shadowline/unit/t").value == b"2"


def test_dynamo_environment_gives_the_engines_client(secured: str):
    env = {"ETCD_ENDPOINTS": secured, "ETCD_AUTH_USERNAME": DYNAMO, "ETCD_AUTH_PASSWORD": PASSWORDS[DYNAMO]}
    client = etcd_from_env(environ=env)
    assert client is not None and client.get_prefix("v1/instances/") is not None
    assert etcd_from_env(environ={}) is None


def test_a_second_run_keeps_the_tokens_clients_hold(secured: str):
    """A Dynamo runtime authenticates once and keeps its token (a parked shadow for as long as it is parked):
    ensure_etcd_auth on every site.yml run must not set an unchanged password again, which makes etcd drop the
    user's tokens (the shadow then failed to register at its wake: 'etcdserver: invalid auth token')."""
    token = json.loads(urllib.request.urlopen(urllib.request.Request(  # noqa: S310 (a loopback etcd)
        secured + "/v3/auth/authenticate", method="POST",
        data=json.dumps({"name": DYNAMO, "password": PASSWORDS[DYNAMO]}).encode()), timeout=5).read())["token"]

    def put_with_token() -> int:
        request = urllib.request.Request(secured + "/v3/kv/put", method="POST", headers={"Authorization": token},
                                         data=json.dumps({"key": "djEvdW5pdA==", "value": "eA=="}).encode())
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 (a loopback etcd)
                return answer.status
        except urllib.error.HTTPError as err:
            return err.code

    assert put_with_token() == 200
    assert ensure_etcd_auth(secured, "unit", PASSWORDS) == []
    assert put_with_token() == 200, "a second run invalidated the token a client holds"


def test_a_permission_taken_away_is_granted_again_and_only_it(secured: str):
    """Grants are made only where missing (each grant is a change of etcd's auth store, which refuses requests
    under the older auth revision for a moment): a permission revoked by hand is the one change of the next run."""
    root = Etcd(secured, auth=EtcdAuth(ROOT, PASSWORDS[ROOT]))
    root._call("/v3/auth/role/revoke", {  # noqa: SLF001 (a test's hand on the auth store)
        "role": f"shadowline-{AGENT}", "key": "djEv", "range_end": "djEw"})  # v1/ .. v10
    agent = Etcd(secured, auth=EtcdAuth(AGENT, PASSWORDS[AGENT]))
    with pytest.raises(EtcdError):
        agent.put("v1/unit-grant", "x")
    assert ensure_etcd_auth(secured, "unit", PASSWORDS) == [f"role shadowline-{AGENT}: v1/"]
    agent.put("v1/unit-grant", "x")
    assert ensure_etcd_auth(secured, "unit", PASSWORDS) == []


def test_password_rotation(secured: str):
    rotated = dict(PASSWORDS, dynamo="dynamo-pw-rotated")
    ensure_etcd_auth(secured, "unit", rotated)
    with pytest.raises(EtcdError):
        Etcd(secured, auth=EtcdAuth(DYNAMO, PASSWORDS[DYNAMO])).get_prefix("v1/")
    Etcd(secured, auth=EtcdAuth(DYNAMO, "dynamo-pw-rotated")).get_prefix("v1/")
    ensure_etcd_auth(secured, "unit", PASSWORDS)


def test_secrets_never_in_reprs(tmp_path: Path):
    auth = EtcdAuth(AGENT, PASSWORDS[AGENT])
    assert PASSWORDS[AGENT] not in repr(auth) and PASSWORDS[AGENT] not in repr(Etcd("http://x:1", auth=auth))


def test_answers_cut_short_are_etcd_errors_with_authentication_too(secured: str):
    """Fault matrix row 7 with authentication on: a token request or an answer cut in half is an EtcdError (which
    the agent handles), never another exception; an empty token is never kept."""
    host, port = secured.rsplit("//", 1)[1].rsplit(":", 1)
    proxy = CuttingProxy((host, int(port)), every=3)
    try:
        errors = 0
        for i in range(30):
            client = Etcd(proxy.url, timeout=2.0, deadline=2.0, auth=EtcdAuth(AGENT, PASSWORDS[AGENT]))
            for _unused in range(2):
                try:
                    client.put(f"/shadowline/unit/cut/{i}", "x")
                except EtcdError:
                    errors += 1  # anything else escapes and fails the test
            assert "" not in client.auth._tokens.values()
        assert errors >= 5
    finally:
        proxy.close()


def test_siblings_keep_one_token_in_use(tmp_path: Path):
    """etcd forgets a token unused for --auth-token-ttl (2 s here, 300 s by default) and a new one costs a bcrypt
    check of the password: a client idle that long gets a new token at its next call. The agent's writer, idle
    between failures, shares its token with the reader that watches every second (Etcd.sibling): it keeps it."""
    etcd = start_etcd(tmp_path, extra=["--auth-token-ttl", "2"])
    try:
        assert "authentication enabled" in ensure_etcd_auth(etcd.url, "unit", PASSWORDS)
        alone = Etcd(etcd.url, auth=EtcdAuth(AGENT, PASSWORDS[AGENT]))
        reader = Etcd(etcd.url, auth=EtcdAuth(AGENT, PASSWORDS[AGENT]))
        writer = reader.sibling(2.0, 2.5)
        for client in (alone, writer):
            client.put("/shadowline/unit/idle", "0")
        tokens = (dict(alone.auth._tokens), dict(writer.auth._tokens))
        for _unused in range(12):  # 3 s: the reader calls, the writer and the lone client do not
            reader.get("/shadowline/unit/idle")
            time.sleep(0.25)
        for client in (alone, writer):
            client.put("/shadowline/unit/idle", "1")
        assert alone.auth._tokens != tokens[0], "etcd kept a token unused for longer than its TTL"
        assert writer.auth._tokens == tokens[1], "the sibling's token was renewed: its reader's use did not keep it"
    finally:
        etcd.stop()
