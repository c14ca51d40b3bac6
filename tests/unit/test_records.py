"""Records read from etcd (fault matrix row 1): a slot record is parsed against its versioned schema; whatever
does not parse is reported and ignored, never fatal. No etcd: the parsers on bytes."""

from __future__ import annotations

import json

import pytest

from shadowline.common.coordination import SLOT_SCHEMA, Keys, RecordInvalid, Slot
from shadowline.common.etcd_client import KV
from shadowline.control.view import parse_view

GOOD = {"cohort": 1, "generation": 3, "state": "running", "reason": "", "since": 1.0e9, "attempts": 0,
        "not_before": 0.0, "detected_by": ""}


def test_a_record_round_trips_with_its_schema():
    slot = Slot(cohort=1, generation=3, state="failed", reason="rank-exited", since=5.0, detected_by="node1")
    data = json.loads(slot.to_json())
    assert data["schema"] == SLOT_SCHEMA
    assert Slot.parse(slot.to_json()) == slot
    assert Slot.parse(json.dumps({k: v for k, v in GOOD.items() if k in ("cohort", "generation", "state")}))


@pytest.mark.parametrize(("value", "why"), [
    (b"{not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (json.dumps({**GOOD, "schema": SLOT_SCHEMA + 1, "lease_owner": "x"}), "newer than this agent"),
    (json.dumps({**GOOD, "lease_owner": "x"}), "not in schema"),
    (json.dumps({"cohort": 1, "state": "running"}), "missing"),
    (json.dumps({**GOOD, "cohort": "1"}), "cohort is '1'"),
    (json.dumps({**GOOD, "cohort": True}), "cohort is True"),
    (json.dumps({**GOOD, "generation": 0}), "generation is 0"),
    (json.dumps({**GOOD, "attempts": -1}), "attempts is -1"),
    (json.dumps({**GOOD, "since": "yesterday"}), "since is 'yesterday'"),
    ('{"cohort": 1, "generation": 3, "state": "running", "not_before": NaN}', "not_before is nan"),
    (json.dumps({**GOOD, "state": "exploded"}), "state is 'exploded'"),
    (json.dumps({**GOOD, "reason": 7}), "reason is 7"),
    (json.dumps({**GOOD, "schema": "1"}), "not a version number"),
])
def test_records_that_do_not_parse_say_why(value, why):
    with pytest.raises(RecordInvalid) as err:
        Slot.parse(value)
    assert why in str(err.value)
    assert err.value.newer == ("newer" in why)


def kv(key: str, value: str | bytes, revision: int) -> KV:
    raw = value.encode() if isinstance(value, str) else value
    return KV(key=key, value=raw, mod_revision=revision, create_revision=revision, lease=0)


def test_the_view_keeps_good_slots_and_names_the_bad_ones():
    keys = Keys("demo", 0)
    kvs = [kv(keys.slot(0), Slot(0, 2, "running").to_json(), 5),
           kv(keys.slot(1), b"garbage", 6),
           kv(keys.slot(2), Slot(1, 1, "running").to_json(), 7),  # says cohort 1 under cohort 2's key
           kv(keys.slot(7), Slot(7, 1, "running").to_json(), 8),  # a cohort the plan does not have
           kv(keys.gone(0, 1, "node1"), b'{"time": "soon"}', 9),  # unreadable: skipped
           kv(keys.gone(0, 1, "node0"), b'{"time": 12.5}', 10),
           kv(keys.active(), b'{"cohort": "x"}', 11)]
    view = parse_view(keys, kvs, frozenset({0, 1, 2}), revision=11)
    assert list(view.slots) == [0] and view.slot(0).generation == 2
    assert sorted(view.invalid) == [keys.slot(1), keys.slot(2), keys.slot(7)]
    assert "not in the plan" in view.invalid[keys.slot(7)].why
    assert view.invalid[keys.slot(1)].revision == 6
    assert view.gone == {(0, 1): {"node0": 12.5}}
    assert view.active is None and view.revision == 11
