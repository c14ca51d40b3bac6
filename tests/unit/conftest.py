"""Fixtures of the unit tests that need a real etcd (one on loopback per test, tests/loopback.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shadowline.common.etcd_client import Etcd
from tests.loopback import start_etcd


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Etcd]:
    """A client of a fresh etcd of this test's own."""
    server = start_etcd(tmp_path)
    try:
        yield Etcd(server.url)
    finally:
        server.stop()
