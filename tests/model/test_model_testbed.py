"""The model lifecycle on 3 testbed hosts, through ansible-playbook as a user runs it (run as root):

    /work/main/.venv/bin/pytest tests/model/test_model_testbed.py -q -s     (-s prints the measured figures)

Testbed instance 2 (198.18.2.0/24, inventory ``.testbed-2/inventory``, whose ``group_vars`` link is
``inventories/testbed/group_vars``); test-specific values come from extra-vars files (``-e @file``). Several
engineers run testbeds on this machine, so ``testbed/testbed.py`` is loaded here as a module of its own bound to
instance 2 (``SHADOWLINE_TESTBED=2`` while it loads); ``testbed.testbed`` and other instances are left alone.

The model sources are small generated safetensors models under ``/var/tmp`` (which every host sees through its
overlay; ``/tmp`` is a tmpfs per host); the rsync daemons run inside node0 as transient units (``systemd-run``)
bound to node0's address. Everything stays on 198.18.2.0/24 and loopback; every wait is bounded; the testbed is
torn down at the end and ``leaks()`` must be empty.

In order (later tests build on the models staged by earlier ones):
1. playbooks/model.yml stages from file:// on all 3 hosts, files 0644, the digest of the source;
2. a second run changes nothing and re-verifies in well under a second per host;
3. the same model from rsync:// (daemon on node0) gets the same digest on all 3 hosts;
4. a staging killed on node1 (throttled daemon) leaves no local_dir, and the next run resumes it;
5. a corrupted shard on node2 is detected and fetched again, nothing else changes;
6. a pickle-only source and an unpinned revision are refused with the field and the fix before anything changes;
7. a node whose copy has another digest makes the engine role's gate refuse to start engines (none started);
   model.yml then names the node and the command that restages it, which repairs the deployment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest
from modelkit import make_model

from testbed.instances import load_testbed

REPO = Path(__file__).resolve().parents[2]
INSTANCE = "2"
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
MODEL_UTILS = REPO / "plugins" / "module_utils"
DEPLOYMENT = "mtest"
MODEL_ID = "acme/tiny-llm"
REV_FILE = "1" * 40  # staged from file://
REV_RSYNC = "2" * 40  # the same content from rsync://
REV_RESUME = "3" * 40  # killed half-way on node1, then resumed
REV_PICKLE = "4" * 40
NODES = ("node0", "node1", "node2")
RSYNC_PORT = 8873  # node0, no limit
RSYNC_SLOW_PORT = 8874  # node0, --bwlimit: slow enough to interrupt
RSYNC_SLOW_KIBPS = 1024
PLAYBOOK_TIMEOUT_S = 240
RECAP = re.compile(r"^(?P<host>node\d)\s+:\s+ok=\d+\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
                   r"\s+failed=(?P<failed>\d+)", re.MULTILINE)
TABLE_ROW = re.compile(r'^\s*"(?P<host>node\d)\s+(?P<status>\w+)\s+(?P<revision>\S+)\s+(?P<digest>\S+)\s+'
                       r'(?P<files>\S+)\s+(?P<size>\S+ \S+|-)\s+(?P<last>.*?)",?$', re.MULTILINE)
FIGURES: list[str] = []


tb = load_testbed(INSTANCE)  # testbed/testbed.py bound to instance 2 only; testbed.testbed is left alone
assert tb.INSTANCE == int(INSTANCE)
INVENTORY = tb.INVENTORY.parent  # .testbed-2/inventory (hosts.yml and the group_vars link)
ADDRESS = {f"node{i}": f"{tb.PREFIX}.{10 + i}" for i in range(3)}


def figure(line: str) -> None:
    FIGURES.append(line)
    print(f"\n[figure] {line}")


# ----------------------------------------------------------------------------------------------- running things
@dataclass
class Run:
    rc: int
    out: str
    seconds: float
    lines: list[tuple[float, str]] = field(default_factory=list)  # (seconds since start, line)

    def recap(self) -> dict[str, dict[str, int]]:
        return {m["host"]: {k: int(m[k]) for k in ("changed", "unreachable", "failed")} for m in RECAP.finditer(self.out)}

    def table(self) -> dict[str, dict[str, str]]:
        """The model_cache role's table (the last one printed), by host."""
        rows: dict[str, dict[str, str]] = {}
        for match in TABLE_ROW.finditer(self.out):
            rows[match["host"]] = match.groupdict()
        return rows

    def task_seconds(self, task: str) -> dict[str, float]:
        """Per host: seconds from the task's header to the host's result line (how long the task took for it)."""
        start = None
        out: dict[str, float] = {}
        for t, line in self.lines:
            if line.startswith("TASK ["):
                if start is not None and out:
                    break
                start = t if task in line else None
                continue
            match = re.match(r"^(?:ok|changed|failed|fatal): \[(node\d)\]", line)
            if start is not None and match and match[1] not in out:
                out[match[1]] = round(t - start, 2)
        return out

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.out.splitlines()[-n:])


