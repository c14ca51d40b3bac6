#!/usr/bin/env python3
"""Measure the stand-in on loopback: boot to standby, SIGKILL of the primary to lock acquired and to
the first completion through the real frontend (several trials), memory per process.

    .venv/bin/python tests/standin/measure_failover.py [--trials 5]

Not a test (pytest does not collect it); it uses the same harness and cleans up the same way.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from shadowline.common import lock  # noqa: E402

GPUS = ["GPU-7a1c0000-0000-4000-8000-0000000000m0", "GPU-7a1c0000-0000-4000-8000-0000000000m1"]


def log_time(text: str, needle: str) -> float:
    """Unix time of the first log line containing ``needle`` (the stand-in's UTC timestamps)."""
    for line in text.splitlines():
        if needle in line:
            m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3})Z", line)
            if m:
                return time.mktime(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) - time.timezone + int(m.group(2)) / 1000
    raise KeyError(needle)


def main() -> int:  # noqa: PLR0915 (over the size limits of pyproject.toml; split it when it changes next)
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    harness.ensure_runtime()
    work = Path(tempfile.mkdtemp(prefix="sl-measure-"))
    procs = harness.Procs(work)
    results = []
    try:
        model = harness.make_model(work / "model", "--layers", "4", "--hidden", "512")
        infra = harness.start_infra(procs, work / "infra")
        gms_dir, gms2_dir = work / "gms", work / "gms2"
        for d, gpus in ((gms_dir, GPUS[:1]), (gms2_dir, GPUS)):
            d.mkdir()
            procs.start(f"gms-{d.name}", [str(harness.RUNTIME_PY), "-m", "shadowline.standin.gms_server"],
                        {"PATH": os.environ["PATH"], "GMS_SOCKET_DIR": str(d), "SHADOWLINE_STANDIN_GPUS": ",".join(gpus)})
            harness.wait_until(lambda d=d: (d / "gms_ready").exists(), 10, what="gms_ready")
        lock_path = work / "lock" / "failover.lock"
        env = harness.dynamo_env(infra, GMS_SOCKET_DIR=str(gms_dir), SHADOWLINE_STANDIN_GPUS=GPUS[0],
                                 FAILOVER_LOCK_PATH=str(lock_path), DYN_VLLM_GMS_SHADOW_MODE="true")
        name = "tiny-measure"

        def engine(i: int) -> tuple[harness.Proc, float]:
            t = time.time()
            p = procs.start(f"engine-{i}", harness.engine_argv(model, name),
                            {**env, "ENGINE_ID": str(i), "DYN_SYSTEM_PORT": str(harness.free_port())})
            return p, t

        primary, t0 = engine(0)
        primary.wait_log("[Shadow] Engine awake", 30)
        print(f"engine 0 (writer, loads 44 MB from disk): start -> standby "
              f"{log_time(primary.text(), 'Engine paused') - t0:.3f} s, -> active "
              f"{log_time(primary.text(), 'Engine awake') - t0:.3f} s")
        harness.wait_until(lambda: harness.chat(infra.frontend, name)[0] == 200, 20, 0.1, "first completion")
        mem = {"GMS server": harness.memory_kib(procs.procs[3].pid)}
        for i in range(1, args.trials + 1):
            shadow, ts = engine(i)
            shadow.wait_log("[Shadow] Engine paused", 20)
            shadow.wait_log("is warm", 20)
            boot = log_time(shadow.text(), "Engine paused") - ts
            if i == 1:
                mem["shadow leader (standby)"] = harness.memory_kib(shadow.pid)
                warm = [p for p in procs.pids() if os.getsid(p) == shadow.pid and p != shadow.pid]
                mem["pre-started worker (parked)"] = harness.memory_kib(warm[0])
                mem["primary leader (active)"] = harness.memory_kib(primary.pid)
                worker = [p for p in procs.pids() if os.getsid(p) == primary.pid and p != primary.pid]
                mem["dynamo.mocker worker (active)"] = harness.memory_kib(worker[0])
            time.sleep(1.0)
            failures = 0
            killed = time.monotonic()
            os.kill(primary.pid, signal.SIGKILL)
            harness.wait_until(lambda i=i: lock.read_holder(str(lock_path)) == f"engine-{i}", 5, 0.002, "lock")
            locked = time.monotonic()
            while True:
                status, _unused = harness.chat(infra.frontend, name, timeout=2)
                if status == 200:
                    break
                failures += 1
                time.sleep(0.01)
            served = time.monotonic()
            wake = log_time(shadow.text(), "Engine awake") - log_time(shadow.text(), "Failover lock acquired")
            results.append((boot, locked - killed, served - killed, wake, failures))
            print(f"trial {i}: boot->standby {boot:.3f} s, kill->lock {locked - killed:.3f} s, "
                  f"kill->first completion {served - killed:.3f} s (wake {wake:.3f} s, {failures} failed requests)")
            primary = shadow

        # A two-rank cohort (TP 2 over two loopback 'nodes'), parked: memory of a headless rank.
        held = lock.acquire(str(work / "lock2"), 99)
        master = harness.free_port()
        env2 = {**env, "GMS_SOCKET_DIR": str(gms2_dir), "FAILOVER_LOCK_PATH": str(work / "lock2"), "ENGINE_ID": "0"}
        ranks = [procs.start(f"rank-{r}", harness.engine_argv(model, "tiny2", tp=2, nnodes=2, rank=r, master_port=master),
                             {**env2, "SHADOWLINE_STANDIN_GPUS": GPUS[r], "DYN_SYSTEM_PORT": str(harness.free_port())})
                 for r in (0, 1)]
        ranks[0].wait_log("[Shadow] Engine paused", 20)
        mem["rank 0 of TP2 cohort (standby, writer)"] = harness.memory_kib(ranks[0].pid)
        mem["headless rank 1 of TP2 cohort"] = harness.memory_kib(ranks[1].pid)
        held.release()
        for what, m in mem.items():
            print(f"memory {what}: RSS {m['rss'] / 1024:.1f} MiB, PSS {m['pss'] / 1024:.1f} MiB, "
                  f"private {m['uss'] / 1024:.1f} MiB")
        for i, label in enumerate(["boot->standby", "kill->lock", "kill->first completion", "wake"]):
            vals = [r[i] for r in results]
            print(f"{label}: median {statistics.median(vals):.3f} s, min {min(vals):.3f}, max {max(vals):.3f}")
        harness.assert_loopback_only(procs)
    finally:
        procs.kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
