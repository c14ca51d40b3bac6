"""How the agent's threads hand things to its loop: they put them in a queue and write a byte to the loop's wake-up
pipe (agent.py polls it beside the ranks' pidfds); the loop drains the queues each tick."""

from __future__ import annotations

import os
import queue
from typing import TypeVar

T = TypeVar("T")


def drain(items: queue.Queue[T]) -> list[T]:
    """Everything a queue holds now (what the threads put there since the last tick)."""
    taken = []
    while True:
        try:
            taken.append(items.get_nowait())
        except queue.Empty:
            return taken


def wake(fd: int, why: bytes) -> None:
    """Wake the loop; a full pipe (the loop has unread wake-ups already) or a closed one (it ended) is no error."""
    try:
        os.write(fd, why)
    except OSError:
        pass
