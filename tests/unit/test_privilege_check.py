"""The roles need root on every host; an SSH user that is not root must come with ``ansible_become: true``.
Preflight asks each node who the modules run as (after become) and refuses anyone else by name, before anything
changes, instead of failing deep inside site.yml (issue #42). The testbed proves the other half: site.yml converges
as a non-root SSH user with become (tests/e2e/test_site.py)."""

from __future__ import annotations

import os

from shadowline.deployment.node_facts import privilege_facts
from shadowline.deployment.preflight import privilege_problems

from .test_contract import facts, preflight


def test_the_node_says_who_the_modules_run_as():
    mine = privilege_facts()
    assert mine["uid"] == os.geteuid() and isinstance(mine["user"], str) and mine["user"]


def test_preflight_refuses_a_host_where_the_modules_do_not_run_as_root():
    (msg,) = preflight(facts(privilege={"uid": 1000, "user": "ops"}))
    assert msg.startswith("ansible_become (host node0): the modules run as ops (uid 1000) on this host, not as root")
    assert "ansible_become: true" in msg and "ansible_user: root" in msg
    assert preflight(facts(privilege={"uid": 0, "user": "root"})) == []


def test_facts_of_an_older_module_without_the_privilege_pass():
    assert privilege_problems("node0", None) == []


def test_a_host_that_is_not_root_is_refused_alone_from_its_few_facts():
    """Not root, the node module reads nothing else (the deployment's secrets and other users' /proc are closed to
    it): preflight names that one problem for the host and checks the rest of it no further."""
    (msg,) = preflight({"privilege": {"uid": 1000, "user": "ops"}})
    assert msg.startswith("ansible_become (host node0):")
    (one, two) = preflight({"privilege": {"uid": 1000, "user": "ops"}}, nodes=2)
    assert (one.split(":")[0], two.split(":")[0]) == ("ansible_become (host node0)", "ansible_become (host node1)")
