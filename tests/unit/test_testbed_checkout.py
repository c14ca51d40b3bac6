"""The testbed refuses at once, naming the reason and the fix, a checkout its hosts cannot see."""

from __future__ import annotations

from pathlib import Path

from testbed.lifecycle import checkout_hidden


def test_a_checkout_under_tmp_is_refused_with_the_fix():
    reason = checkout_hidden(Path("/tmp/shadowline"))
    assert reason is not None and "/tmp/shadowline is under /tmp" in reason and "Fix: clone" in reason
    assert checkout_hidden(Path("/run/user/0/shadowline")) is not None


def test_other_checkouts_are_fine():
    assert checkout_hidden(Path("/srv/shadowline")) is None
    assert checkout_hidden(Path("/tmpfoo/shadowline")) is None
    assert checkout_hidden(Path(__file__).resolve().parents[2]) is None  # this checkout runs the testbed tests
