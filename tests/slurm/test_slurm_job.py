"""The rendered batch script on the real Slurm cluster of testbed instance 3 (2 nodes), end to end.

One job for the whole module: it is submitted with sbatch, serves a completion through the frontend, survives
SIGKILL of the primary's worker rank on node 2 (Slurm tears the whole primary step down on both nodes, the
shadow serves, a fresh shadow step is relaunched in the same slot and parks), then a SIGSTOPped primary leader
(the watchdog turns the hang into the same teardown); finally scancel of the job leaves nothing running on any
node. The drills are slurm/drill itself, run on node0; their reports give the figures in docs/slurm.md.

Traffic goes only to 198.18.3.0/24 (the testbed's hosts) and loopback; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from shadowline.cluster.access import client_context
from shadowline.common.etcd_client import Etcd, EtcdAuth, EtcdError
from shadowline.common.frontend import complete
from shadowline.model.spec import spec_from_inventory
from shadowline.model.stage import ensure_model

from .instance import tb

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
DEV_PY = REPO / ".venv" / "bin" / "python"
RUNTIME_PY = REPO / ".runtime" / "bin" / "python"
REVISION = "5ad0f1e0c0ffee5ad0f1e0c0ffee5ad0f1e0c0ff"
OURS = ("shadowline", "etcd", "nats-server", "dynamo", "srun", "slurmstepd")


def on(host: str, *argv: str, timeout: float = 60, check: bool = True) -> str:
    proc = tb.exec_in(host, list(argv), timeout=timeout)
    if check:
        assert proc.returncode == 0, f"{host}: {' '.join(argv)}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    return proc.stdout


def wait_for(fn, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(interval)


def image_python(run: Path) -> Path:
    """An interpreter like NVIDIA's image's (issue #41): the runtime's packages (Dynamo, the stand-in's needs,
    cryptography) but not shadowline. A virtual environment whose one .pth names the runtime's site-packages:
    Python adds that directory without reading the .pth files in it, so the runtime's shadowline.pth (the
    checkout) is not read. The job gets shadowline only from gms_slurm.library_dir, as it would in the image."""
    image = run / "image"
    subprocess.run([str(RUNTIME_PY), "-m", "venv", "--without-pip", str(image)], check=True, timeout=120)
    site = subprocess.run([str(RUNTIME_PY), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    own = subprocess.run([str(image / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    Path(own, "runtime.pth").write_text(site + "\n")
    return image / "bin" / "python"


def inventory(run: Path, model_dir: Path, jobs: Path, python: Path) -> Path:
    """The deployment: the stand-in on 2 nodes, one primary and one shadow, run by an interpreter without
    shadowline (image_python) that imports it from gms_slurm.library_dir (the checkout's library), the pyxis
    example's way. The discovery lease is 15 s (default 5) so that a frozen stand-in worker, which stops renewing
    it, is still registered when the watchdog acts (a hung vLLM engine keeps renewing it): the test then sees the
    watchdog revoke it."""
    inv = run / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  children:\n    gms_nodes:\n      hosts:\n        allocation: {}\n")
    (inv / "group_vars" / "gms_nodes.yml").write_text(f"""\
gms_deployment: slurmtest
gms_model:
  id: shadowline/tiny-llama
  revision: {REVISION}
  source: file://{REPO}/.cache/models/tiny-llama
  local_dir: {model_dir}
gms_engine: {{backend: standin, tensor_parallel_size: 2, nnodes: 2, lease_ttl_s: 15}}
gms_cohorts: 2
gms_python: {python}
gms_slurm:
  library_dir: {REPO / "plugins" / "module_utils"}
  time: "00:15:00"
  exclusive: true
  output_dir: {jobs}
  signal_lead_s: 60
""")
    return inv


@pytest.fixture(scope="module")
def job(testbed, tiny_model, runtime):
    """Render, stage the model, boot the 2-node Slurm testbed, submit; yields the job's facts; scancels at the end."""
    run = REPO / ".cache" / "slurm-tests" / uuid.uuid4().hex[:12]  # never looked up by a host before: visible
    jobs = run / "jobs"
    jobs.mkdir(parents=True)
    model_dir = run / "models" / "tiny-llama"
    ensure_model(spec_from_inventory({"id": "shadowline/tiny-llama", "revision": REVISION,
                                      "source": f"file://{tiny_model}", "local_dir": str(model_dir)}))
    script = run / "job.sbatch"
    python = image_python(run)
    out = subprocess.run([str(DEV_PY), str(REPO / "slurm" / "render"), "-i", str(inventory(run, model_dir, jobs, python)),
                          "--out", str(script)], capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["changed"] is True
    state = testbed(nodes=2, slurm=True)
    assert [h.address for h in state.hosts] == ["198.18.3.10", "198.18.3.11"]  # instance 3 only
    submitted = time.monotonic()
    job_id = on("node0", "bash", "-c", f"cd {run} && sbatch --parsable {script}").strip().split(";")[0]
    job_dir = jobs / f"shadowline-slurmtest-{job_id}"
    facts = {"id": job_id, "dir": job_dir, "run": run, "script": script, "submitted": submitted, "python": python}
    try:
        yield facts
    finally:
        on("node0", "scancel", job_id, check=False)
        wait_for(lambda: not on("node0", "squeue", "-h", "-j", job_id, check=False).strip(), 60, "the job to end")
        if not os.environ.get("SHADOWLINE_SLURM_KEEP"):  # SHADOWLINE_SLURM_KEEP=1 keeps the drill reports
            shutil.rmtree(run, ignore_errors=True)


def events(job_dir: Path) -> list[dict]:
    text = on("node0", "bash", "-c", f"cat {job_dir}/events.jsonl 2>/dev/null || true")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def job_json(job_dir: Path) -> dict:
    return json.loads(on("node0", "cat", f"{job_dir}/job.json"))


def drill(job: dict, fault: str) -> dict:
    report = f"/tmp/drill-{fault}.json"
    proc = tb.exec_in("node0", [str(RUNTIME_PY), str(REPO / "slurm" / "drill"), "--job", job["id"], "--fault", fault,
                                "--rate", "20", "--timeout", "45", "--report", report], timeout=120)
    text = on("node0", "cat", report)
    (job["run"] / f"drill-{fault}.json").write_text(text)  # kept on the machine for the record
    result = json.loads(text)
    figures = ("detect_s", "teardown_s", "promote_s", "first_ok_s", "failed_before_promotion",
               "failed_after_promotion", "relaunch_started_s", "relaunch_s")
    print(f"\n{fault}: {json.dumps({k: result[k] for k in figures})}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return result


def processes(host: str) -> list[str]:
    out = on(host, "ps", "-eo", "pid,args", "--no-headers")
    return [line.strip() for line in out.splitlines() if any(word in line for word in OURS) and "ps -eo" not in line]


def test_script_passes_bash_n_and_shellcheck(job):
    subprocess.run(["bash", "-n", str(job["script"])], check=True)
    proc = subprocess.run(["shellcheck", str(job["script"])], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout


def test_job_serves_through_the_frontend(job):
    ready = wait_for(lambda: next((e for e in events(job["dir"]) if e["event"] == "deployment-ready"), None), 120,
                     "the deployment to serve")
    print(f"\njob start -> deployment ready (primary serving, shadow parked): {ready['detail']['since_job_start_s']} s")
    status, body = complete("http://198.18.3.10:8000", "shadowline/tiny-llama", timeout=10)
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] > 0
    record = job_json(job["dir"])
    assert record["job_id"] == job["id"] and [n["name"] for n in record["nodes"]] == ["node0", "node1"]
    steps = record["steps"]
    for name in ("gms", "etcd", "nats", "frontend", "cohort_0", "cohort_1"):
        assert steps[name][-1]["step_id"].startswith(f"{job['id']}."), name
    names = {line.split()[1] for line in on("node0", "squeue", "-h", "-s", "-j", job["id"], "-o", "%i %j").splitlines()}
    assert {"gms", "etcd", "nats", "frontend", "cohort-0", "cohort-1"} <= names
    first = events(job["dir"])[0]
    assert set(first) >= {"time", "node", "cohort", "generation", "event", "detail"}


def test_the_job_runs_shadowline_from_the_library_dir_only(job):
    """The pyxis example's path without a container (issue #41; enroot and pyxis cannot be installed here, see
    docs/slurm.md): every step's interpreter lacks shadowline, which the job imports from gms_slurm.library_dir
    through PYTHONPATH alone; the test above shows that it serves."""
    python = str(job["python"])
    for host in ("node0", "node1"):
        alone = tb.exec_in(host, [python, "-c", "import shadowline"], timeout=30)
        assert alone.returncode != 0 and "No module named 'shadowline'" in alone.stderr, host
        ranks = on(host, "pgrep", "-a", "-f", f"^{python} -m shadowline.slurm.watchdog").splitlines()
        assert len(ranks) == 2, ranks  # one rank of each cohort, under the watchdog, by that interpreter
    environ = on("node1", "bash", "-c", "tr '\\0' '\\n' < /proc/$(pgrep -f -o shadowline.slurm.watchdog)/environ")
    assert f"PYTHONPATH={REPO / 'plugins' / 'module_utils'}" in environ.splitlines()


def test_the_jobs_control_plane_is_closed(job, tmp_path_factory):
    """The job's own credentials (slurm/job_secrets.py): on every node in the node directory, the job user's
    only, no CA key and no bundle left; no password in the script, the job directory or a process's arguments;
    etcd takes only TLS with a certificate of the job's CA (each node's etcd proxy, on loopback only, carries the
    engines' plain gRPC to it) and refuses a client without a password and the engines' identity on the agents'
    keys; NATS refuses a client without the job's certificate."""
    wait_for(lambda: any(e["event"] == "deployment-ready" for e in events(job["dir"])), 120, "the deployment")
    plan = job_json(job["dir"])["plan"]
    secrets = plan["security"]["dir"]
    expected = {"ca.crt": "644", "client.crt": "644", "client.key": "600", "server.crt": "644", "server.key": "600",
                "dynamo.env": "600", "etcd-agent.password": "600", "client.pem": "600", "etcd-client.crt": "644",
                "etcd-client.key": "600"}
    # the job's etcd: its token signing key pair on its host only (the plan names the job's nodes by rank)
    infra = {n["host"] for n in plan["infra"]["hosts"]}
    for rank, host in enumerate(("node0", "node1")):
        listing = on(host, "bash", "-c", f"cd {secrets} && stat -c '%a %U %n' . *").splitlines()
        modes = {name: mode for mode, _owner, name in (line.split(" ", 2) for line in listing)}
        jwt = {"etcd-jwt.key": "600", "etcd-jwt.pub": "644"} if plan["nodes"][rank]["host"] in infra else {}
        assert modes == {".": "700", **expected, **jwt}, f"{host}: {listing}"
        assert {line.split(" ", 2)[1] for line in listing} == {"root"}  # the job's user on the testbed
        assert on(host, "bash", "-c", f"ls {plan['config_dir']}/.. | grep -c secrets.tar || true").strip() == "0"
    agent = on("node0", "cat", f"{secrets}/etcd-agent.password").strip()
    dynamo = on("node0", "sed", "-n", "s/^ETCD_AUTH_PASSWORD=//p", f"{secrets}/dynamo.env").strip()
    assert len(agent) >= 32 and len(dynamo) >= 32 and agent != dynamo
    assert on("node1", "cat", f"{secrets}/etcd-agent.password").strip() == agent, "one job, one etcd"
    for password in (agent, dynamo):
        assert password not in job["script"].read_text()
        assert on("node0", "grep", "-rlF", password, str(job["dir"]), check=False).strip() == ""
        for host in ("node0", "node1"):
            assert password not in on(host, "ps", "-eo", "args", "--no-headers")
    endpoint = plan["infra"]["etcd_endpoints"].split(",")[0]
    assert endpoint == "https://198.18.3.10:2379"
    with pytest.raises(EtcdError):  # plain text: refused in the handshake
        Etcd(endpoint.replace("https://", "http://"), timeout=3, deadline=3).get_prefix("v1/")
    files = tmp_path_factory.mktemp("job-etcd-tls")
    for name in ("ca.crt", "etcd-client.crt", "etcd-client.key"):
        (files / name).write_text(on("node0", "cat", f"{secrets}/{name}"))
    with pytest.raises(EtcdError):  # TLS without a client certificate of the job's CA: refused
        Etcd(endpoint, timeout=3, deadline=3, ssl_context=client_context(str(files / "ca.crt"))).get_prefix("v1/")
    tls = client_context(str(files / "ca.crt"), str(files / "etcd-client.crt"), str(files / "etcd-client.key"))
    with pytest.raises(EtcdError, match="user name is empty|permission denied"):
        Etcd(endpoint, timeout=3, ssl_context=tls).put("/shadowline/slurmtest/forged", "x")
    with pytest.raises(EtcdError, match="authentication failed"):
        Etcd(endpoint, timeout=3, ssl_context=tls, auth=EtcdAuth("agent", "not-the-password")).get_prefix("v1/")
    with pytest.raises(EtcdError, match="permission denied"):
        Etcd(endpoint, timeout=3, ssl_context=tls, auth=EtcdAuth("dynamo", dynamo)).put("/shadowline/slurmtest/x", "x")
    assert Etcd(endpoint, timeout=3, ssl_context=tls, auth=EtcdAuth("agent", agent)).get_prefix("v1/"), \
        "the agents' identity reads (the engines registered through their nodes' etcd proxies)"
    for host in ("node0", "node1"):  # each node's proxy: loopback only
        listening = on(host, "ss", "-Hltn", "sport = :23790")
        assert "127.0.0.1:23790" in listening and "198.18.3." not in listening, f"{host}: {listening}"
    nats = plan["infra"]["nats_server"].split(",")[0]
    assert nats.startswith("tls://198.18.3.10:")
    raw = socket.create_connection(("198.18.3.10", int(nats.rsplit(":", 1)[1])), timeout=5)
    info = json.loads(raw.recv(4096).split(b" ", 1)[1])
    assert info.get("tls_required") and info.get("tls_verify"), info
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # no client certificate
    try:
        with context.wrap_socket(raw) as tls:
            tls.sendall(b"CONNECT {}\r\nPING\r\n")
            answer = tls.recv(4096)
    except (ssl.SSLError, OSError) as err:
        answer = str(err).encode()
    assert b"PONG" not in answer, answer


def test_kill_worker_rank_tears_down_the_primary_and_the_shadow_serves(job):
    before = job_json(job["dir"])["steps"]
    result = drill(job, "kill-worker")
    assert result["failed_cohort"] == 0 and result["promoted_cohort"] == 1 and result["target_node"] == "node1"
    assert all(node["all_gone"] and not node["left"] for node in result["nodes"]), "the whole step, on both nodes"
    assert {node["node"] for node in result["nodes"]} == {"node0", "node1"}
    assert result["teardown_s"] < 2.0 and result["promote_s"] < 3.0 and result["first_ok_s"] is not None
    assert result["orphans"] == []
    assert result["relaunch_s"] is not None, "a fresh shadow step in the same slot parked"
    after = job_json(job["dir"])["steps"]["cohort_0"]
    assert len(after) == len(before["cohort_0"]) + 1 and after[-1]["step_id"] != before["cohort_0"][-1]["step_id"]
    kinds = [e["event"] for e in result["events"]]
    assert {"step-ended", "relaunched", "promoted", "parked"} <= set(kinds)
    status, _unused = complete("http://198.18.3.10:8000", "shadowline/tiny-llama", timeout=10)
    assert status == 200


def test_hung_primary_leader_is_detected_by_the_watchdog(job):
    result = drill(job, "hang-leader")
    assert result["failed_cohort"] == 1 and result["promoted_cohort"] == 0  # the roles swapped in the last test
    detections = [e for e in result["events"] if e["event"] == "watchdog-hang-detected"]
    assert detections and detections[0]["detail"]["step_id"] == result["failed_step"]
    # The leader's watchdog revokes its registration: on its own detection, or when Slurm tears the step down
    # because the headless rank's watchdog saw the collective stall first.
    leader = [e for e in result["events"] if e["event"] in ("watchdog-hang-detected", "watchdog-killed-on-term")
              and e["detail"].get("rank") == 0 and e["detail"].get("step_id") == result["failed_step"]]
    assert leader and leader[0]["detail"]["revoked"], f"registration not revoked: {leader}"
    assert 1.5 < result["detect_s"] < 6.0  # gms_failover: health 2 s (+0.5 s probe)
    assert all(node["all_gone"] and not node["left"] for node in result["nodes"])
    assert result["orphans"] == [] and result["relaunch_s"] is not None and result["first_ok_s"] is not None


def test_a_gms_server_killed_on_one_node_is_started_again_and_the_writer_republishes(job):
    """A GMS server that dies on one node ends no step (the gms step has no --kill-on-bad-exit): its keeper
    (slurm/keeper.py) starts it again, empty, and the supervisor has the writer, cohort 0, republish, the node
    agent's way (policy.republish_choice): cohort 0 serves since the last test and cohort 1 is parked, so cohort 0's
    step is ended, cohort 1 is promoted, and cohort 0 is relaunched and parks with its weights published again."""
    assert job_json(job["dir"])["serving"] == 0, "the last test promoted cohort 0"
    t0 = time.time()
    server = "^[^ ]+ -m shadowline[.]standin[.]gms_server( |$)"  # the server, not its keeper (whose argv names it too)
    before = on("node1", "pgrep", "-f", server).split()
    assert len(before) == 1, before
    on("node1", "pkill", "-KILL", "-f", server)

    def after(kind: str) -> list[dict]:
        return [e for e in events(job["dir"]) if e["event"] == kind and e["time"] >= t0]

    restarted = wait_for(lambda: after("gms-restarted"), 30, "the keeper to start node1's server again")
    assert restarted[0]["node"] == "node1"
    (republish,) = wait_for(lambda: after("gms-republish"), 10, "the supervisor's republish")
    assert republish["detail"]["choice"] == "republish" and republish["cohort"] == 0
    promoted = wait_for(lambda: after("promoted"), 30, "cohort 1's promotion")
    assert promoted[0]["cohort"] == 1
    parked = wait_for(lambda: [e for e in after("parked") if e["cohort"] == 0], 120, "cohort 0 to park again")
    assert parked[0]["generation"] > republish["generation"]
    now = on("node1", "pgrep", "-f", server).split()
    assert len(now) == 1 and now != before
    status, body = complete("http://198.18.3.10:8000", "shadowline/tiny-llama", timeout=10)
    assert status == 200, body
    print(f"\ngms killed on node1: restarted after {restarted[0]['time'] - t0:.2f} s, cohort 1 promoted after "
          f"{promoted[0]['time'] - t0:.2f} s, cohort 0 parked again after {parked[0]['time'] - t0:.2f} s")


def test_scancel_of_the_job_leaves_nothing_running(job):
    assert processes("node0") and processes("node1"), "the deployment runs before the scancel"
    on("node0", "scancel", job["id"])
    wait_for(lambda: not on("node0", "squeue", "-h", "-j", job["id"], check=False).strip(), 60, "the job to end")
    wait_for(lambda: not (processes("node0") + processes("node1")), 15, "every process of the job to go")
    kinds = [e["event"] for e in events(job["dir"])]
    assert "shutdown" in kinds
    for host in ("node0", "node1"):
        jobs = "ls /sys/fs/cgroup/freezer/slurm*/uid_0/ 2>/dev/null | grep -c job_ || true"
        assert on(host, "bash", "-c", jobs).strip() == "0", f"job cgroups left on {host}"


def test_orderly_stop_before_the_time_limit(job):
    """What --signal=B:TERM@<lead> does before the time limit: SIGTERM to the batch shell only (the supervisor),
    which stops the shadows, then the serving cohort, then the infra, cleans the nodes and ends the job."""
    job_id = on("node0", "bash", "-c", f"cd {job['run']} && sbatch --parsable {job['script']}").strip().split(";")[0]
    job_dir = job["dir"].parent / f"shadowline-slurmtest-{job_id}"
    try:
        wait_for(lambda: any(e["event"] == "deployment-ready" for e in events(job_dir)), 120, "the second job to serve")
        on("node0", "scancel", "--batch", "--signal=TERM", job_id)
        wait_for(lambda: not on("node0", "squeue", "-h", "-j", job_id, check=False).strip(), 90, "the job to end")
    finally:
        on("node0", "scancel", job_id, check=False)
    record = events(job_dir)
    kinds = [e["event"] for e in record]
    assert {"shutdown", "stopped"} <= set(kinds) and record[-1]["event"] == "stopped"
    assert record[-1]["detail"]["exit"] == 0
    assert next(e for e in record if e["event"] == "shutdown")["detail"]["reason"] == "SIGTERM"
    stopped = [e["detail"]["step"] for e in record if e["event"] == "step-stopped"]
    assert stopped[:2] == ["cohort_1", "cohort_0"], "the parked shadow first, the serving cohort after it"
    assert stopped[2:] == ["frontend", "nats", "etcd", "gms", "etcd_proxy"]
    cleanup = [e for e in record if e["event"] == "step-ended" and e["detail"].get("step") == "cleanup"]
    assert cleanup and cleanup[0]["detail"]["exit"] == 0, kinds
    assert "JobState=COMPLETED" in on("node0", "scontrol", "show", "job", job_id)
    # slurmstepd exits a moment after the job (about 2.3 s measured on the testbed): bounded wait, then nothing
    wait_for(lambda: not (processes("node0") + processes("node1")), 15, "every process of the job to go")
    for host in ("node0", "node1"):
        assert on(host, "bash", "-c", "test -e /tmp/shadowline-slurmtest && echo left || echo clean").strip() == "clean"
