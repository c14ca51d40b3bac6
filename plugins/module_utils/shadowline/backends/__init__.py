"""Engine backends, one strategy each: what a backend runs (argv modules, environment), what its runtime must
import, and which progress signals its ranks expose. The plan, the agent, the drills and the status table ask
the backend instead of branching on its name; a new backend (SGLang) is one new file registered here."""

from __future__ import annotations

from .base import Backend
from .dynamo_vllm import DYNAMO_VLLM
from .standin import STANDIN

BACKENDS: dict[str, Backend] = {b.name: b for b in (DYNAMO_VLLM, STANDIN)}
NAMES: list[str] = list(BACKENDS)


def backend(name: str) -> Backend:
    """The strategy of a backend named in the plan (`gms_engine.backend`)."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown engine backend {name!r}; known: {', '.join(NAMES)}") from None


__all__ = ["BACKENDS", "NAMES", "Backend", "backend"]
