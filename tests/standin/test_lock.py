"""shadowline.common.lock: acquire, holder content, release on SIGKILL, a probe that does not steal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from shadowline.common import lock

from . import harness

HOLDER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {lib!r})
    from shadowline.common import lock
    held = lock.acquire({path!r}, {engine!r})
    print("held", held.contended, flush=True)
    time.sleep(600)
""")


def hold(path: str, engine: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER.format(lib=str(harness.LIB), path=path, engine=engine)],
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout.readline().startswith("held")
    return p


def test_acquire_writes_holder_without_newline(tmp_path):
    path = str(tmp_path / "failover.lock")
    (tmp_path / "failover.lock").write_text("engine-99 stale content from a dead holder")
    held = lock.acquire(path, 3)
    try:
        assert held.holder == "engine-3" and not held.contended
        assert (tmp_path / "failover.lock").read_bytes() == b"engine-3"
        assert lock.read_holder(path) == "engine-3"
        assert lock.is_locked(path)
    finally:
        held.release()
    assert not lock.is_locked(path)
    assert lock.read_holder(path) == "engine-3"  # the file still names the last holder


def test_contended_acquire_waits_and_sigkill_releases(tmp_path):
    path = str(tmp_path / "failover.lock")
    holder = hold(path, "0")
    try:
        assert lock.read_holder(path) == "engine-0" and lock.is_locked(path)
        assert lock.try_acquire(path, 1) is None
        assert lock.acquire(path, 1, timeout=0.3) is None
        stop = threading.Event()
        stop.set()
        assert lock.acquire(path, 1, stop=stop) is None
        result = {}

        def contender():
            result["lock"] = lock.acquire(path, 1)
            result["at"] = time.monotonic()

        t = threading.Thread(target=contender)
        t.start()
        time.sleep(0.3)
        assert "lock" not in result
        killed = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        t.join(5)
        held = result["lock"]
        assert held.contended and held.holder == "engine-1"
        assert result["at"] - killed < 0.5  # 0.1 s polling
        assert lock.read_holder(path) == "engine-1"
        held.release()
    finally:
        holder.kill()
        holder.wait()


def test_is_locked_does_not_steal(tmp_path):
    path = str(tmp_path / "failover.lock")
    assert not lock.is_locked(path)
    assert not os.path.exists(path)  # a probe never creates the file
    held = lock.acquire(path, 0)
    stop = threading.Event()
    seen = []

    def probe():
        while not stop.is_set():
            seen.append(lock.is_locked(path))

    t = threading.Thread(target=probe)
    t.start()
    time.sleep(0.2)
    stop.set()
    t.join()
    assert seen and all(seen)
    assert lock.try_acquire(path, 1) is None  # still ours
    held.release()
    # With nobody holding it, probing in a loop never blocks a real acquire.
    stop.clear()
    t = threading.Thread(target=probe)
    t.start()
    got = lock.acquire(path, 2, timeout=2)
    stop.set()
    t.join()
    assert got is not None and lock.read_holder(path) == "engine-2"
    got.release()


def test_parse_holder():
    assert lock.parse_holder("engine-3") == 3
    assert lock.parse_holder(" engine-12\n") == 12
    for bad in ("", "engine-", "engine-x", "worker-1", "engine--1"):
        assert lock.parse_holder(bad) is None
