"""shadowline.cluster.discovery against the real thing: etcd, NATS, dynamo.frontend and real Dynamo workers on loopback.

1. Two ``dynamo.mocker`` workers laid out like real ``dynamo.vllm`` leaders of cohorts 0 and 1 (each worker's
   DYN_SYSTEM_PORT is its cohort's system port): what the records contain, the cohort match, and how fast a
   revoke takes effect (measured; the figures go to docs/slurm.md).
2. Stand-in engines (shadow lifecycle, the worker on a free port): the records alone cannot tell cohorts apart
   on one host; the ports the leader's processes listen on, or the lease snapshot taken when a cohort woke, can.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
import urllib.request

from shadowline.cluster import discovery
from shadowline.common.etcd_client import Etcd
from shadowline.common.proc import listening_ports
from shadowline.drill.load import Load

from ..standin import harness
from .local_infra import loopback_plan

MODEL = "tiny"
GPU = "GPU-5c1e7d2a-0000-4000-8000-0000000000a1"


def mocker(procs, infra, name: str, model_dir, system_port: int) -> harness.Proc:
    env = harness.dynamo_env(infra, DYN_SYSTEM_PORT=str(system_port),
                             DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS='["generate"]')
    return procs.start(name, [str(harness.RUNTIME_PY), "-m", "dynamo.mocker", "--model-path", str(model_dir),
                              "--model-name", MODEL], env)


def forget_everyone(etcd: Etcd) -> None:
    """Start from an empty discovery (the infra is shared by the module's tests)."""
    discovery.revoke_leases(etcd, [r.lease for r in discovery.registrations(etcd)])


def session_pids(procs: harness.Procs, proc: harness.Proc) -> set[int]:
    return {pid for pid in procs.pids() if os.getsid(pid) == proc.pid}


def test_records_cohort_match_and_revoke_timing(procs, infra, tiny_model, tmp_path):
    etcd = Etcd(infra.etcd)
    forget_everyone(etcd)
    plan = loopback_plan(MODEL, str(tiny_model), etcd=infra.etcd)
    ports = [c.ports.system for c in plan.cohorts]
    workers = [mocker(procs, infra, f"cohort-{c}", tiny_model, ports[c]) for c in (0, 1)]

    def complete() -> list[discovery.Registration] | None:
        regs = [r for r in discovery.registrations(etcd) if r.model_name == MODEL]
        done = len(regs) == 2 and all(r.system_address and r.request_address and len(r.keys) >= 8 for r in regs)
        return regs if done else None

    regs = harness.wait_until(complete, 30, 0.05, "two complete registrations")

    # What a registration holds: everything on one lease, named by it.
    for reg in regs:
        hexid = reg.instance_id
        assert f"v1/instances/dynamo/backend/generate/{hexid}" in reg.keys
        assert f"v1/mdc/dynamo/backend/generate/{hexid}" in reg.keys
        assert all(key.endswith(hexid) or "/topic/" in key for key in reg.keys)
        assert (reg.namespace, reg.component, reg.model_name, reg.model_path) == (
            "dynamo", "backend", MODEL, str(tiny_model))
        assert "generate" in reg.endpoints
        assert reg.host == "127.0.0.1" and reg.request_address.startswith("127.0.0.1:")
    print("\nregistration:", json.dumps(regs[0].to_dict(), indent=1))

    # The cohort match: the card's system address is the cohort's system port; cross-checked with the ports the
    # worker's processes listen on.
    for c in (0, 1):
        found = discovery.cohort_registrations(etcd, plan, c)
        assert len(found) == 1 and found[0].system_address == f"127.0.0.1:{ports[c]}"
        listening = listening_ports(session_pids(procs, workers[c]))
        assert found[0].ports <= listening
        assert [r.lease for r in discovery.cohort_registrations(etcd, plan, c, ports=listening)] == [found[0].lease]

    # Warm the frontend up, freeze cohort 0's worker (a hang: its connections stay open, so the frontend keeps
    # routing to it), wait a second, then revoke its registration: how long the revoke takes, when failures stop.
    # (A killed worker closes its connections and the frontend stops routing to it by itself.)
    harness.wait_until(lambda: harness.chat(infra.frontend, MODEL)[0] == 200, 20, 0.1, "a completion")
    load = Load(infra.frontend, MODEL, rate=100, timeout=3).start()
    time.sleep(1.0)
    dead = discovery.cohort_registrations(etcd, plan, 0)[0]
    workers[0].signal_group(signal.SIGSTOP)
    killed = time.time()
    time.sleep(1.0)
    revoking = time.time()
    revoked = discovery.revoke_cohort(etcd, plan, 0)
    revoke_done = time.time()
    assert revoked == [dead.lease]
    assert discovery.cohort_registrations(etcd, plan, 0) == []
    time.sleep(1.5)
    requests = load.stop()
    before_revoke = [r for r in requests if killed <= r.start < revoking]
    after_revoke = [r for r in requests if r.start >= revoking]
    failed_before = [r for r in before_revoke if not r.ok]
    failed_after = [r for r in after_revoke if not r.ok]
    last_failed = max((r.start for r in failed_after), default=None)
    workers[0].signal_group(signal.SIGKILL)
    print(f"hang, no revoke: {len(failed_before)} of {len(before_revoke)} requests failed in 1 s "
          f"({sorted({r.status for r in failed_before})}); revoke took {1000 * (revoke_done - revoking):.1f} ms; "
          f"after it {len(failed_after)} of {len(after_revoke)} failed"
          + (f", the last sent {1000 * (last_failed - revoking):.1f} ms after the revoke began" if last_failed else ""))
    assert failed_before, "requests routed to the hung worker should have failed"
    assert all(r.ok for r in after_revoke if r.start > revoke_done + 0.2), \
        "the frontend still routes to the revoked worker"
    assert revoke_done - revoking < 0.5

    # Revoking a live worker's lease fences it: the worker exits.
    fenced = time.monotonic()
    assert discovery.revoke_cohort(etcd, plan, 1) != []
    code = workers[1].popen.wait(10)
    print(f"live worker exited {time.monotonic() - fenced:.2f} s after its lease was revoked (exit {code})")
    assert discovery.registrations(etcd) == [] or all(r.model_name != MODEL for r in discovery.registrations(etcd))


def test_standin_cohorts_need_ports_or_a_snapshot(procs, infra, tiny_model, short_dir, tmp_path):
    etcd = Etcd(infra.etcd)
    forget_everyone(etcd)
    plan = loopback_plan(MODEL, str(tiny_model), backend="standin", etcd=infra.etcd)
    lock_path = tmp_path / "failover.lock"
    procs.start("gms", [str(harness.RUNTIME_PY), "-m", "shadowline.standin.gms_server"],
                {"PATH": os.environ["PATH"], "GMS_SOCKET_DIR": str(short_dir), "SHADOWLINE_STANDIN_GPUS": GPU})
    harness.wait_until((short_dir / "gms_ready").exists, 10, what="gms_ready")
    env = harness.dynamo_env(infra, GMS_SOCKET_DIR=str(short_dir), SHADOWLINE_STANDIN_GPUS=GPU,
                             FAILOVER_LOCK_PATH=str(lock_path), DYN_VLLM_GMS_SHADOW_MODE="true")

    def engine(c: int) -> harness.Proc:
        return procs.start(f"engine-{c}", harness.engine_argv(tiny_model, MODEL),
                           {**env, "ENGINE_ID": str(c), "DYN_SYSTEM_PORT": str(plan.cohort(c).ports.system)})

    e0 = engine(0)
    e0.wait_log("[Shadow] Engine awake, registering with discovery", 30)
    e1 = engine(1)
    e1.wait_log("[Shadow] Engine paused, startup probe now passing, waiting for lock", 30)
    before = discovery.registrations(etcd)
    assert len(before) == 1, "only the lock holder is registered"
    reg0 = before[0]
    assert reg0.system_address != f"127.0.0.1:{plan.cohort(0).ports.system}"  # the worker's own port
    # Records alone: no cohort can be told (the stand-in's worker port is in no plan).
    assert discovery.cohort_registrations(etcd, plan, 0) == []
    # The ports cohort 0's processes listen on single it out.
    ports0 = listening_ports(session_pids(procs, e0))
    assert [r.lease for r in discovery.cohort_registrations(etcd, plan, 0, ports=ports0)] == [reg0.lease]
    assert discovery.cohort_registrations(etcd, plan, 1, ports=listening_ports(session_pids(procs, e1))) == []

    # Failover: the lease snapshot taken when cohort 1 woke names its registration; the dead one is revoked.
    e0.signal_group(signal.SIGKILL)
    e1.wait_log("[Shadow] Engine awake, registering with discovery", 20)
    after = discovery.registrations(etcd)
    woke = discovery.new_registrations(before, after)
    assert len(woke) == 1 and woke[0].lease != reg0.lease
    assert reg0.lease in {r.lease for r in after}, "the dead worker stays registered until its lease ends"
    timings = []
    assert discovery.revoke_leases(etcd, [reg0.lease]) == [reg0.lease]
    assert discovery.wait_unregistered(etcd, [reg0.lease], 1.0)
    assert [r.lease for r in discovery.registrations(etcd)] == [woke[0].lease]
    for _unused in range(5):
        lease = etcd.lease_grant(30)
        etcd.put(f"v1/instances/x/y/z/{lease:x}", "{}", lease=lease)
        started = time.perf_counter()
        discovery.revoke_leases(etcd, [lease])
        timings.append(1000 * (time.perf_counter() - started))
    print(f"lease revoke on loopback etcd: median {statistics.median(timings):.1f} ms, max {max(timings):.1f} ms")


def stream_chat(frontend: str, model: str, max_tokens: int, started: threading.Event, out: list[str]) -> None:
    """One streaming completion of ``max_tokens`` tokens; its SSE data lines go to ``out``; ``started`` is set at
    the first."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens,
                       "ignore_eos": True, "stream": True}).encode()
    request = urllib.request.Request(f"{frontend}/v1/chat/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            for line in answer:
                if line.startswith(b"data:"):
                    out.append(line.decode().strip())
                    started.set()
    except OSError as err:
        out.append(f"error: {err}")
    started.set()


def test_deroute_keeps_the_model_and_lets_streams_on_the_worker_end(procs, infra, tiny_model):
    """What a handover's drain rests on (control/failover.py): with its v1/instances/ records deleted, a live
    worker gets no new request, the frontend answers 503 (which clients retry) and not 404 (the model's card
    stays), and a stream already on the worker goes on to its end; put back, the worker serves again."""
    etcd = Etcd(infra.etcd)
    forget_everyone(etcd)
    plan = loopback_plan(MODEL, str(tiny_model), etcd=infra.etcd)
    worker = mocker(procs, infra, "cohort-0", tiny_model, plan.cohorts[0].ports.system)
    harness.wait_until(lambda: harness.chat(infra.frontend, MODEL)[0] == 200, 30, 0.1, "a completion")
    lease = discovery.cohort_registrations(etcd, plan, 0)[0].lease

    started, lines = threading.Event(), []
    streaming = threading.Thread(target=stream_chat, args=(infra.frontend, MODEL, 300, started, lines))
    streaming.start()
    assert started.wait(10), "the stream did not start"
    removed = discovery.deroute(etcd, [lease])
    assert "generate" in [kv.key.split("/")[4] for kv in removed], removed
    assert not [kv for kv in etcd.get_prefix(discovery.INSTANCES) if kv.lease == lease]
    assert [r.lease for r in discovery.cohort_registrations(etcd, plan, 0)] == [lease], "the card must stay"

    def refused() -> tuple[int, str] | None:
        answer = harness.chat(infra.frontend, MODEL)
        return answer if answer[0] != 200 else None

    status, body = harness.wait_until(refused, 5, 0.02, "the frontend to stop routing to the derouted worker")
    assert status == 503, (status, body)
    streaming.join(30)
    assert not streaming.is_alive() and lines[-1] == "data: [DONE]", lines[-3:]
    assert any('"finish_reason":"length"' in line for line in lines), lines[-3:]
    assert not any("error" in line.lower() for line in lines), [line for line in lines if "error" in line.lower()]
    print(f"\nderouted: {len(removed)} records; a new request got {status}; the stream in flight ended with "
          f"{len(lines)} events and [DONE]")

    assert discovery.reroute(etcd, removed) == len(removed)
    harness.wait_until(lambda: harness.chat(infra.frontend, MODEL)[0] == 200, 10, 0.05, "a completion after reroute")
    worker.signal_group(signal.SIGKILL)