class Playbook:
    """ansible-playbook from the checkout root with the repo's ansible.cfg; stdout lines are timestamped."""

    def __init__(self, playbook: str | Path, *extra: str | Path, args: tuple[str, ...] = ()) -> None:
        argv = [str(ANSIBLE_PLAYBOOK), "-i", str(INVENTORY), str(playbook), *args]
        for item in extra:
            argv += ["-e", f"@{item}"] if isinstance(item, Path) else ["-e", item]
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_FORCE_COLOR="0", PYTHONUNBUFFERED="1")
        self.start = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic() - self.start, line.rstrip("\n")))

    def wait(self, timeout: float = PLAYBOOK_TIMEOUT_S) -> Run:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = -9
        self.reader.join(timeout=10)
        seconds = round(time.monotonic() - self.start, 2)
        return Run(rc, "\n".join(line for _unused, line in self.lines), seconds, list(self.lines))


def playbook(name: str, *extra: str | Path, args: tuple[str, ...] = ()) -> Run:
    path = name if name.startswith("/") else REPO / "playbooks" / name
    return Playbook(path, *extra, args=args).wait()


def on(host: str, *argv: str, check: bool = True, timeout: float = 30) -> str:
    """Run argv inside a testbed host; its stdout."""
    proc = tb.exec_in(host, list(argv), timeout=timeout)
    if check:
        assert proc.returncode == 0, f"{host}: {argv} exited {proc.returncode}: {proc.stderr.strip()}"
    return proc.stdout


def local_dir(revision: str, model_id: str = MODEL_ID) -> str:
    return f"/var/lib/shadowline/models/{model_id.replace('/', '--')}/{revision}"


def status_of(host: str, revision: str, model_id: str = MODEL_ID) -> dict[str, Any] | None:
    parent, name = os.path.split(local_dir(revision, model_id))
    text = on(host, "cat", f"{parent}/.shadowline-model-{name}.status.json", check=False)
    return json.loads(text) if text.strip() else None


def run_library(host: str, code: str) -> str:
    """Python with the staging library (shadowline.model) inside a host; what it prints."""
    return on(host, "python3", "-c", f"import sys; sys.path.insert(0, {str(MODEL_UTILS)!r})\n{code}", timeout=60)


# ------------------------------------------------------------------------------------------------------ fixtures
@dataclass
class Bed:
    root: Path  # under /var/tmp: every host sees it
    tmp: Path  # controller-only files (extra vars, playbooks)
    model_a: Path
    model_b: Path
    pickled: Path
    digest_a: str
    digest_b: str
    size_a: int

    def vars_file(self, name: str, revision: str, source: str, model_id: str = MODEL_ID, **more: Any) -> Path:
        data = {"gms_deployment": DEPLOYMENT, "model_cache_progress_interval_s": 1,
                "gms_model": {"id": model_id, "revision": revision, "source": source}, **more}
        path = self.tmp / f"{name}.json"
        path.write_text(json.dumps(data))  # JSON is YAML
        return path


