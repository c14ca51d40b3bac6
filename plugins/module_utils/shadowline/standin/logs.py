"""Logging of the stand-in processes: one line per event, UTC timestamps, to stderr."""

from __future__ import annotations

import logging
import sys
import time


def setup(name: str) -> logging.Logger:
    handler = logging.StreamHandler(sys.stderr)
    fmt = logging.Formatter("%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S")
    fmt.converter = time.gmtime
    handler.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    return logging.getLogger(name)
