"""shadowline.gms.wait_ready's failure message (plugins/modules/wait_ready.py): the unit's own last lines, as
``journalctl -u UNIT -o json`` gives them, without systemd's lines about the unit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wait_ready():
    """The module, imported as Ansible loads it: through collections/ (a link `make setup` makes)."""
    sys.path.insert(0, str(REPO / "collections"))
    try:
        return pytest.importorskip("ansible_collections.shadowline.gms.plugins.modules.wait_ready")
    finally:
        sys.path.remove(str(REPO / "collections"))


def journal(*entries: tuple[str, object]) -> str:
    return "\n".join(json.dumps({"_PID": pid, "MESSAGE": message}) for pid, message in entries)


def test_an_engines_error_stays_in_the_message_after_systemds_lines_and_a_relaunch(wait_ready) -> None:
    out = journal(
        ("1", "Started shadowline engine cohort 1."),
        ("4242", "usage: dynamo.vllm [-h] ..."),
        ("4242", "dynamo.vllm: error: argument --max-model-len: 'lots' is not a number of tokens (e.g. 32768 or 32k)"),
        ("1", "shadowline-engine@1.service: Main process exited, code=exited, status=2/INVALIDARGUMENT"),
        ("1", "shadowline-engine@1.service: Failed with result 'exit-code'."),
        ("1", "shadowline-engine@1.service: Consumed 1.204s CPU time."),
        ("1", "Stopped shadowline engine cohort 1."),
        ("1", "Started shadowline engine cohort 1."),
        ("1", "shadowline-engine@1.service: Main process exited, code=exited, status=2/INVALIDARGUMENT"),
        ("1", "shadowline-engine@1.service: Failed with result 'exit-code'."),
    )
    lines = wait_ready.own_lines(out, 5)
    assert lines[-1].endswith("is not a number of tokens (e.g. 32768 or 32k)")
    assert not [line for line in lines if "service:" in line or line.startswith(("Started", "Stopped"))]


def test_a_message_journald_gives_as_bytes_is_decoded_and_junk_is_skipped(wait_ready) -> None:
    out = journal(("7", list("héllo".encode()))) + "\nnot json\n" + journal(("7", ""), ("7", None))
    assert wait_ready.own_lines(out, 5) == ["héllo"]
