"""Progress: bytes, rate, time left through a callback, and into the status file while staging."""

from __future__ import annotations

import json
from pathlib import Path

from modelkit import MODEL_ID, REV, make_model

from shadowline.model.progress import ProgressTracker
from shadowline.model.spec import spec_from_inventory
from shadowline.model.stage import ensure_model


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_rate_and_eta_with_throttling():
    clock = Clock()
    seen = []
    tracker = ProgressTracker("download", 1000, 4, seen.append, interval=1.0, clock=clock)
    for _unused in range(4):
        clock.t += 0.5
        tracker.add_bytes(100)
    tracker.file_done()
    # throttled: at most one report per second of clock time
    assert 1 <= len(seen) <= 2
    report = tracker.finish()
    assert report.bytes_done == 400 and report.files_done == 1
    assert abs(report.rate_bps - 200.0) < 1e-6
    assert abs(report.eta_s - 3.0) < 1e-6
    data = report.as_dict()
    assert data["percent"] == 40.0 and "ETA 3s" in data["text"]
    assert seen[-1].bytes_done == 400


def test_status_file_carries_progress_during_staging(tmp_path: Path):
    src = make_model(tmp_path / "src", shards=6, shard_kib=256)
    inv = {"id": MODEL_ID, "revision": REV, "source": f"file://{src}", "local_dir": str(tmp_path / "n" / "m")}
    spec = spec_from_inventory(inv, workers=1)
    snapshots = []

    def poll(report):
        # what a controller task reading the status file sees at this moment
        snapshots.append(json.loads(Path(spec.status_path).read_text()))

    result = ensure_model(spec, progress=poll, progress_interval=0)
    assert result.state == "Ready"
    downloading = [s for s in snapshots if s["state"] == "Downloading"]
    assert downloading, "status file must say Downloading while copying"
    progress = downloading[-1]["progress"]
    for key in ("bytes_done", "bytes_total", "rate_bps", "eta_s", "files_done", "files_total", "text"):
        assert key in progress
    assert progress["bytes_total"] == result.total_bytes
    assert progress["bytes_done"] == result.total_bytes
    done = [s["progress"]["bytes_done"] for s in downloading]
    assert done == sorted(done) and done[0] < done[-1]
    assert json.loads(Path(spec.status_path).read_text())["state"] == "Ready"
