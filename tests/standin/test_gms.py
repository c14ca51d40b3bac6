"""Stand-in GMS server: socket names, publish/import of memfd shards, server death semantics."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import textwrap

import numpy as np
import pytest
from safetensors.numpy import load_file

from shadowline.common import lock
from shadowline.standin import gms_client, settings, weights

from . import harness

GPUS = ["GPU-3f2a0c1e-0000-4000-8000-00000000000a", "GPU-3f2a0c1e-0000-4000-8000-00000000000b"]

READER = textwrap.dedent("""
    import hashlib, json, os, sys
    from shadowline.standin import gms_client, weights
    path, model, model_path, rank, timeout = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    expect = {"model": model, "model_path": model_path, "tp_size": 2, "tp_rank": rank}
    try:
        got = gms_client.import_layout(path, expect, timeout, wait=timeout)
        if got is None:
            raise gms_client.GMSError(f"no committed weights on {path}")
    except gms_client.GMSError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    header, fd, session = got
    shard = weights.map_shard(fd, header)
    os.close(fd)
    gms_client.watch(session, path, lambda p: print("LOST", p, flush=True))
    sums = {t["name"]: hashlib.sha256(shard.tensor_bytes(t["name"])).hexdigest() for t in header["tensors"]}
    print(json.dumps({"digest": header["digest"], "sums": sums}), flush=True)
    for line in sys.stdin:
        print(json.dumps({"digest": "sha256:" + hashlib.sha256(shard.view).hexdigest()}), flush=True)
