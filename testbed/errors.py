"""The one error of the testbed: its message says what failed and what to do."""

from __future__ import annotations


class TestbedError(RuntimeError):
    """A testbed operation failed; the message says what and what to do."""
