"""Tests of the testbed itself (run as root): /work/main/.venv/bin/pytest tests/testbed -x -q"""

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from testbed.pytest_fixtures import skip_reason, testbed  # noqa: E402  (testbed: the session fixture)

__all__ = ["testbed"]  # the session fixture these tests use, offered to them from here


@pytest.fixture(autouse=True)
def _needs_root_and_packages() -> None:
    """Also for the tests that call up()/down() without the fixture."""
    if reason := skip_reason():
        pytest.skip(reason)
