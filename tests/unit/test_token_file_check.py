"""gms_model_hf_token_file is read on the nodes (the model module, model/hf_token.py), so preflight checks it there,
by the module's own rules, for hf:// sources; the docs' examples once put it on the controller, where nothing reads
it, and the first failure came at staging (issue #42). The token never leaves the node's check."""

from __future__ import annotations

from pathlib import Path

from shadowline.deployment.node_facts import token_file_facts

from .test_contract import facts, preflight

HF = {"gms_model": {"source": "hf://meta-llama/Llama-3.3-70B-Instruct"}, "gms_model_hf_token_file": "/etc/shadowline/hf-token"}


def test_the_node_says_whether_the_module_could_read_it_and_never_the_token(tmp_path: Path):
    good = tmp_path / "token"
    good.write_text("hf_secretvalue\n")
    good.chmod(0o600)
    assert token_file_facts(str(good)) == {"ok": True}
    missing = token_file_facts(str(tmp_path / "nope"))
    assert not missing["ok"] and missing["message"].startswith(f"{tmp_path / 'nope'} does not exist on")
    good.chmod(0o644)
    loose = token_file_facts(str(good))
    assert not loose["ok"] and "group/others" in loose["message"] and "chmod 0600" in loose["fix"]
    assert "hf_secretvalue" not in repr(loose)


def test_preflight_refuses_a_token_file_the_node_cannot_read_for_a_hub_source():
    unreadable = facts(hf_token_file={"ok": False, "message": "/etc/shadowline/hf-token does not exist on node0.",
                                      "fix": "install it on every node (mode 0600, owner root), or unset it."})
    (msg,) = preflight(unreadable, **HF)
    assert msg.startswith("gms_model_hf_token_file (host node0): /etc/shadowline/hf-token does not exist on node0.")
    assert preflight(facts(hf_token_file={"ok": True}), **HF) == []
    local = {**HF, "gms_model": {"source": "file:///srv/models/llama"}}
    assert preflight(unreadable, **local) == [], "a file:// source reads no token"
