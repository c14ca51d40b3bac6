"""The stand-in's share of issue #14, without processes: vLLM's progress metrics as its leader serves them (parsed
back by common/progress.py), and its emulation of torch's NCCL watchdog (a stuck collective ends the rank)."""

from __future__ import annotations

import os
import socket
import threading
import time

from shadowline.common import proc
from shadowline.common.progress import ProgressSample, parse_sample
from shadowline.standin import cohort, settings, worker
from shadowline.standin.progress_metrics import ProgressMetrics
from tests.loopback import wait_until

MODEL = "tiny/standin"


def worker_text(inflight: float, streamed: float) -> str:
    """What dynamo.mocker's system port serves (its work handler's metrics, Dynamo's labels)."""
    labels = 'dynamo_component="backend",dynamo_endpoint="generate",dynamo_namespace="dynamo",worker_id="7a"'
    return ("# TYPE dynamo_component_inflight_requests gauge\n"
            f"dynamo_component_inflight_requests{{{labels}}} {inflight}\n"
            "# TYPE dynamo_component_response_bytes_total counter\n"
            f"dynamo_component_response_bytes_total{{{labels}}} {streamed}\n"
            'dynamo_component_response_bytes_total{dynamo_endpoint="clear_kv_blocks"} 99\n')


def test_leader_serves_vllm_progress_metrics_the_judge_reads():
    metrics = ProgressMetrics(MODEL)
    assert parse_sample(metrics.render(), MODEL) == ProgressSample(tokens=0.0, running=0.0)
    assert metrics.observe_worker(worker_text(2, 1500))
    assert parse_sample(metrics.render(), MODEL) == ProgressSample(tokens=1500.0, running=2.0)
    assert "# TYPE vllm:generation_tokens_total counter" in metrics.render()
    assert "# TYPE vllm:num_requests_running gauge" in metrics.render()


def test_counter_never_goes_back_when_the_worker_is_replaced():
    metrics = ProgressMetrics(MODEL)
    metrics.observe_worker(worker_text(1, 800))
    metrics.worker_replaced()
    metrics.observe_worker(worker_text(1, 100))
    assert parse_sample(metrics.render(), MODEL).tokens == 900.0


def test_a_frozen_worker_leaves_running_up_and_the_counter_still():
    """No new worker text (frozen worker): the last values stay, as vLLM's do when a step never ends."""
    metrics = ProgressMetrics(MODEL)
    metrics.observe_worker(worker_text(3, 4000))
    assert not metrics.observe_worker("")  # nothing from the worker
    assert parse_sample(metrics.render(), MODEL) == ProgressSample(tokens=4000.0, running=3.0)


def test_a_frozen_worker_still_shows_the_requests_that_reach_it_as_dynamos_runtime_would():
    """vLLM's gauge stays at the idle 0 it last showed; the handler gauge the leader serves for the frozen worker
    counts the connections with requests waiting, which the agent's judge reads as requests running."""
    metrics = ProgressMetrics(MODEL)
    assert metrics.render_handler_while_frozen(2) == ""  # never read the worker: no labels to serve
    metrics.observe_worker(worker_text(0, 4000))
    assert parse_sample(metrics.render() + metrics.render_handler_while_frozen(0), MODEL) == ProgressSample(4000, 0)
    frozen = metrics.render() + metrics.render_handler_while_frozen(2)
    assert 'dynamo_endpoint="generate"' in frozen and 'worker_id="7a"' in frozen
    assert parse_sample(frozen, MODEL) == ProgressSample(tokens=4000.0, running=2.0)


def test_requests_waiting_are_read_from_the_kernels_socket_queues():
    """A real listener and connection: bytes the 'worker' has not read show on its accepted socket's receive
    queue; a connection it did not accept, or one it read, does not count."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _unused = server.accept()
    try:
        def waiting() -> int:
            return worker.connections_with_unread_bytes(proc.tcp_sockets(), proc.socket_inodes(os.getpid()))
        assert waiting() == 0
        client.sendall(b'{"request": 1}')
        assert wait_until(lambda: waiting() == 1, 5, 0.01, "the request in the receive queue")
        accepted.recv(100)
        assert wait_until(lambda: waiting() == 0, 5, 0.01, "the queue read")
        assert worker.connections_with_unread_bytes([["0:", "0100007F:1F90", "00000000:0000", "0A", "0:0", "0", "0",
                                                      "0", "0", "99"]], {"1"}) == 0
    finally:
        for s in (client, accepted, server):
            s.close()


def test_watchdog_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    monkeypatch.setenv("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "1000")
    assert settings.nccl_watchdog(5) == settings.NcclWatchdog(timeout_s=5.0, teardown=True, dump_wait_s=1.0)
    assert settings.nccl_watchdog(5).exit_after_s == 9.0
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")  # clean up only: torch does not end the process
    assert not settings.nccl_watchdog(5).teardown
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")
    monkeypatch.delenv("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC")
    assert settings.nccl_watchdog(None) == settings.NcclWatchdog(timeout_s=600.0, teardown=True, dump_wait_s=15.0)


def pair(tmp_path, watchdog):
    """A leader and one headless rank joined by a socket pair; their fatal exits recorded instead of taken."""
    a, b = socket.socketpair()
    fatal: dict[int, tuple[float, str]] = {}
    done = threading.Event()

    def on_fatal(rank):
        def record(why):
            fatal.setdefault(rank, (time.monotonic(), why))
            done.set()
        return record

    leader = cohort.Collective("0", 0, str(tmp_path / "hb0"), 0.05, "hang", 0.0, peers={1: cohort.LineConn(a)},
                               on_fatal=on_fatal(0), watchdog=watchdog)
    peer = cohort.Collective("0", 1, str(tmp_path / "hb1"), 0.05, "hang", 0.0, leader=cohort.LineConn(b),
                             on_fatal=on_fatal(1), watchdog=watchdog)
    return leader, peer, fatal, done


def test_a_stuck_collective_ends_both_ranks_after_the_timeout(tmp_path):
    watchdog = settings.NcclWatchdog(timeout_s=1.0, teardown=True, dump_wait_s=0.05)
    leader, peer, fatal, done = pair(tmp_path, watchdog)
    leader.start()
    peer.start()
    assert leader.wait_for_progress()
    halted = time.monotonic()
    peer.halt()  # the rank is stuck in its collective (the stall-generation drill's fault)
    deadline = time.monotonic() + 10
    while len(fatal) < 2 and time.monotonic() < deadline:
        done.wait(0.1)
    assert set(fatal) == {0, 1}, fatal
    for rank in (0, 1):
        at, why = fatal[rank]
        assert 1.0 <= at - halted < 4.0, (rank, at - halted)
        assert "NCCL watchdog" in why
    assert leader.stalled


def test_without_teardown_a_stuck_collective_waits(tmp_path):
    watchdog = settings.NcclWatchdog(timeout_s=0.5, teardown=False, dump_wait_s=0.05)
    leader, peer, fatal, _done = pair(tmp_path, watchdog)
    leader.start()
    peer.start()
    assert leader.wait_for_progress()
    peer.halt()
    time.sleep(2.0)
    assert fatal == {} and leader.stalled