def _expected_digest(source: Path, scratch: Path) -> str:
    """The digest the nodes must report: the library staging the same directory on the controller."""
    sys.path.insert(0, str(MODEL_UTILS))
    from shadowline.model.spec import spec_from_inventory
    from shadowline.model.stage import ensure_model

    spec = spec_from_inventory({"id": MODEL_ID, "revision": REV_FILE, "source": f"file://{source}",
                                "local_dir": str(scratch / source.name)})
    return ensure_model(spec).digest or ""


def _rsync_daemon(root: Path, port: int, bwlimit_kibps: int | None) -> str:
    """An rsync daemon inside node0 bound to node0's address, as a transient unit; returns the unit name."""
    unit = f"shadowline-test-rsyncd-{port}"
    conf = root / f"rsyncd-{port}.conf"
    conf.write_text("\n".join([
        "use chroot = no", "uid = root", "gid = root", f"log file = /run/{unit}.log", "transfer logging = yes",
        "log format = %a %o %f %l %b", "[models]", f"  path = {root}", "  read only = yes", ""]))
    argv = ["systemd-run", f"--unit={unit}", "--collect", "--quiet", "rsync", "--daemon", "--no-detach",
            f"--config={conf}", f"--address={ADDRESS['node0']}", f"--port={port}"]
    on("node0", *argv, *([f"--bwlimit={bwlimit_kibps}"] if bwlimit_kibps else []))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        probe = tb.exec_in("node1", ["rsync", "--list-only", "--contimeout=2", f"rsync://{ADDRESS['node0']}:{port}/"],
                           timeout=10)
        if probe.returncode == 0 and "models" in probe.stdout:
            return unit
        time.sleep(0.2)
    raise AssertionError(f"rsync daemon {unit} on node0 did not answer: {probe.stderr}")


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    if os.geteuid() != 0:
        pytest.skip("the testbed needs root")
    for tool in ("ip", "unshare", "nsenter", "ssh", "rsync"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is missing (testbed/testbed.py install-packages; apt-get install rsync)")
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip("ansible is not installed in .venv (make setup)")
    tb.down()  # a fresh instance 2: no deployment left from an earlier run (its ports would fail preflight)
    state = tb.up(3, False)
    figure(f"testbed instance {INSTANCE}: 3 hosts booted in {state.boot_seconds} s")
    root = Path(f"/var/tmp/shadowline-testbed-{INSTANCE}-models-{uuid.uuid4().hex[:8]}")
    tmp = tmp_path_factory.mktemp("model-testbed")
    units: list[str] = []
    try:
        model_a = make_model(root / "tiny-llm", shards=3, shard_kib=2048, seed=11)
        model_b = make_model(root / "tiny-llm-other", shards=3, shard_kib=2048, seed=12)
        pickled = root / "pickled"
        pickled.mkdir()
        (pickled / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
        (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04\x95" + os.urandom(4096))  # a pickle stream
        os.chmod(root, 0o755)
        digest_a = _expected_digest(model_a, tmp / "ref")
        digest_b = _expected_digest(model_b, tmp / "ref")
        size_a = sum(p.stat().st_size for p in model_a.iterdir() if p.name != "README.md")
        units.append(_rsync_daemon(root, RSYNC_PORT, None))
        units.append(_rsync_daemon(root, RSYNC_SLOW_PORT, RSYNC_SLOW_KIBPS))
        yield Bed(root, tmp, model_a, model_b, pickled, digest_a, digest_b, size_a)
    finally:
        for unit in units:
            tb.exec_in("node0", ["systemctl", "stop", unit], timeout=30)
        tb.down()
        shutil.rmtree(root, ignore_errors=True)
        left = tb.leaks()
        assert not left, f"testbed instance {INSTANCE} left things on the machine: {left}"
        print("\n" + "\n".join(f"[figure] {line}" for line in FIGURES))


def file_vars(bed: Bed) -> Path:
    return bed.vars_file("file", REV_FILE, f"file://{bed.model_a}")


def assert_all_ready(run: Run, digest: str, hosts: tuple[str, ...] = NODES) -> dict[str, dict[str, str]]:
    table = run.table()
    assert set(hosts) <= set(table), f"no table row for every node:\n{run.tail()}"
    for host in hosts:
        assert table[host]["status"] == "Ready", f"{host}: {table[host]}\n{run.tail()}"
        assert digest.startswith(table[host]["digest"]), f"{host}: digest {table[host]['digest']} != {digest}"
    return table


def _rate(last: str) -> tuple[float, float]:
    """(MiB fetched, seconds) from a table's 'staged: fetched 6.0 MiB in 85 ms, ...'."""
    match = re.search(r"fetched ([\d.]+) (KiB|MiB|GiB) in ([\d.]+) (ms|s)", last)
    assert match, last
    mib = float(match[1]) * {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[match[2]]
    seconds = float(match[3]) / (1000 if match[4] == "ms" else 1)
    return mib, seconds


def throughput(table: dict[str, dict[str, str]]) -> str:
    parts = {h: _rate(r["last"]) for h, r in table.items()}
    total_mib = sum(m for m, _unused in parts.values())
    slowest = max(s for _unused, s in parts.values())
    per_host = ", ".join(f"{h} {m / s:.0f} MiB/s" for h, (m, s) in sorted(parts.items()))
    return f"{total_mib:.1f} MiB onto {len(parts)} hosts in {slowest:.2f} s = {total_mib / slowest:.0f} MiB/s ({per_host})"


# --------------------------------------------------------------------------------------------------------- tests
def test_file_source_stages_on_every_node(bed: Bed):
    run = playbook("model.yml", file_vars(bed))
    assert run.rc == 0, run.tail()
    table = assert_all_ready(run, bed.digest_a)
    assert all(r["last"].startswith("staged") for r in table.values()), table
    figure(f"model.yml file:// first staging: {throughput(table)}; playbook {run.seconds} s")
    for host in NODES:
        assert status_of(host, REV_FILE)["digest"] == bed.digest_a
        modes = on(host, "stat", "-c", "%a %n", f"{local_dir(REV_FILE)}", *(
            f"{local_dir(REV_FILE)}/{p.name}" for p in bed.model_a.glob("*.safetensors")))
        assert {line.split()[0] for line in modes.splitlines()} == {"755", "644"}, modes  # the source is 0600
        assert on(host, "test", "!", "-e", f"{local_dir(REV_FILE)}/README.md", check=False) == ""


def test_second_run_changes_nothing_and_reverifies_fast(bed: Bed):
    run = playbook("model.yml", file_vars(bed))
    assert run.rc == 0, run.tail()
    assert {h: r["changed"] for h, r in run.recap().items()} == {h: 0 for h in NODES}, run.tail()
    table = assert_all_ready(run, bed.digest_a)
    verify_ms = {}
    for host, row in table.items():
        match = re.fullmatch(r"verified in ([\d.]+) ms \(0 B hashed\)", row["last"])
        assert match, f"{host} did not re-verify without hashing: {row['last']}"
        verify_ms[host] = float(match[1])
    task = run.task_seconds("Stage the model, or re-verify the copy in place")
    assert set(task) == set(NODES) and max(task.values()) < 5, task
    assert max(verify_ms.values()) < 1000
    figure(f"model.yml second run: changed=0; re-verify in the module {verify_ms} ms; the task per host "
           f"(ssh + module) {task} s; whole playbook (preflight included) {run.seconds} s")


def test_rsync_source_stages_the_same_digest_on_every_node(bed: Bed):
    source = f"rsync://{ADDRESS['node0']}:{RSYNC_PORT}/models/{bed.model_a.name}"
    run = playbook("model.yml", bed.vars_file("rsync", REV_RSYNC, source))
    assert run.rc == 0, run.tail()
    table = assert_all_ready(run, bed.digest_a)  # content-only digest: the same as from file://
    figure(f"model.yml rsync:// (daemon on node0) first staging: {throughput(table)}; playbook {run.seconds} s")
    for host in NODES:
        assert on(host, "test", "-e", f"{local_dir(REV_RSYNC)}/.rsync-partial", check=False) == ""


def test_interrupted_staging_resumes(bed: Bed):
    source = f"rsync://{ADDRESS['node0']}:{RSYNC_SLOW_PORT}/models/{bed.model_a.name}"
    extra = bed.vars_file("resume", REV_RESUME, source, model_cache_background_min_bytes=0)  # with progress lines
    background = Playbook(REPO / "playbooks" / "model.yml", extra)
    killed = None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and background.proc.poll() is None:
        status = status_of("node1", REV_RESUME) or {}
        progress = status.get("progress") or {}
        if status.get("state") == "Downloading" and progress.get("bytes_done", 0) >= 0.45 * bed.size_a:
            pid = int(status["pid"])
            # rsync gets SIGTERM (it keeps its partial file), the staging process SIGKILL: a node that dies mid-way
            on("node1", "sh", "-c", f"pkill -TERM -P {pid}; kill -KILL {pid}")
            killed = progress
            break
        time.sleep(0.2)
    first = background.wait()
    assert killed, f"node1 never showed download progress to interrupt:\n{first.tail()}"
    assert first.rc != 0 and "model staging failed on node1" in first.out, first.tail()
    assert "the staging process died without a result" in first.out and "Re-run to resume" in first.out
    assert re.search(r"ok: \[node\d\] => \(item=Downloading: download: [\d.]+ \S+ / [\d.]+ MiB \([\d.]+%\), "
                     r"\d+/\d+ files, [\d.]+ \S+/s, ETA \S+\)", first.out), "no progress line on the controller"
    assert on("node1", "test", "-e", local_dir(REV_RESUME), check=False) == ""  # never half-written
    staging = f"{os.path.dirname(local_dir(REV_RESUME))}/.{REV_RESUME}.staging-{REV_RESUME}"
    kept = on("node1", "find", staging, "-type", "f", "-name", "*.safetensors").split()
    assert kept, "the interrupted staging kept nothing"
    assert (status_of("node1", REV_RESUME) or {}).get("state") == "Downloading"  # dead pid: the next run corrects it
    log = f"/run/shadowline-test-rsyncd-{RSYNC_SLOW_PORT}.log"
    before = len(on("node0", "cat", log).splitlines())

    second = playbook("model.yml", bed.vars_file("resume-again", REV_RESUME, source))  # small: in the foreground
    assert second.rc == 0, second.tail()
    assert_all_ready(second, bed.digest_a)
    assert second.recap()["node1"]["changed"] >= 1 and second.recap()["node0"]["changed"] == 0
    sent = [line.split() for line in on("node0", "cat", log).splitlines()[before:]
            if f" {ADDRESS['node1']} send " in line]
    resent = sum(int(fields[-1]) for fields in sent)  # %b: bytes actually sent for each file
    assert 0 < resent < bed.size_a, f"the resumed transfer sent {resent} of {bed.size_a} bytes: {sent}"
    assert on("node1", "test", "-e", staging, check=False) == ""
    figure(f"interrupted on node1 at {killed['bytes_done']} of {killed['bytes_total']} bytes "
           f"({len(kept)} file(s) kept in staging); the resumed run sent {resent} bytes "
           f"({resent / bed.size_a:.0%} of the model)")


def test_corrupted_file_is_detected_and_restaged(bed: Bed):
    shard = sorted(bed.model_a.glob("*.safetensors"))[1]
    target = f"{local_dir(REV_FILE)}/{shard.name}"
    run_library("node2", f"f = open({target!r}, 'r+b'); f.seek(1 << 20); f.write(b'bitrot' * 100); f.close()")
    run = playbook("model.yml", file_vars(bed))
    assert run.rc == 0, run.tail()
    table = assert_all_ready(run, bed.digest_a)
    assert table["node2"]["last"].startswith("repaired 1 file(s)"), table["node2"]
    assert all(table[h]["last"].startswith("verified") for h in ("node0", "node1")), table
    assert {h: r["changed"] for h, r in run.recap().items()} == {"node0": 0, "node1": 0, "node2": 1}
    assert on("node2", "sha256sum", target).split()[0] == subprocess.run(
        ["sha256sum", str(shard)], capture_output=True, text=True, check=True).stdout.split()[0]
    figure(f"corrupted shard on node2 repaired: {table['node2']['last']}")


def test_pickle_and_unpinned_revision_are_refused_before_anything_changes(bed: Bed):
    listing = ("find", "/var/lib/shadowline", "-printf", "%p %s %T@ %C@\\n")
    before = {h: on(h, *listing) for h in NODES}
    pickled = playbook("model.yml", bed.vars_file("pickle", REV_PICKLE, f"file://{bed.pickled}", "acme/pickled"))
    assert pickled.rc != 0
    assert "only pickle weights [pytorch_model.bin]" in pickled.out, pickled.tail()
    assert '"field": "gms_model_allow_pickle"' in pickled.out and "Fix: stage a safetensors conversion" in pickled.out
    unpinned = playbook("model.yml", bed.vars_file("unpinned", "main", f"file://{bed.model_a}"))
    assert unpinned.rc != 0
    assert "gms_model.revision: 'main' is not a pinned 40-hex commit id" in unpinned.out, unpinned.tail()
    assert "Fix: set the exact commit" in unpinned.out and "gms_model_allow_unpinned: true" in unpinned.out
    for host in NODES:
        assert on(host, *listing) == before[host], f"{host}: something changed under /var/lib/shadowline"
        assert on(host, "test", "-e", "/var/lib/shadowline/models/acme--pickled", check=False) == ""
    assert "Stage the model, or re-verify" not in pickled.out + unpinned.out  # stopped before staging anywhere


def test_engine_gate_refuses_a_node_whose_model_differs(bed: Bed):
    # node1 holds the pinned revision with other content (staged from another directory under the same label)
    run_library("node1", "\n".join([
        "from shadowline.model.spec import spec_from_inventory",
        "from shadowline.model.stage import ensure_model, remove_model",
        f"spec = spec_from_inventory({{'id': {MODEL_ID!r}, 'revision': {REV_FILE!r}, "
        f"'source': 'file://{bed.model_b}', 'local_dir': {local_dir(REV_FILE)!r}}})",
        "remove_model(spec)",
        "print(ensure_model(spec).digest)"]))
    engine_play = bed.tmp / "engine.yml"
    engine_play.write_text(json.dumps([
        {"name": "Preflight", "ansible.builtin.import_playbook": str(REPO / "playbooks" / "preflight.yml")},
        {"name": "Engines", "hosts": "gms_nodes", "gather_facts": False, "roles": ["shadowline.gms.engine"]}]))
    gate = playbook(str(engine_play), file_vars(bed))
    assert gate.rc != 0
    message = (f"node1: manifest digest {bed.digest_b[:19]}… differs from {bed.digest_a[:19]}… "
               "held by node0, node2; restage node1.")
    assert "engines not started: every node must hold the same verified model" in gate.out, gate.tail()
    assert message in gate.out, gate.tail()
    assert f"Fix: run ansible-playbook -i {INVENTORY} playbooks/model.yml" in gate.out
    for host in NODES:
        units = on(host, "systemctl", "list-units", "--all", "--no-legend", f"shadowline-{DEPLOYMENT}-engine@*")
        assert units.strip() == "", f"{host}: {units}"
        assert on(host, "sh", "-c", f"ls /etc/systemd/system | grep -c 'shadowline-{DEPLOYMENT}-engine' || true"
                  ).strip() == "0"

    # model.yml names the node and how to restage it; doing so makes every node equal again
    check = playbook("model.yml", file_vars(bed))
    assert check.rc != 0 and message in check.out, check.tail()
    restage = """'{"model_cache_restage_hosts": ["node1"]}'"""
    assert f"playbooks/model.yml -e {restage}" in check.out, check.tail()
    fixed = playbook("model.yml", file_vars(bed), '{"model_cache_restage_hosts": ["node1"]}')
    assert fixed.rc == 0, fixed.tail()
    assert_all_ready(fixed, bed.digest_a)
    figure(f"engine gate refused ({gate.seconds} s for preflight + base + gate); node1 restaged in {fixed.seconds} s")
