"""A small etcd v3 client over the JSON gateway (etcd 3.4: ``/v3/kv/*``, ``/v3/lease/*``, ``/v3/watch``).

Stdlib only (http.client), so it runs on nodes from the runtime and inside Ansible modules. Keys and values
travel base64-encoded and 64-bit numbers as strings, as the gateway wants; this module hides both.

    etcd = Etcd("http://10.0.0.1:2379,http://10.0.0.2:2379")
    lease = etcd.lease_grant(5)
    etcd.put("v1/agent/node0", "alive", lease=lease)
    for kv in etcd.get_prefix("v1/instances/"):
        print(kv.key, kv.lease)

Endpoints are tried in turn: one that refuses the connection or times out is skipped (and the last one
that answered is tried first next time). An error of etcd itself (a bad request, an unknown lease that the
call does not expect) is not retried elsewhere. Every failure raises ``EtcdError`` naming the endpoint(s).
Calls reuse kept-alive connections (one TLS handshake per connection, not per call); a watch has a connection
of its own, closed when it returns.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any

from .http import KeptConnections

NOT_FOUND = 5  # gRPC status code etcd returns for an unknown lease


class EtcdError(Exception):
    """etcd could not be reached, or answered with an error; the message names the endpoint."""

    def __init__(self, message: str, endpoint: str | None = None, code: int | None = None,
                 compacted: int = 0) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.code = code  # the gRPC status code when etcd answered with an error
        self.compacted = compacted  # a watch cancelled because its revision was compacted: read again, then watch


@dataclass(frozen=True)
class KV:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int


@dataclass(frozen=True)
class Event:
    type: str  # "put" or "delete"
    key: str
    value: bytes  # empty for a delete
    mod_revision: int


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: str | bytes) -> bytes:
    """The range end that selects every key starting with ``prefix`` (etcd's convention)."""
    raw = bytearray(prefix.encode() if isinstance(prefix, str) else prefix)
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"  # every key


def _range(prefix: str) -> dict[str, str]:
    """key/range_end selecting ``prefix`` and everything under it ("" selects every key)."""
    return {"key": _b64(prefix or b"\0"), "range_end": _b64(prefix_end(prefix))}


def _kv(data: dict[str, Any]) -> KV:
    try:
        return _parse_kv(data)
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as err:
        raise EtcdError(f"etcd answered with a malformed key-value: {err}") from None


def _parse_kv(data: dict[str, Any]) -> KV:
    return KV(key=_unb64(data.get("key")).decode("utf-8", "replace"), value=_unb64(data.get("value")),
              mod_revision=int(data.get("mod_revision", 0)), create_revision=int(data.get("create_revision", 0)),
              lease=int(data.get("lease", 0)))


def _normalise(endpoint: str) -> str:
    endpoint = endpoint.strip().rstrip("/")
    return endpoint if "://" in endpoint else f"http://{endpoint}"


class EtcdAuth:
    """etcd's authentication on the JSON gateway: the user a client acts as, and the token etcd gave it on each
    endpoint (``/v3/auth/authenticate``, fetched on first use; a token is valid on the member that issued it). A
    request refused for an expired or unknown token (HTTP 401) gets a new token and is sent once more (Etcd._send).
    The password stays in this object (never in a URL, header of a log line or exception message)."""

    def __init__(self, user: str, password: str) -> None:
        self.user = user
        self._password = password
        self._tokens: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"EtcdAuth({self.user!r})"

    def credentials(self) -> bytes:
        """The body of ``/v3/auth/authenticate``."""
        return json.dumps({"name": self.user, "password": self._password}).encode()

    def token(self, endpoint: str) -> str | None:
        """The token etcd gave this user on ``endpoint``, None before the first (or after a refused one)."""
        return self._tokens.get(endpoint)

    def keep(self, endpoint: str, token: str) -> None:
        self._tokens[endpoint] = token


AUTHENTICATE = "/v3/auth/authenticate"


class _Refused(Exception):
    """etcd answered with an HTTP error status: the status and etcd's error (its ``message``, ``code``)."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(error.get("message") or f"HTTP {status}")
        self.status = status
        self.error = error


class Etcd:
    """``timeout``: the longest one endpoint may take to answer; ``deadline``: the longest one call may take over
    every endpoint it tries (an unreachable member costs at most its share, never a sum of timeouts)."""

    def __init__(self, endpoints: list[str] | str, timeout: float = 2.0, deadline: float = 3.0,
                 ssl_context: ssl.SSLContext | None = None, auth: EtcdAuth | None = None) -> None:
        items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
        self.endpoints = [_normalise(e) for e in items if e and e.strip()]
        if not self.endpoints:
            raise EtcdError("no etcd endpoint given (expected e.g. http://10.0.0.1:2379)")
        self.timeout = timeout
        self.deadline = max(timeout, deadline)
        self.ssl_context = ssl_context  # https:// endpoints: the deployment's CA and this client's certificate
        self.auth = auth  # etcd's role-based access: the user this client acts as (cluster/access.py builds it)
        self._connections = KeptConnections(ssl_context)
        self._preferred = 0

    def __repr__(self) -> str:
        return f"Etcd({','.join(self.endpoints)!r})"

    def close(self) -> None:
        """Close the kept-alive connections (a later call opens new ones)."""
        self._connections.close()

    def sibling(self, timeout: float, deadline: float) -> Etcd:
        """Another client of the same endpoints, as the same user, with timeouts of its own (a thread's), sharing
        this one's token and kept connections. etcd forgets a token unused for ``--auth-token-ttl`` (300 s by
        default) and checks the password's bcrypt hash for a new one (a new client's first call, which
        authenticates, took 68-70 ms on the testbed, a transaction after it 1.3 ms). Siblings keep one token in
        use: the agent's writer, idle between failures (its first write is a declaration), shares its reader's,
        which watches every second."""
        other = Etcd(self.endpoints, timeout=timeout, deadline=deadline, ssl_context=self.ssl_context, auth=self.auth)
        other._connections = self._connections  # noqa: SLF001 (shared by design: thread-safe)
        return other

    # -- transport ------------------------------------------------------------------------------------ #

    def _send(self, endpoint: str, path: str, data: bytes, timeout: float) -> bytes:
        """POST to one endpoint as this client's user: etcd's answer, _Refused for an HTTP error status; OSError
        or http.client.HTTPException when no whole answer came."""
        for fresh in (False, True):
            status, payload = self._connections.post(endpoint, path, data, self._headers(endpoint, timeout, fresh),
                                                     timeout)
            if status == 401 and self.auth is not None and not fresh:
                continue  # an expired or unknown token (etcd restarted, or its TTL passed): a new one, once
            if status >= 400:
                raise _Refused(status, error_message(payload))
            return payload
        raise AssertionError("unreachable")

    def _headers(self, endpoint: str, timeout: float, fresh: bool) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.auth is not None:
            headers["Authorization"] = self._token(endpoint, timeout, fresh)
        return headers

    def _token(self, endpoint: str, timeout: float, fresh: bool) -> str:
        auth = self.auth
        if auth is None:
            raise AssertionError("a token of a client without a user")
        token = None if fresh else auth.token(endpoint)
        if token is None:
            status, payload = self._connections.post(endpoint, AUTHENTICATE, auth.credentials(),
                                                     {"Content-Type": "application/json"}, timeout)
            if status >= 400:
                error = error_message(payload)
                raise _Refused(status, {**error, "message": f"etcd user {auth.user}: {error.get('message')}"})
            try:
                token = json.loads(payload).get("token")
            except (ValueError, AttributeError):  # an answer cut short, or not the JSON object etcd sends
                token = None
            if not isinstance(token, str) or not token:
                raise http.client.HTTPException(f"etcd gave user {auth.user} no token (answer cut short?)")
            auth.keep(endpoint, token)
        return token

    def _order(self) -> list[int]:
        n = len(self.endpoints)
        return [(self._preferred + i) % n for i in range(n)]

    def _call(self, path: str, body: dict[str, Any], allow_not_found: bool = False) -> dict[str, Any]:
        """POST one request; the next endpoint on connection failures, EtcdError when none answers."""
        data = json.dumps(body).encode()
        failures = []
        deadline = time.monotonic() + self.deadline
        for index in self._order():
            endpoint = self.endpoints[index]
            remaining = deadline - time.monotonic()
            if remaining <= 0.01:
                failures.append(f"{endpoint}: not tried, the call's deadline ({self.deadline:g} s) passed")
                continue
            try:
                payload = self._send(endpoint, path, data, min(self.timeout, remaining))
            except _Refused as err:
                code = err.error.get("code")
                if allow_not_found and code == NOT_FOUND:
                    self._preferred = index
                    return {"_not_found": True}
                if err.status >= 500:  # e.g. a member without a leader: another member may answer
                    failures.append(f"{endpoint}: {err} (HTTP {err.status})")
                    continue
                raise EtcdError(f"etcd at {endpoint} refused {path}: {err} (HTTP {err.status})", endpoint,
                                code) from None
            except (OSError, http.client.HTTPException) as err:  # a truncated answer: BadStatusLine, IncompleteRead
                failures.append(f"{endpoint}: {err!r}")
                continue
            self._preferred = index
            try:  # etcd always answers with a JSON object: nothing at all is an answer cut short
                answer = json.loads(payload) if payload else None
            except ValueError:
                answer = None
            if not isinstance(answer, dict):
                failures.append(f"{endpoint}: answered with something that is not a JSON object: {payload[:200]!r}")
                continue
            return answer
        raise EtcdError(f"no etcd endpoint answered {path} (timeout {self.timeout:g} s): " + "; ".join(failures),
                        ",".join(self.endpoints))

    # -- keys ----------------------------------------------------------------------------------------- #

    def get(self, key: str) -> KV | None:
        kvs = self._call("/v3/kv/range", {"key": _b64(key)}).get("kvs", [])
        return _kv(kvs[0]) if kvs else None

    def get_prefix(self, prefix: str) -> list[KV]:
        return self.range_prefix(prefix)[0]

    def range_prefix(self, prefix: str) -> tuple[list[KV], int]:
        """Every key under ``prefix``, and the store's revision of the read (a watch continues after it)."""
        body = {**_range(prefix), "sort_target": "KEY", "sort_order": "ASCEND"}
        answer = self._call("/v3/kv/range", body)
        return [_kv(item) for item in answer.get("kvs") or []], _revision(answer)

    def read_at_once(self, prefixes: list[str], keys: list[str]) -> tuple[list[KV], int]:
        """Every key under each of ``prefixes`` and each of ``keys`` (those that exist), read in one transaction:
        all at one revision of the store, which it returns (a watch continues after it)."""
        reads = [{"request_range": {**_range(p), "sort_target": "KEY", "sort_order": "ASCEND"}} for p in prefixes]
        reads += [{"request_range": {"key": _b64(k)}} for k in keys]
        answer = self._call("/v3/kv/txn", {"compare": [], "success": reads, "failure": []})
        kvs = []
        for response in answer.get("responses") or []:
            kvs += [_kv(item) for item in (response.get("response_range") or {}).get("kvs") or []]
        return kvs, _revision(answer)

    def put(self, key: str, value: str | bytes, lease: int = 0) -> int:
        """Write ``key``; returns the store's revision after the write."""
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        return _revision(self._call("/v3/kv/put", body))

    def delete(self, key: str) -> int:
        """Delete one key; returns how many keys were deleted (0 or 1)."""
        return int(self._call("/v3/kv/deleterange", {"key": _b64(key)}).get("deleted", 0))

    def delete_prefix(self, prefix: str) -> int:
        body = _range(prefix)
        return int(self._call("/v3/kv/deleterange", body).get("deleted", 0))

    # -- transactions ----------------------------------------------------------------------------------- #

    def txn_put_if_absent(self, key: str, value: str | bytes, lease: int = 0) -> bool:
        """Create ``key`` only if it does not exist; True if this call created it."""
        compare = {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
        return self._txn(compare, key, value, lease)

    def txn_compare_and_swap(self, key: str, expected_mod_revision: int, value: str | bytes, lease: int = 0) -> bool:
        """Write ``key`` only if its mod_revision is still ``expected_mod_revision`` (0: it must not exist)."""
        if expected_mod_revision == 0:
            return self.txn_put_if_absent(key, value, lease)
        compare = {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(expected_mod_revision)}
        return self._txn(compare, key, value, lease)

    def txn_delete_if_unchanged(self, key: str, mod_revision: int) -> bool:
        """Delete ``key`` only if its mod_revision is still ``mod_revision``; True if this call deleted it."""
        compare = {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}
        answer = self._call("/v3/kv/txn", {"compare": [compare], "success": [{"request_delete_range": {
            "key": _b64(key)}}], "failure": []})
        return bool(answer.get("succeeded", False))

    def _txn(self, compare: dict[str, Any], key: str, value: str | bytes, lease: int) -> bool:
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        answer = self._call("/v3/kv/txn", {"compare": [compare], "success": [{"request_put": put}], "failure": []})
        return bool(answer.get("succeeded", False))

    # -- leases --------------------------------------------------------------------------------------- #

    def lease_grant(self, ttl: int) -> int:
        answer = self._call("/v3/lease/grant", {"TTL": str(int(ttl)), "ID": "0"})
        if answer.get("error"):
            raise EtcdError(f"etcd refused a lease of {ttl} s: {answer['error']}")
        return int(answer["ID"])

    def lease_revoke(self, lease: int) -> bool:
        """Revoke a lease and delete every key attached to it; False if etcd does not know the lease."""
        answer = self._call("/v3/lease/revoke", {"ID": str(lease)}, allow_not_found=True)
        return not answer.get("_not_found", False)

    def lease_keepalive(self, lease: int) -> int:
        """Renew a lease once; returns its TTL after renewal, 0 if it has expired or is unknown."""
        answer = self._call("/v3/lease/keepalive", {"ID": str(lease)}, allow_not_found=True)
        result = answer.get("result", {})
        return max(0, int(result.get("TTL", 0)))

    def lease_ttl(self, lease: int) -> int:
        """Seconds the lease has left; -1 if it has expired or is unknown."""
        answer = self._call("/v3/lease/timetolive", {"ID": str(lease)}, allow_not_found=True)
        if answer.get("_not_found"):
            return -1
        return int(answer.get("TTL", -1))

    # -- maintenance ---------------------------------------------------------------------------------- #

    def compact(self, revision: int) -> None:
        """Drop the history before ``revision`` (what etcd's auto-compaction does periodically)."""
        self._call("/v3/kv/compaction", {"revision": str(revision), "physical": True})

    def defragment(self) -> None:
        """Give the space of compacted history back (on the member that answers)."""
        self._call("/v3/maintenance/defragment", {})

    # -- watch ---------------------------------------------------------------------------------------- #

    def watch(self, prefix: str, start_revision: int, timeout: float) -> list[Event]:
        """Events under ``prefix`` after ``start_revision``: returns as soon as some arrive, or [] after ``timeout``.

        Pass the revision of the last event (or of a get) you saw; events already in the store's history
        are returned at once. A revision that etcd compacted away raises EtcdError.
        """
        body = json.dumps({"create_request": {**_range(prefix),
                                              "start_revision": str(start_revision + 1)}}).encode()
        deadline = time.monotonic() + timeout
        failures = []
        for index in self._order():
            endpoint = self.endpoints[index]
            if deadline - time.monotonic() <= 0:
                break
            connection = self._connections.open(endpoint, self.timeout)  # a stream ends only when closed
            try:  # a slow member gets its whole timeout to start the stream; the wait for events is the caller's
                response = self._start_watch(connection, endpoint, body)
            except _Refused as err:
                connection.close()
                raise EtcdError(f"etcd at {endpoint} refused a watch of {prefix!r}: {err}", endpoint) from None
            except (OSError, http.client.HTTPException) as err:
                connection.close()
                failures.append(f"{endpoint}: {err!r}")
                continue
            self._preferred = index
            try:
                return _read_events(response, connection.sock, endpoint, prefix, deadline)
            finally:
                connection.close()
        raise EtcdError("no etcd endpoint answered a watch: " + "; ".join(failures))

    def _start_watch(self, connection: http.client.HTTPConnection, endpoint: str,
                     body: bytes) -> http.client.HTTPResponse:
        """The watch's stream, its first answer read (a new token once when etcd refuses the one held)."""
        for fresh in (False, True):
            connection.request("POST", "/v3/watch", body=body, headers=self._headers(endpoint, self.timeout, fresh))
            response = connection.getresponse()
            if response.status == 401 and self.auth is not None and not fresh:
                response.read()  # the refusal is a whole answer: the connection carries the next request
                continue
            if response.status >= 400:
                raise _Refused(response.status, error_message(response.read()))
            return response
        raise AssertionError("unreachable")


def _read_events(response: http.client.HTTPResponse, sock: socket.socket | None, endpoint: str, prefix: str,
                 deadline: float) -> list[Event]:
    """Read the gateway's newline-delimited stream until events arrive or the deadline passes (``sock``: the
    stream's, to give each read its own timeout)."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return []
        if sock is not None:
            sock.settimeout(remaining)
        try:
            line = response.readline()
        except (TimeoutError, socket.timeout):
            return []
        except (OSError, http.client.HTTPException) as err:
            raise EtcdError(f"watch of {prefix!r} on {endpoint} broke: {err!r}", endpoint) from None
        if not line:
            raise EtcdError(f"etcd at {endpoint} closed the watch of {prefix!r}", endpoint)
        if not line.strip():
            continue
        try:
            message = json.loads(line)
            if not isinstance(message, dict):
                raise ValueError("not an object")
        except ValueError:
            raise EtcdError(f"etcd at {endpoint} sent a watch message that is not JSON: {line[:200]!r}",
                            endpoint) from None
        if "error" in message:
            error = message["error"]
            raise EtcdError(f"etcd at {endpoint} ended the watch of {prefix!r}: {error.get('message', error)}",
                            endpoint)
        result = message.get("result", {})
        if result.get("canceled"):
            compacted = int(result.get("compact_revision") or 0)
            why = f"revision {compacted} and earlier were compacted" if compacted else result.get("cancel_reason", "")
            raise EtcdError(f"etcd at {endpoint} cancelled the watch of {prefix!r}: {why}", endpoint,
                            compacted=compacted)
        try:
            events = [_event(e) for e in result.get("events", [])]
        except (ValueError, TypeError, AttributeError) as err:
            raise EtcdError(f"etcd at {endpoint} sent a malformed watch event: {err}", endpoint) from None
        if events:
            return events


def _event(data: dict[str, Any]) -> Event:
    kv = data.get("kv", {})
    return Event(type="delete" if data.get("type") == "DELETE" else "put",
                 key=_unb64(kv.get("key")).decode("utf-8", "replace"), value=_unb64(kv.get("value")),
                 mod_revision=int(kv.get("mod_revision", 0)))


def _revision(answer: dict[str, Any]) -> int:
    try:
        return int(answer.get("header", {}).get("revision", 0))
    except (ValueError, TypeError, AttributeError) as err:
        raise EtcdError(f"etcd answered with a malformed header: {err}") from None


def error_message(body: bytes) -> dict[str, Any]:
    """etcd's JSON error, or its text as the message (the gateway answers some refusals in plain text, e.g. a
    client certificate with a common name while authentication is on)."""
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return {"message": body.decode("utf-8", "replace").strip()[:300]}
    return data if isinstance(data, dict) else {}
