"""One node, two (then three) single-rank cohorts sharing a lock file and a GMS server, with the
real dynamo.frontend and dynamo.mocker: promotion on SIGKILL, a frozen primary keeps the lock, the
crash fault, clean SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import time

from shadowline.common import failover_metrics as fm
from shadowline.common import lock

from . import harness

GPU = "GPU-5c1e7d2a-0000-4000-8000-000000000001"
SHADOW_LIFECYCLE = [
    "[Shadow] failover_state engine={id} -> init",
    "[Shadow] failover_state engine={id} -> standby",
    "[Shadow] Engine paused, startup probe now passing, waiting for lock",
    "Failover lock acquired: engine-{id}",
    "[Shadow] Lock acquired, waking engine",
    "[Shadow] failover_state engine={id} -> waking",
    "[Shadow] Engine awake, registering with discovery",
    "[Shadow] failover_state engine={id} -> active",
]


def assert_in_order(text: str, lines: list[str]) -> None:
    pos = 0
    for line in lines:
        found = text.find(line, pos)
        assert found >= 0, f"missing (in order): {line!r}"
        pos = found + len(line)


def read_bytes_while_loading(text: str) -> int:
    return int(re.search(r"this process read (\d+) bytes while loading", text).group(1))


def state_of(port: int, engine_id: str) -> fm.EngineFailoverView:
    return fm.engine_failover_view(harness.metrics(port))[engine_id]


def test_one_node_two_cohorts(procs, session_procs, infra, model, short_dir, tmp_path):  # noqa: PLR0915 (over the size limits of pyproject.toml; split it when it changes next)
    name = "tiny-failover"
    lock_path = tmp_path / "failover.lock"
    gms = procs.start("gms", [str(harness.RUNTIME_PY), "-m", "shadowline.standin.gms_server"],
                      {"PATH": os.environ["PATH"], "GMS_SOCKET_DIR": str(short_dir), "SHADOWLINE_STANDIN_GPUS": GPU})
    harness.wait_until((short_dir / "gms_ready").exists, 10, what="gms_ready")
    env = harness.dynamo_env(infra, GMS_SOCKET_DIR=str(short_dir), SHADOWLINE_STANDIN_GPUS=GPU,
                             FAILOVER_LOCK_PATH=str(lock_path), DYN_VLLM_GMS_SHADOW_MODE="true")
    ports = {i: harness.free_port() for i in range(3)}

    def engine(i: int) -> harness.Proc:
        return procs.start(f"engine-{i}", harness.engine_argv(model, name),
                           {**env, "ENGINE_ID": str(i), "DYN_SYSTEM_PORT": str(ports[i]),
                            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(harness.free_port())})

    # Primary: loads from disk, publishes, wins the uncontended lock, registers.
    e0 = engine(0)
    e0.wait_log("[Shadow] Engine awake, registering with discovery", 30)
    assert_in_order(e0.text(), [line.format(id=0) for line in SHADOW_LIFECYCLE])
    assert lock.read_holder(str(lock_path)) == "engine-0"

    def served() -> tuple[int, str] | None:
        answer = harness.chat(infra.frontend, name)
        return answer if answer[0] == 200 else None

    status, body = harness.wait_until(served, 15, 0.1, "a completion through the frontend")
    assert json.loads(body)["usage"]["completion_tokens"] > 0
    assert read_bytes_while_loading(e0.text()) > os.path.getsize(model / "model-00001-of-00002.safetensors")

    # Shadow: imports from GMS, parks in standby, healthy, invisible.
    booted = time.monotonic()
    e1 = engine(1)
    parked = e1.wait_log("[Shadow] Engine paused, startup probe now passing, waiting for lock", 20)
    print(f"\nshadow boot to standby (as seen by the test): {parked - booted:.2f} s")
    e1.wait_log("is warm", 20)  # a shadow parks for long: let its pre-started worker finish importing
    assert harness.http("GET", f"http://127.0.0.1:{ports[1]}/health")[0] == 200
    v1 = state_of(ports[1], "1")
    assert (v1.state, v1.attempts, v1.success, v1.model, v1.component) == ("standby", 0, 0, name, "backend")
    assert read_bytes_while_loading(e1.text()) < 64 * 1024  # zero bytes of the model
    assert "Failover lock acquired" not in e1.text()
    ours = harness.assert_loopback_only(procs)
    assert any(p == ports[0] for _unused1, p, _unused2 in ours) and any(p == ports[1] for _unused1, p, _unused2 in ours)
    for label, pid in (("primary leader", e0.pid), ("shadow leader", e1.pid), ("GMS server", gms.pid)):
        print(f"memory of {label}: {harness.memory_kib(pid)} KiB")

    # SIGKILL of the primary leader: its worker dies with it, the shadow takes over.
    e0_pids = procs.pids() & {pid for pid in procs.pids() if os.getsid(pid) == e0.pid}
    killed = time.monotonic()
    os.kill(e0.pid, signal.SIGKILL)
    harness.wait_until(lambda: lock.read_holder(str(lock_path)) == "engine-1", 5, 0.005, "engine-1 in the lock file")
    locked = time.monotonic()
    harness.wait_until(lambda: harness.chat(infra.frontend, name, timeout=2)[0] == 200 and
                       "[Shadow] Engine awake" in e1.text(), 20, 0.02, "a completion served by engine 1")
    served = time.monotonic()
    print(f"SIGKILL of primary -> lock acquired {locked - killed:.3f} s, -> first completion {served - killed:.3f} s")
    harness.wait_until(lambda: not (procs.pids() & e0_pids), 5, what="engine 0's worker to die with it")
    assert_in_order(e1.text(), [line.format(id=1) for line in SHADOW_LIFECYCLE])
    v1 = state_of(ports[1], "1")
    assert (v1.state, v1.attempts, v1.success) == ("active", 1, 1)
    harness.assert_loopback_only(session_procs)  # etcd, NATS, frontend
    assert json.loads((tmp_path / "failover_metrics_engine-1.json").read_text()) == {"attempts": 1, "success": 1}
    harness.assert_loopback_only(procs)

    # A third cohort parks; the primary's whole process group is frozen: it keeps the lock.
    e2 = engine(2)
    e2.wait_log("[Shadow] Engine paused, startup probe now passing, waiting for lock", 20)
    e1.signal_group(signal.SIGSTOP)
    time.sleep(2.5)
    assert lock.is_locked(str(lock_path)) and lock.read_holder(str(lock_path)) == "engine-1"
    assert "Failover lock acquired" not in e2.text()
    assert harness.http("GET", f"http://127.0.0.1:{ports[1]}/health", timeout=0.5)[0] == 0  # frozen: no answer
    e1.signal_group(signal.SIGCONT)
    assert harness.http("GET", f"http://127.0.0.1:{ports[1]}/health")[0] == 200

    # The crash fault through the control file: engine 1 exits non-zero, engine 2 takes over.
    (tmp_path / "fault-engine-1").write_text("crash\n")
    assert e1.popen.wait(5) == 134
    e2.wait_log("[Shadow] Engine awake, registering with discovery", 20)
    assert lock.read_holder(str(lock_path)) == "engine-2"
    harness.wait_until(lambda: harness.chat(infra.frontend, name, timeout=2)[0] == 200, 20, 0.05, "engine 2 serving")
    (tmp_path / "fault-engine-1").unlink()

    # SIGTERM: the worker stops, the lock is released, exit 0.
    e2.popen.send_signal(signal.SIGTERM)
    assert e2.popen.wait(15) == 0
    assert "Failover lock released: engine-2" in e2.text()
    assert not lock.is_locked(str(lock_path))
    assert not (procs.pids() - {gms.pid})  # no worker left behind
