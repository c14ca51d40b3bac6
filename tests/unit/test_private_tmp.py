"""Paths the deployment's units share must not be under /tmp or /var/tmp: every unit has its own there (systemd's
PrivateTmp), so each engine would lock its own failover lock (two cohorts serving) and none would see the GMS
server's socket. Refused by preflight, naming the field; a Slurm job (no units) keeps its node_dir under /tmp."""

from __future__ import annotations

import pytest

from shadowline.slurm.job import build_job_plan

from .test_contract import facts, preflight


@pytest.mark.parametrize(("variables", "field"), [
    ({"gms_socket_dir": "/tmp/shadowline/gms"}, "gms_socket_dir"),
    ({"gms_lock_path": "/var/tmp/shadowline/failover.lock"}, "gms_lock_path"),
    ({"gms_model": {"local_dir": "/tmp/models/llama"}}, "gms_model.local_dir"),
    ({"gms_python": "/tmp/venv/bin/python"}, "gms_python"),
])
def test_a_shared_path_under_a_private_tmp_is_refused(variables, field):
    problems = preflight(facts(), **variables)
    mine = [p for p in problems if p.startswith(f"{field}: ")]
    assert mine and "PrivateTmp" in mine[0] and "outside /tmp and /var/tmp" in mine[0], problems


def test_paths_elsewhere_pass_and_a_slurm_job_keeps_its_node_dir_under_tmp():
    assert preflight(facts(), gms_socket_dir="/run/llama/gms") == []
    shared = {"gms_deployment": "llama", "gms_engine": {"backend": "standin", "tensor_parallel_size": 2, "nnodes": 2},
              "gms_model": {"id": "org/m", "revision": "0123456789abcdef0123456789abcdef01234567",
                            "local_dir": "/scratch/models/m"}, "gms_slurm": {"model_check": False}}
    plan, _options, problems = build_job_plan(shared, 2)
    assert problems == [] and plan is not None and plan.socket_dir.startswith("/tmp/")
