"""shadowline.standin.gpu_events: the stand-in's fake GPU event file, which drills append to and the node agent's
listener reads through the stand-in backend (Backend.gpu_event_source)."""

from __future__ import annotations

import json

from shadowline.common.xid_table import NODE_SERVICE, RESTART_APP
from shadowline.standin.gpu_events import FAKE, FakeEvents, append_fake_event, fake_events_path

UUID = "GPU-7f4e2c1a-9b3d-4e5f-8a6b-0c1d2e3f4a5b"


# -- the stand-in's fake event file ----------------------------------------------------------------------------- #

def test_fake_events_round_trip(tmp_path):
    path = fake_events_path(str(tmp_path))
    assert path == str(tmp_path / "gpu-events.jsonl")
    reader = FakeEvents(path)  # before the file exists
    assert reader.poll() == []
    append_fake_event(path, UUID, 13, when=100.0)
    append_fake_event(path, UUID, 79, detail="drill gpu-xid-fatal", when=101.0)
    faults = reader.poll()
    assert [(f.gpu_uuid, f.xid, f.action, f.source, f.time) for f in faults] == [
        (UUID, 13, RESTART_APP, FAKE, 100.0), (UUID, 79, NODE_SERVICE, FAKE, 101.0)]
    assert "drill gpu-xid-fatal" in faults[1].detail
    assert reader.poll() == []  # each event once


def test_a_late_reader_starts_at_the_end_and_half_lines_wait(tmp_path):
    path = fake_events_path(str(tmp_path))
    append_fake_event(path, UUID, 48)
    reader = FakeEvents(path)
    assert reader.poll() == []
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"gpu_uuid": UUID, "xid": 95})[:10])
    assert reader.poll() == []
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"gpu_uuid": UUID, "xid": 95})[10:] + "\nnot json\n")
    assert [f.xid for f in reader.poll()] == [95]
    assert [f.xid for f in FakeEvents(path, from_end=False).poll()] == [48, 95]