""")


def start_server(procs, socket_dir, name="gms"):
    env = {"PATH": os.environ["PATH"], "GMS_SOCKET_DIR": str(socket_dir), "SHADOWLINE_STANDIN_GPUS": ",".join(GPUS)}
    p = procs.start(name, [str(harness.RUNTIME_PY), "-m", "shadowline.standin.gms_server"], env)
    harness.wait_until(lambda: (socket_dir / "gms_ready").exists() or not p.alive(), 10, what="gms_ready")
    assert p.alive(), p.text()
    return p


def expected_sums(model, tp, rank):
    sums = {}
    for f in weights.model_files(str(model)):
        for name, arr in load_file(f).items():
            if arr.ndim >= 2:
                r0, r1 = weights.row_range(arr.shape[0], tp, rank)
                arr = arr[r0:r1]
            sums[name] = hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()
    return sums


def model_bytes(model):
    return sum(os.path.getsize(f) for f in weights.model_files(str(model)))


def reader(path, model, rank, timeout=5.0):
    return subprocess.Popen([str(harness.RUNTIME_PY), "-c", READER, path, "tiny", str(model), str(rank), str(timeout)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_gms_publish_import_and_server_death(procs, short_dir, model, runtime):
    server = start_server(procs, short_dir)
    names = sorted(os.listdir(short_dir))
    assert names == sorted([f"gms_{g}_{t}.sock" for g in GPUS for t in ("weights", "kv_cache")] + ["gms_ready"])
    marker = json.loads((short_dir / "gms_ready").read_text())
    assert marker["pid"] == server.pid and marker["gpus"] == GPUS
    paths = [settings.gms_socket_path(g, "weights", str(short_dir)) for g in GPUS]
    assert gms_client.status(paths[0])["committed"] is False
    assert gms_client.status(settings.gms_socket_path(GPUS[0], "kv_cache", str(short_dir)))["tag"] == "kv_cache"

    # The writer: this test process reads the files and publishes both TP shards.
    identity = {"model": "tiny", "model_path": str(model), "engine_id": "0"}
    sessions = []
    for rank, (gpu, path) in enumerate(zip(GPUS, paths)):
        shard = weights.build_shard(str(model), 2, rank, gpu, identity)
        session, gen = gms_client.publish(path, shard, 5)
        os.close(shard.fd)
        sessions.append(session)
        assert gen == 1
    assert gms_client.status(paths[1])["layout"]["tp_rank"] == 1

    # A reader maps identical bytes without reading the model files.
    r = reader(paths[1], model, 1)
    try:
        got = json.loads(r.stdout.readline())
        assert got["sums"] == expected_sums(model, 2, 1)
        io = dict(line.split(": ") for line in open(f"/proc/{r.pid}/io").read().splitlines())
        assert int(io["rchar"]) < model_bytes(model) / 8, (io, model_bytes(model))

        # A mismatching import is refused with the reason.
        with pytest.raises(gms_client.GMSError, match="tp_rank"):
            gms_client.import_layout(paths[0], {"model": "tiny", "tp_rank": 1}, 2, wait=0)

        # A second writer (another revision) is refused while the reader is attached, as upstream's server does;
        # the reader's layout stays committed. GPU 0's socket has no reader: a new writer replaces its layout.
        other = weights.build_shard(str(model), 2, 1, GPUS[1], {**identity, "model_path": "/models/next"})
        with pytest.raises(gms_client.GMSError, match="refuses a new writer while readers are attached"):
            gms_client.publish(paths[1], other, 5)
        os.close(other.fd)
        assert gms_client.status(paths[1])["layout"]["model_path"] == str(model)
        assert gms_client.status(paths[1])["readers"] == 1
        again = weights.build_shard(str(model), 2, 0, GPUS[0], identity)
        session, gen = gms_client.publish(paths[0], again, 5)
        os.close(again.fd)
        sessions.append(session)
        assert gen == 2

        # GMS dies: the reader is told, and its mapping stays valid.
        server.popen.send_signal(signal.SIGKILL)
        server.popen.wait()
        assert r.stdout.readline().strip() == f"LOST {paths[1]}"
        r.stdin.write("digest\n")
        r.stdin.flush()
        assert json.loads(r.stdout.readline())["digest"] == got["digest"]
        assert r.poll() is None
    finally:
        r.kill()
        r.wait()
        for s in sessions:
            s.close()

    # No server: a new import fails with a clear error.
    for p in short_dir.glob("*.sock"):
        p.unlink()
    r = reader(paths[1], model, 1, timeout=0.5)
    _unused, err = r.communicate(timeout=10)
    assert r.returncode == 1 and "GMS server unreachable" in err

    # A restarted server is empty until a writer republishes.
    restarted = start_server(procs, short_dir, "gms-restarted")
    r = reader(paths[1], model, 1, timeout=0.5)
    _unused, err = r.communicate(timeout=10)
    assert r.returncode == 1 and "no committed weights" in err

    # SIGTERM: clean exit, sockets and marker removed.
    restarted.popen.send_signal(signal.SIGTERM)
    assert restarted.popen.wait(10) == 0
    assert os.listdir(short_dir) == []


def test_engines_notice_lost_gms_and_new_imports_fail(procs, short_dir, model, runtime, tmp_path):
    """A parked shadow logs that its GMS connection was lost and stays up; a new engine fails clearly."""
    server = start_server(procs, short_dir)
    lock_path = tmp_path / "failover.lock"
    held = lock.acquire(str(lock_path), 99)  # someone else is primary: the engines stay parked
    try:
        env = {"PATH": os.environ["PATH"], "GMS_SOCKET_DIR": str(short_dir), "SHADOWLINE_STANDIN_GPUS": GPUS[0],
               "FAILOVER_LOCK_PATH": str(lock_path), "DYN_VLLM_GMS_SHADOW_MODE": "true", "DYN_SYSTEM_HOST": "127.0.0.1",
               "SHADOWLINE_STANDIN_GMS_TIMEOUT": "1"}
        port = harness.free_port()
        e0 = procs.start("engine-0", harness.engine_argv(model, "tiny"),
                         {**env, "ENGINE_ID": "0", "DYN_SYSTEM_PORT": str(port)})
        e0.wait_log("[Shadow] Engine paused, startup probe now passing, waiting for lock")
        server.popen.send_signal(signal.SIGTERM)
        e0.wait_log("[GMS] connection to the GMS server lost")
        assert e0.alive()
        assert harness.http("GET", f"http://127.0.0.1:{port}/health")[0] == 200

        start_server(procs, short_dir, "gms-restarted")
        e1 = procs.start("engine-1", harness.engine_argv(model, "tiny"), {**env, "ENGINE_ID": "1"})
        assert e1.popen.wait(15) == 1
        assert "no committed weights" in e1.text() and "must publish" in e1.text()
    finally:
        held.release()
