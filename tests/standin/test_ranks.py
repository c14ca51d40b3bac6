"""Two ranks of one engine on loopback: rendezvous, heartbeat collective, NCCL-like hangs."""

from __future__ import annotations

import os
import signal
import time

import pytest

from shadowline.common import failover_metrics as fm
from shadowline.common import lock

from . import harness

GPUS = ["GPU-9d0e5b7c-0000-4000-8000-0000000000a0", "GPU-9d0e5b7c-0000-4000-8000-0000000000a1"]


def heartbeat(path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def advancing(path, within: float = 2.0) -> bool:
    first = heartbeat(path)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if heartbeat(path) not in ("", first):
            return True
    return False


@pytest.fixture
def cohort(procs, model, short_dir, tmp_path, runtime):
    """Start engine 0 with TP 2 over two 'nodes' (ranks 0 and 1 on 127.0.0.1), parked in standby
    because the test holds the failover lock. Returns a starter taking extra env for both ranks."""
    procs.start("gms", [str(harness.RUNTIME_PY), "-m", "shadowline.standin.gms_server"],
                {"PATH": os.environ["PATH"], "GMS_SOCKET_DIR": str(short_dir), "SHADOWLINE_STANDIN_GPUS": ",".join(GPUS)})
    harness.wait_until((short_dir / "gms_ready").exists, 10, what="gms_ready")
    lock_path = tmp_path / "failover.lock"
    held = lock.acquire(str(lock_path), 99)
    master = harness.free_port()

    def start(**extra: str):
        env = {"PATH": os.environ["PATH"], "GMS_SOCKET_DIR": str(short_dir), "FAILOVER_LOCK_PATH": str(lock_path),
               "DYN_VLLM_GMS_SHADOW_MODE": "true", "DYN_SYSTEM_HOST": "127.0.0.1", "ENGINE_ID": "0", **extra}
        port = harness.free_port()
        ranks = []
        for rank in (0, 1):
            rank_env = {**env, "SHADOWLINE_STANDIN_GPUS": GPUS[rank], "DYN_SYSTEM_PORT": str(harness.free_port()),
                        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(harness.free_port())}
            if rank == 0:
                rank_env["DYN_SYSTEM_PORT"] = str(port)
            argv = harness.engine_argv(model, "tiny", tp=2, nnodes=2, rank=rank, master_port=master)
            ranks.append(procs.start(f"rank-{rank}", argv, rank_env))
        ranks[0].wait_log("[Shadow] Engine paused, startup probe now passing, waiting for lock", 20)
        ranks[1].wait_log("headless rank 1 of engine 0 running", 5)
        return ranks[0], ranks[1], port, lock_path, held.release

    yield start
    held.release()


@pytest.mark.parametrize("mode", ["hang", "exit"])
def test_leader_death_headless_hangs_or_exits(cohort, procs, tmp_path, mode):
    leader, headless, port, _unused1, _unused2 = cohort(SHADOWLINE_STANDIN_ON_PEER_DEATH=mode)
    harness.assert_loopback_only(procs)  # the rendezvous listener is on the master address only
    hb0, hb1 = tmp_path / "heartbeat-engine-0-rank-0", tmp_path / "heartbeat-engine-0-rank-1"
    assert advancing(hb0) and advancing(hb1)
    assert "weights ready: 1 shard(s)" in headless.text()  # the headless rank holds its own shard
    steps = fm.parse_samples(harness.metrics(port), "shadowline_standin_collective_steps_total")
    assert steps and steps[0].value > 0

    os.kill(leader.pid, signal.SIGKILL)
    if mode == "exit":
        assert headless.popen.wait(5) != 0
        assert "node rank 0 lost" in headless.text()
        return
    headless.wait_log("node rank 0 lost", 5)
    time.sleep(0.5)
    assert headless.alive() and not advancing(hb1, 1.5)


def test_hang_collective_stalls_peers_and_blocks_wake(cohort, tmp_path):
    """A rank hung in a collective: the leader stops progressing, stays healthy, and once it wins
    the lock it stays in waking, holding the lock, without serving."""
    leader, headless, port, _unused1, _unused2 = cohort()
    hb0 = tmp_path / "heartbeat-engine-0-rank-0"
    assert advancing(hb0)
    (tmp_path / "fault-engine-0-rank-1").write_text("hang-collective")
    headless.wait_log("fault: hang-collective", 3)
    leader.wait_log("collective stalled", 5)
    assert not advancing(hb0, 1.0)
    assert harness.http("GET", f"http://127.0.0.1:{port}/health")[0] == 200
    stalled = fm.parse_samples(harness.metrics(port), "shadowline_standin_collective_stalled")
    assert stalled[0].value == 1.0
    assert headless.alive() and leader.alive()


def test_wake_waits_for_hung_rank(cohort, tmp_path):
    """The leader wins the lock while a rank hangs: it stays in waking with the lock, serving nothing."""
    leader, headless, port, lock_path, release = cohort()
    headless.signal_group(signal.SIGSTOP)  # a rank that hangs without dying
    leader.wait_log("collective stalled", 5)
    release()
    leader.wait_log("Failover lock acquired: engine-0", 3)
    time.sleep(1.5)
    assert "[Shadow] Engine awake" not in leader.text() and "worker: started" not in leader.text()
    assert lock.is_locked(str(lock_path)) and lock.read_holder(str(lock_path)) == "engine-0"
    assert fm.engine_failover_view(harness.metrics(port))["0"].state == "waking"
    assert harness.http("GET", f"http://127.0.0.1:{port}/health")[0] == 200


def process_state(pid: int) -> str:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]


def test_hang_signal_and_clean_shutdown(cohort, tmp_path):
    """SIGUSR1 (the hang fault) freezes the leader: no /health answer, peers stall, lock state kept;
    SIGCONT resumes it. SIGTERM of the leader then stops the whole cohort cleanly."""
    leader, headless, port, _unused1, _unused2 = cohort()
    hb1 = tmp_path / "heartbeat-engine-0-rank-1"
    os.kill(leader.pid, signal.SIGUSR1)
    harness.wait_until(lambda: process_state(leader.pid) == "T", 3, what="the leader to stop")
    assert harness.http("GET", f"http://127.0.0.1:{port}/health", timeout=0.5)[0] == 0
    assert not advancing(hb1, 1.0)
    os.kill(leader.pid, signal.SIGCONT)
    leader.wait_log("fault: hang: resumed by SIGCONT", 3)
    assert harness.http("GET", f"http://127.0.0.1:{port}/health")[0] == 200
    assert advancing(hb1)

    leader.popen.send_signal(signal.SIGTERM)
    assert leader.popen.wait(10) == 0
    assert headless.popen.wait(10) == 0
    assert "shutting down cleanly" in headless.text()
    assert not hb1.exists()
