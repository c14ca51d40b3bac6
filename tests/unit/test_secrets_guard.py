"""A controller without the deployment's secrets never mints new ones over a running deployment (an AWX/AAP
execution environment is a fresh container every job): preflight compares the digests each host has installed
with gms_secrets_dir's and refuses, naming gms_secrets_dir, unless gms_secrets_rotate (issue #42)."""

from __future__ import annotations

import pytest

from shadowline.deployment.node_facts import gather
from shadowline.deployment.secrets_guard import (
    GUARDED,
    controller_digests,
    installed_digests,
    minting_problems,
)

from .test_contract import facts, preflight

RUNNING = {"ca.crt": "c1", "etcd-agent.password": "a1", "etcd-root.password": None}
INFRA = {"ca.crt": "c1", "etcd-agent.password": "a1", "etcd-root.password": "r1"}
OURS = {"ca.crt": "c1", "etcd-agent.password": "a1", "etcd-root.password": "r1"}
NOTHING = dict.fromkeys(GUARDED)

CASES = [
    # (the controller's digests, each host's, rotate, the secrets refused)
    (OURS, {"node0": INFRA, "node1": RUNNING}, False, []),  # a run again from the same controller
    (NOTHING, {"node0": None, "node1": None}, False, []),  # a first deployment
    (NOTHING, {"node0": NOTHING, "node1": NOTHING}, False, []),  # deployed plain before, nothing installed
    (OURS, {"node0": INFRA, "node1": None}, False, []),  # a host added to a running deployment
    # a fresh execution environment: everything would be made anew
    (NOTHING, {"node0": INFRA, "node1": RUNNING}, False,
     ["certificate authority", "etcd password of the agents", "etcd root password"]),
    # another controller's (or an old copy's) secrets
    ({**OURS, "ca.crt": "c0"}, {"node0": INFRA, "node1": RUNNING}, False, ["certificate authority"]),
    # a rotation on purpose: the CA and the agents' password may be replaced, etcd's root password never
    ({**OURS, "ca.crt": None, "etcd-agent.password": None}, {"node0": INFRA, "node1": RUNNING}, True, []),
    (NOTHING, {"node0": INFRA, "node1": RUNNING}, True, ["etcd root password"]),
]


@pytest.mark.parametrize(("controller", "installed", "rotate", "refused"), CASES)
def test_what_would_be_made_anew_over_a_running_deployment_is_refused(controller, installed, rotate, refused):
    problems = minting_problems("llama", "/srv/secrets/llama", controller, installed, rotate)
    assert [p.field for p in problems] == ["gms_secrets_dir"] * len(refused)
    for problem, what in zip(problems, refused):
        assert what in problem.message
    if refused and refused[0] == "certificate authority":
        assert "gms_secrets_rotate=true" in problems[0].fix and "docs/awx.md" in problems[0].fix


def test_a_missing_directory_names_the_file_and_the_hosts():
    (problem, *_rest) = minting_problems("llama", "/srv/secrets/llama", NOTHING,
                                         {f"node{i}": RUNNING for i in range(5)}, False)
    assert problem.message == ("deployment llama runs with its certificate authority (ca.crt on node0, node1, node2 "
                               "and 2 more), and /srv/secrets/llama/pki/ca.crt is not there: this run would make a "
                               "new one and install it over the running one.")


def test_digests_are_read_from_both_sides_and_say_nothing_of_the_content(tmp_path):
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.crt").write_text("CERT")
    (tmp_path / "etcd-agent.password").write_text("hunter2\n")
    on_controller = controller_digests(str(tmp_path))
    host = tmp_path / "host"
    host.mkdir()
    (host / "ca.crt").write_text("CERT")
    (host / "etcd-agent.password").write_text("hunter2\n")
    assert installed_digests(str(host)) == on_controller
    assert on_controller["etcd-root.password"] is None
    assert all(d is None or (len(d) == 64 and "hunter2" not in d) for d in on_controller.values())


def test_preflight_refuses_a_controller_without_the_running_deployments_secrets(tmp_path):
    running = facts(installed_secrets=RUNNING)
    (msg, *_rest) = preflight(running, gms_secrets_dir=str(tmp_path / "fresh"))
    assert msg.startswith("gms_secrets_dir: deployment llama runs with its certificate authority (ca.crt on node0)")
    assert preflight(running, gms_secrets_dir=str(tmp_path / "fresh"), gms_secrets_rotate=True) == []
    assert preflight(running, gms_secrets_dir=str(tmp_path / "fresh"), gms_insecure=True) == []
    assert preflight(facts(), gms_secrets_dir=str(tmp_path / "fresh")) == []


def test_the_node_fact_is_none_before_a_first_deployment(tmp_path):
    assert gather(deployment="never-deployed-here", lock_path=None, python=None, backend=None, model_dir=None,
                  service_user=None)["installed_secrets"] is None
