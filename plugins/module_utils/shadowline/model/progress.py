"""Progress of a staging: bytes done, rate over the last seconds, time left; reported via a callback.

The tracker is thread safe (fetch and hash workers add bytes concurrently) and throttles the
callback to one call per ``interval`` seconds plus a final one.
"""

from __future__ import annotations

import threading
import time
import typing
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .fsutil import human_bytes

WINDOW_S = 5.0


@dataclass(frozen=True)
class ProgressReport:
    phase: str
    bytes_done: int
    bytes_total: int
    files_done: int
    files_total: int
    rate_bps: float
    eta_s: float | None
    elapsed_s: float

    @property
    def fraction(self) -> float:
        return self.bytes_done / self.bytes_total if self.bytes_total else 1.0

    def text(self) -> str:
        eta = "-" if self.eta_s is None else _duration(self.eta_s)
        return (
            f"{self.phase}: {human_bytes(self.bytes_done)} / {human_bytes(self.bytes_total)} "
            f"({self.fraction * 100:.1f}%), {self.files_done}/{self.files_total} files, "
            f"{human_bytes(self.rate_bps)}/s, ETA {eta}"
        )

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["rate_bps"] = round(self.rate_bps, 1)
        data["elapsed_s"] = round(self.elapsed_s, 3)
        data["eta_s"] = None if self.eta_s is None else round(self.eta_s, 1)
        data["percent"] = round(self.fraction * 100, 2)
        data["text"] = self.text()
        return data


ProgressCallback = typing.Callable[[ProgressReport], None]


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class ProgressTracker:
    def __init__(
        self,
        phase: str,
        bytes_total: int,
        files_total: int,
        callback: ProgressCallback | None = None,
        *,
        interval: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.phase = phase
        self.bytes_total = max(0, int(bytes_total))
        self.files_total = int(files_total)
        self.callback = callback
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._emit_lock = threading.Lock()
        self._start = clock()
        self._bytes = 0
        self._files = 0
        self._samples: deque[tuple[float, int]] = deque([(self._start, 0)])
        self._last_emit = float("-inf")

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self._bytes += n
        self._maybe_emit()

    def set_bytes(self, n: int) -> None:
        """Absolute byte count (for sources that report a running total, like rsync)."""
        with self._lock:
            self._bytes = max(self._bytes, int(n))
        self._maybe_emit()

    def file_done(self) -> None:
        with self._lock:
            self._files += 1
        self._maybe_emit()

    def report(self) -> ProgressReport:
        now = self._clock()
        with self._lock:
            done, files = self._bytes, self._files
            self._samples.append((now, done))
            while len(self._samples) > 2 and now - self._samples[0][0] > WINDOW_S:
                self._samples.popleft()
            t0, b0 = self._samples[0]
        elapsed = now - self._start
        if now - t0 > 0.2:
            rate = (done - b0) / (now - t0)
        else:
            rate = done / elapsed if elapsed > 0 else 0.0
        remaining = max(0, self.bytes_total - done)
        eta = remaining / rate if rate > 0 else (0.0 if remaining == 0 else None)
        return ProgressReport(self.phase, done, self.bytes_total, files, self.files_total, rate, eta, elapsed)

    def _maybe_emit(self, force: bool = False) -> None:
        if self.callback is None:
            return
        now = self._clock()
        if not force and now - self._last_emit < self.interval:
            return
        if not self._emit_lock.acquire(blocking=force):
            return
        try:
            if not force and now - self._last_emit < self.interval:
                return
            self._last_emit = now
            self.callback(self.report())
        finally:
            self._emit_lock.release()

    def finish(self) -> ProgressReport:
        report = self.report()
        if self.callback is not None:
            self._maybe_emit(force=True)
        return report
