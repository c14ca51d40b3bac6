"""An agent's presence through a real etcd (control/presence.py): registered on a lease of its own, its record
naming the agent (and a spare's role), kept alive, registered again with a new lease when etcd let it expire (said
in a notice), and the time of the last keepalive etcd answered known (the self-fencing deadline's start)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from shadowline.common.coordination import Keys
from shadowline.common.etcd_client import Etcd
from shadowline.control.presence import SPARE, Presence
from tests.loopback import wait_until


def test_a_spares_presence_is_kept_and_registered_again_after_its_lease_expired(etcd: Etcd):
    notices: list[tuple[str, dict[str, Any]]] = []
    stop = threading.Event()
    key = Keys("unit", None).agent("node4")
    presence = Presence(etcd, key, 1, "42.abc", lambda event, **fields: notices.append((event, fields)), stop,
                        role=SPARE)
    before = time.monotonic()
    presence.start()
    try:
        assert wait_until(lambda: etcd.get(key), 5, 0.05, "the presence registered")
        record = json.loads(etcd.get(key).value)
        assert record["role"] == "spare" and record["instance"] == "42.abc"
        first_lease = presence.lease
        assert first_lease and before <= presence.answered_at <= time.monotonic()
        answered = presence.answered_at
        assert wait_until(lambda: presence.answered_at > answered or None, 3, 0.05, "a keepalive answered")
        time.sleep(1.5)  # past the TTL: the keepalives kept it
        assert etcd.get(key) is not None and presence.lease == first_lease
        etcd.lease_revoke(first_lease)  # etcd let it go (as after a partition longer than the TTL)
        assert wait_until(lambda: presence.lease != first_lease or None, 5, 0.05, "registered again")
        assert wait_until(lambda: etcd.get(key), 5, 0.05, "the record back")
        assert [event for event, _fields in notices] == ["agent-lease-expired", "agent-registered-again"]
    finally:
        stop.set()


def test_a_nodes_presence_names_no_role(etcd: Etcd):
    stop = threading.Event()
    presence = Presence(etcd, Keys("unit", None).agent("node0"), 3, "7.1", lambda *_a, **_k: None, stop)
    presence.register()
    assert "role" not in json.loads(etcd.get(Keys("unit", None).agent("node0")).value)
    assert presence.period() == 1.0
