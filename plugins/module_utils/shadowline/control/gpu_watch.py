"""The node agent's GPU health listener: a thread that waits on the node's GPU event source (control/gpu_health.py)
and hands each fault to the loop (the loop decides: node_duties.gpu_faults). It never acts itself.

Which source: the backend's (``Backend.gpu_events``): ``nvml`` tries NVML's event set (nvidia-ml-py, a driver
answering) and falls back to the kernel log through journald (``journalctl -k -f``); ``fake`` reads the stand-in's
event file in the deployment's state dir, which drills append to (``gpu-xid-app``, ``gpu-xid-fatal``); ``none``
listens to nothing. A source that fails is reported once as a notice (the loop writes it to the event log) and the
thread ends: the agent goes on without GPU events rather than dying.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .gpu_health import KERNEL_LOG_ARGV, FakeEvents, GpuFault, KernelLog, NvmlEvents, fake_events_path
from .wakeup import drain, wake

FAKE_POLL_S = 0.05  # the stand-in's event file is read this often
NVML_WAIT_MS = 500


@dataclass(frozen=True)
class WatchNotice:
    """What the listener says of itself (its source, a failure), for the event log."""
    event: str  # gpu-watch-started | gpu-watch-failed
    detail: str


class GpuWatch(threading.Thread):
    """Faults and notices come out through ``take()``; each one also wakes the loop (a byte on ``wake_fd``)."""

    def __init__(self, source: str, state_dir: str, wake_fd: int) -> None:
        super().__init__(name="gpu-watch", daemon=True)
        self.source = source
        self.state_dir = state_dir
        self.wake_fd = wake_fd
        self.faults: queue.Queue[GpuFault] = queue.Queue()
        self.notices: queue.Queue[WatchNotice] = queue.Queue()
        self.stop = threading.Event()

    def take(self) -> tuple[list[GpuFault], list[WatchNotice]]:
        return drain(self.faults), drain(self.notices)

    def run(self) -> None:
        try:
            name, events = self.open()
        except (OSError, subprocess.SubprocessError) as err:
            self.say("gpu-watch-failed", f"no GPU event source could be opened: {err}")
            return
        if events is None:
            return
        self.say("gpu-watch-started", name)
        try:
            for fault in events:
                self.faults.put(fault)
                self.wake()
        except Exception as err:  # noqa: BLE001 (the listener must never take the agent down)
            self.say("gpu-watch-failed", f"{name}: {type(err).__name__}: {err}")

    def open(self) -> tuple[str, Iterator[GpuFault] | None]:
        if self.source == "fake":
            path = fake_events_path(self.state_dir)
            return f"the stand-in's GPU event file {path}", self.poll_forever(FakeEvents(path).poll, FAKE_POLL_S)
        if self.source == "nvml":
            nvml = NvmlEvents.open()
            if nvml is not None:
                return (f"NVML events on {len(nvml.devices)} GPU(s)",
                        self.poll_forever(lambda: nvml.poll(NVML_WAIT_MS), 0.0))
            return "the kernel log (journalctl -k; NVML is not available)", self.kernel_log()
        return "none", None

    def poll_forever(self, poll: Callable[[], list[GpuFault]], pause_s: float) -> Iterator[GpuFault]:
        while not self.stop.is_set():
            yield from poll()
            if pause_s:
                time.sleep(pause_s)

    def kernel_log(self) -> Iterator[GpuFault]:
        reader = KernelLog()
        with subprocess.Popen(list(KERNEL_LOG_ARGV), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) as proc:
            if proc.stdout is None:
                raise OSError("journalctl -k gave no output stream")
            for fault in reader.feed(proc.stdout):
                if self.stop.is_set():
                    proc.kill()
                    return
                yield fault
            raise OSError(f"journalctl -k ended with status {proc.wait()}")

    def say(self, event: str, detail: str) -> None:
        self.notices.put(WatchNotice(event, detail))
        self.wake()

    def wake(self) -> None:
        wake(self.wake_fd, b"g")
