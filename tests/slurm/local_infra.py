"""Loopback helpers of the tests/slurm unit tests: a real etcd (and, for discovery, NATS + frontend + workers).

Everything listens on 127.0.0.1 on free ports, in its own session, and is killed (whole process group)
when the fixture ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_until(fn, timeout: float, interval: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def http_status(url: str, timeout: float = 1.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


@dataclass
class LocalEtcd:
    url: str
    process: subprocess.Popen
    data_dir: Path

    def stop(self) -> None:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass
        self.process.wait(10)


def start_etcd(workdir: Path) -> LocalEtcd:
    client, peer = free_port(), free_port()
    data = workdir / "etcd"
    log = open(workdir / "etcd.log", "wb")
    with log:
        proc = subprocess.Popen([
            ETCD, "--name", "slurm-test", "--data-dir", str(data),
            "--listen-client-urls", f"http://{HOST}:{client}", "--advertise-client-urls", f"http://{HOST}:{client}",
            "--listen-peer-urls", f"http://{HOST}:{peer}", "--initial-advertise-peer-urls", f"http://{HOST}:{peer}",
            "--initial-cluster", f"slurm-test=http://{HOST}:{peer}",
        ], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    etcd = LocalEtcd(f"http://{HOST}:{client}", proc, data)
    try:
        wait_until(lambda: http_status(f"{etcd.url}/health") == 200, 20, what="etcd /health")
    except AssertionError:
        etcd.stop()
        raise
    return etcd


def free_port_run(count: int, low: int = 20000, high: int = 28999) -> int:
    """The first of ``count`` consecutive ports that are free on loopback (for system_base + cohort)."""
    import random
    rng = random.Random()
    for _ in range(200):
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
                  etcd: str | None = None, **extra) -> dict:
    """The cohort plan (dict form) of a one-node deployment on 127.0.0.1 with free system ports."""
    from shadowline.contract import parse_contract
    from shadowline.plan import build_plan

    base = free_port_run(cohorts)
    values = {
        "gms_deployment": "slurmtest", "gms_node_rank": 0, "ansible_host": HOST, "gms_cohorts": cohorts,
        "gms_model": {"id": model_id, "revision": "0" * 40, "local_dir": model_dir, "source": f"file://{model_dir}-src"},
        "gms_engine": {"backend": backend, "tensor_parallel_size": 1},
        "gms_ports": {"system_base": base, "nixl_base": base + 100, "master_base": base + 200},
        "gms_python": "/usr/bin/python3", **extra,
    }
    contract, problems = parse_contract({"local0": values}, ["local0"])
    assert contract is not None, problems
    plan = build_plan(contract).to_dict()
    if etcd:
        plan["infra"]["etcd_endpoints"] = etcd
    return plan
