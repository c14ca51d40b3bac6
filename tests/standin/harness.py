"""Helpers shared by the stand-in tests and tests/standin/measure_failover.py.

Everything listens on 127.0.0.1 on ports from ``free_port``. Every process is started in its own
session (``start_new_session``), so ``Procs.kill_all`` can kill each whole process group (a leader
and its dynamo.mocker) and ``Procs.leftovers`` can prove nothing of ours survived.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNTIME_PY = REPO / ".runtime" / "bin" / "python"
LIB = REPO / "plugins" / "module_utils"
for _path in (REPO, LIB):  # measure_failover.py imports this file as the top-level module ``harness``
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from shadowline.cluster.waits import listening_check  # noqa: E402  (after the path above)
from tests.loopback import HOST, etcd_argv, free_port, wait_healthy, wait_until  # noqa: E402  (harness.free_port ...)


def ensure_runtime() -> Path:
    """Run scripts/install-runtime (a no-op when .runtime matches the lock)."""
    subprocess.run([str(REPO / "scripts" / "install-runtime")], check=True)
    assert RUNTIME_PY.exists()
    return RUNTIME_PY


def make_model(directory: Path, *extra: str) -> Path:
    subprocess.run([str(RUNTIME_PY), str(REPO / "scripts" / "make-tiny-model"), str(directory), *extra],
                   check=True, capture_output=True)
    return directory


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_log(self, needle: str, timeout: float = 20.0) -> float:
        """Wait for ``needle`` in the log; returns the monotonic time it was seen."""
        def seen() -> bool:
            if needle in self.text():
                return True
            if not self.alive():
                raise AssertionError(f"{self.name} exited with {self.popen.returncode} before logging {needle!r}:\n"
                                     + self.text()[-3000:])
            return False
        wait_until(seen, timeout, what=f"{needle!r} in {self.name}'s log")
        return time.monotonic()

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass


@dataclass
class Procs:
    logdir: Path
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict[str, str], cwd: Path | None = None) -> Proc:
        log = self.logdir / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, cwd=cwd)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def sessions(self) -> set[int]:
        return {p.pid for p in self.procs}

    def pids(self) -> set[int]:
        """Every live process in one of our sessions (leaders and their workers)."""
        ours = self.sessions()
        found = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[3]) in ours:  # state, ppid, pgrp, session
                found.add(int(entry))
        return found

    def kill_all(self) -> None:
        for p in self.procs:
            p.signal_group(signal.SIGCONT)
            p.signal_group(signal.SIGKILL)
        for p in self.procs:
            try:
                p.popen.wait(10)
            except subprocess.TimeoutExpired:
                pass
        wait_until(lambda: not self.pids(), 10, what="every test process to be gone")

    def leftovers(self) -> set[int]:
        return self.pids()


def listeners() -> list[tuple[str, int, set[int]]]:
    """TCP listeners as (address, port, owner pids) from ``ss -ltnpH``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    result = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        addr, _unused, port = parts[3].rpartition(":")
        pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        result.append((addr.strip("[]"), int(port), pids))
    return result


def assert_loopback_only(procs: Procs) -> list[tuple[str, int, set[int]]]:
    """Fail if any process of ours listens on anything but loopback; returns our listeners."""
    ours = procs.pids()
    mine = [(a, p, pids) for a, p, pids in listeners() if pids & ours]
    bad = [(a, p) for a, p, _unused in mine if not (a.startswith("127.") or a == "::1")]
    assert not bad, f"listeners of test processes off loopback: {bad}"
    return mine


def http(method: str, url: str, body: dict | None = None, timeout: float = 5.0) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, TimeoutError) as e:
        return 0, str(e)


def chat(frontend: str, model: str, timeout: float = 5.0) -> tuple[int, str]:
    return http("POST", f"{frontend}/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
    }, timeout)


@dataclass
class Infra:
    etcd: str
    nats: str
    frontend: str
    home: Path


def start_infra(procs: Procs, workdir: Path) -> Infra:
    """etcd, NATS (JetStream) and the real dynamo.frontend, all on 127.0.0.1."""
    missing = [tool for tool in ("etcd", "nats-server") if not shutil.which(tool)]
    assert not missing, (f"{', '.join(missing)} not installed: run scripts/setup-system "
                         "(or apt-get install -y etcd-server etcd-client nats-server)")
    ns, fe = free_port(), free_port()
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    etcd_cmd, etcd_url = etcd_argv("standin-test", workdir / "etcd")
    etcd = procs.start("etcd", etcd_cmd, {"PATH": os.environ["PATH"]})
    nats = procs.start("nats", ["nats-server", "-js", "-a", HOST, "-p", str(ns), "--store_dir", str(workdir / "nats")],
                       {"PATH": os.environ["PATH"]})
    infra = Infra(etcd_url, f"nats://{HOST}:{ns}", f"http://{HOST}:{fe}", home)
    wait_healthy(infra.etcd)
    wait_until(lambda: listening_check(HOST, [ns])() is None, 20, what="nats")
    procs.start("frontend", [str(RUNTIME_PY), "-m", "dynamo.frontend", "--http-host", HOST, "--http-port", str(fe)],
                dynamo_env(infra))
    wait_until(lambda: http("GET", f"{infra.frontend}/health", timeout=1)[0] == 200, 30, what="frontend")
    del etcd, nats
    return infra


def dynamo_env(infra: Infra, **extra: str) -> dict[str, str]:
    """Environment of Dynamo processes on this loopback 'node'."""
    env = {
        "PATH": os.environ["PATH"],
        "LANG": "C.UTF-8",
        "HOME": str(infra.home),
        "ETCD_ENDPOINTS": infra.etcd,
        "NATS_SERVER": infra.nats,
        "HF_HUB_OFFLINE": "1",
        "DYN_SYSTEM_HOST": HOST,
        "DYN_TCP_RPC_HOST": HOST,
        "DYN_TCP_RESPONSE_STREAM_HOST": HOST,
        "DYN_EVENT_PLANE": "nats",
        "ETCD_LEASE_TTL": "5",
    }
    env.update(extra)
    return env


def engine_argv(model: Path, name: str, tp: int = 1, nnodes: int = 1, rank: int = 0,
                master_port: int | None = None) -> list[str]:
    """The real dynamo.vllm argv, with the stand-in as the executable."""
    argv = [str(RUNTIME_PY), "-m", "shadowline.standin.engine", "--model", str(model), "--served-model-name", name,
            "--load-format", "gms", "--enforce-eager", "--enable-sleep-mode", "--tensor-parallel-size", str(tp)]
    if nnodes > 1:
        argv += ["--distributed-executor-backend", "mp", "--nnodes", str(nnodes), "--node-rank", str(rank),
                 "--master-addr", HOST, "--master-port", str(master_port)]
        if rank > 0:
            argv.append("--headless")
    return argv


def metrics(port: int) -> str:
    return http("GET", f"http://{HOST}:{port}/metrics", timeout=2)[1]


def memory_kib(pid: int) -> dict[str, int]:
    """Rss, Pss and private (USS) memory of a process, in KiB (shared memfd pages count in Rss of
    every process that touched them, and only once in the sum of Pss)."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _unused, rest = line.partition(":")
        if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
            out[key] = int(rest.split()[0])
    return {"rss": out.get("Rss", 0), "pss": out.get("Pss", 0),
            "uss": out.get("Private_Clean", 0) + out.get("Private_Dirty", 0)}
