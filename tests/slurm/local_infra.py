"""Loopback helpers of the tests/slurm unit tests: free port runs and a one-node cohort plan on 127.0.0.1.

Free ports, bounded waits and a local etcd are tests/loopback.py's.
"""

from __future__ import annotations

import dataclasses
import socket

from shadowline.deployment.plan import Plan

from ..loopback import HOST


def free_port_run(count: int, low: int = 20000, high: int = 28999) -> int:
    """The first of ``count`` consecutive ports that are free on loopback (for system_base + cohort)."""
    import random
    rng = random.Random()
    for _unused in range(200):
        base = rng.randint(low, high - count)
        ok = True
        for port in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind((HOST, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise AssertionError("no run of free ports")


def loopback_plan(model_id: str, model_dir: str, cohorts: int = 2, backend: str = "dynamo_vllm",
                  etcd: str | None = None, **extra) -> Plan:
    """The cohort plan of a one-node deployment on 127.0.0.1 with free system ports (etcd: the loopback one)."""
    from shadowline.deployment.contract import parse_contract
    from shadowline.deployment.plan_builder import build_plan

    base = free_port_run(cohorts, high=23000)  # below the etcd proxy's 23790..23792 (the plan refuses a collision)
    values = {
        "gms_deployment": "slurmtest", "gms_node_rank": 0, "ansible_host": HOST, "gms_cohorts": cohorts,
        "gms_model": {"id": model_id, "revision": "0" * 40, "local_dir": model_dir, "source": f"file://{model_dir}-src"},
        "gms_engine": {"backend": backend, "tensor_parallel_size": 1},
        "gms_ports": {"system_base": base, "nixl_base": base + 100, "master_base": base + 200},
        "gms_python": "/usr/bin/python3", **extra,
    }
    contract, problems = parse_contract({"local0": values}, ["local0"])
    assert contract is not None, problems
    plan = build_plan(contract, model_view=False)  # processes outside the roles' units name the model itself
    if etcd:
        plan = dataclasses.replace(plan, infra=dataclasses.replace(plan.infra, etcd_endpoints=etcd))
    return plan
