"""The stand-in's GPU event source: a fake event file of JSON lines ``{"gpu_uuid": ..., "xid": ..., "time": ...}``
(``"detail"`` optional) that drills append under the deployment's state dir (``fake_events_path``,
``append_fake_event``; ``FakeEvents`` reads new lines). The stand-in backend (backends/standin.py) hands it to the
node agent's listener (control/gpu_watch.py) as its own source; each line is classified as a real event is
(common/gpu_health.classify)."""

from __future__ import annotations

import json
import os
import time

from ..common.gpu_health import GPU_EVENTS_FILE, GpuFault, classify

FAKE = "fake"  # GpuFault.source of the events read here
FAKE_POLL_S = 0.05  # the stand-in's event file is read this often


def fake_events_path(state_dir: str) -> str:
    """Where drills append the stand-in's GPU events: one file per node, in the deployment's state dir."""
    return os.path.join(state_dir, GPU_EVENTS_FILE)


def append_fake_event(path: str, gpu_uuid: str, xid: int, detail: str = "", when: float | None = None) -> None:
    """Append one event (a drill's ``gpu-xid-*`` fault); one write of one line, so a reader never sees half."""
    event = {"gpu_uuid": gpu_uuid, "xid": int(xid), "time": time.time() if when is None else when}
    if detail:
        event["detail"] = detail
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(event) + "\n").encode())
    finally:
        os.close(fd)


class FakeEvents:
    """Reads the events appended to a fake event file since the last read (from its end when ``from_end``: a
    listener that starts late does not replay old drills)."""

    def __init__(self, path: str, from_end: bool = True) -> None:
        self.path = path
        self.offset = 0
        if from_end:
            try:
                self.offset = os.stat(path).st_size
            except FileNotFoundError:
                pass

    def poll(self) -> list[GpuFault]:
        try:
            with open(self.path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size < self.offset:
                    self.offset = 0  # the file was replaced
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        faults = []
        for line in complete.decode(errors="replace").splitlines():
            fault = parse_fake_event(line)
            if fault is not None:
                faults.append(fault)
        return faults


def parse_fake_event(line: str) -> GpuFault | None:
    try:
        event = json.loads(line)
        xid = int(event["xid"])
        uuid = str(event["gpu_uuid"])
    except (ValueError, KeyError, TypeError):
        return None
    action, detail = classify(xid, str(event.get("detail", "")))
    extra = event.get("detail")
    return GpuFault(uuid, event.get("pci_bus"), xid, action, f"{detail}: {extra}" if extra else detail, FAKE,
                    float(event.get("time") or 0.0))
