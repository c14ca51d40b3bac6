"""The node agent's GPU health listener: a thread that waits on the node's GPU event source (common/gpu_health.py)
and hands each fault to the loop (the loop decides: node_duties.gpu_faults). It never acts itself.

Which source: the backend's (``Backend.gpu_events``): ``nvml`` tries NVML's event set (nvidia-ml-py, a driver
answering) and falls back to the kernel log through journald (``journalctl -k -f``); a backend with a source of its
own hands it over, opened (``Backend.gpu_event_source``: the stand-in's reads its event file in the deployment's
state dir, which drills append to: ``gpu-xid-app``, ``gpu-xid-fatal``); ``none`` listens to nothing. A source
that fails is reported once as a notice (the loop writes it to the event log) and the thread ends: the agent goes
on without GPU events rather than dying.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..backends.base import PolledGpuEvents
from ..common.gpu_health import KERNEL_LOG_ARGV, GpuFault, KernelLog, NvmlEvents
from ..common.wakeup import drain, wake

NVML_WAIT_MS = 500


@dataclass(frozen=True)
class WatchNotice:
    """What the listener says of itself (its source, a failure), for the event log."""
    event: str  # gpu-watch-started | gpu-watch-failed
    detail: str


class GpuWatch(threading.Thread):
    """Faults and notices come out through ``take()``; each one also wakes the loop (a byte on ``wake_fd``)."""

    def __init__(self, source: str, state_dir: str, wake_fd: int,
                 own_source: Callable[[str], PolledGpuEvents | None] | None = None) -> None:
        super().__init__(name="gpu-watch", daemon=True)
        self.source = source
        self.state_dir = state_dir
        self.own_source = own_source  # the backend's gpu_event_source, for a source of its own
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
        own = self.own_source(self.state_dir) if self.own_source is not None else None
        if own is not None:
            return own.name, self.poll_forever(own.poll, own.pause_s)
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
