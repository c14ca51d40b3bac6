"""python_env_mode container end to end (issue #16) on a 2-host testbed (instance 9, 198.18.9.0/24): the CPU
stand-in packaged as a local image (scripts/build-standin-image: this machine's Debian packages, the runtime of
`make runtime` and this project; nothing from a registry), loaded on every host by python_env from
gms_container.archive, and site.yml, a kill-leader drill and teardown.yml with the GMS servers, the engines and the
frontend running in it under systemd through podman; a second run changes nothing.

What differs from a GPU node, and why: gms_container.runtime is runc, because the testbed's hosts have the
machine's hybrid cgroup v1 hierarchies, which crun (podman's default on Debian 12) refuses; the stand-in's image
takes no GPU device (no CDI specification here); podman's storage is a tmpfs per host (testbed/host-init.sh),
because its overlay driver cannot keep layers on a host's overlay root.

Asserted on the hosts themselves: each of those processes runs the plan's argv in the image (its root has the
image's /opt/shadowline/runtime, which the host lacks), as the service user with no capability, inside its unit's
cgroup (podman --cgroups split); the drill's fault kills the engine itself and the relaunched rank runs in a new
container; after teardown.yml no container is left, and at the end nothing of the testbed is.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.inventory import failover_under_load
from testbed.pytest_fixtures import skip_reason

from . import launch
from .deployed import Deployed

INSTANCE = "9"
REPO = launch.REPO
HOSTS = ("node0", "node1")
IMAGE = "localhost/shadowline/standin-runtime:1.6.1"
ARCHIVE = REPO / "build" / "standin-runtime.tar"
EXTRA_VARS = {
    "python_env_mode": "container",
    "gms_python": "/opt/shadowline/demo/venv/bin/python",  # the host's small environment, for the agent
    "gms_container": {"archive": str(ARCHIVE), "runtime": "runc"},
    # the drill here is a kill (seen by the process's exit); the testbed's own 1 s detection of hangs declared a
    # healthy leader hung under CI's load once (CI of stop 48: cohort 1 served and the second run saw new pids)
    "gms_failover": failover_under_load(),
}
d = Deployed(INSTANCE, EXTRA_VARS)
tb = d.tb

pytestmark = pytest.mark.timeout(900)


def tail(proc: subprocess.CompletedProcess[str], lines: int = 60) -> str:
    return "\n".join((proc.stdout + proc.stderr).splitlines()[-lines:])


@pytest.fixture(scope="module")
def deployment() -> Iterator[dict[str, Any]]:
    if reason := skip_reason():
        pytest.skip(reason)
    if shutil.which("podman") is None:
        pytest.skip("podman is missing: scripts/setup-system installs bindep.txt")
    if not (REPO / ".runtime" / "bin" / "python").exists():
        subprocess.run(["make", "runtime"], cwd=REPO, check=True, capture_output=True, timeout=900)
    built = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "scripts/build-standin-image"], cwd=REPO,
                           capture_output=True, text=True, timeout=600, check=False)
    assert built.returncode == 0, built.stderr
    print(f"\n[figure] {built.stdout.strip()}")
    tb.down()
    tb.up(len(HOSTS), False)
    try:
        proc = d.playbook("site.yml", timeout=900)
        assert proc.returncode == 0, f"site.yml failed:\n{tail(proc)}"
        yield {"site": proc}
    finally:
        tb.down()
        left = tb.leaks()
        assert not left, f"testbed instance {INSTANCE} left things on the machine: {left}"


def unit_main(host: str, unit: str) -> dict[str, Any]:
    """The process that runs the plan's argv in ``unit`` (the container's first one), read on ``host``."""
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[2]);"
        "from shadowline.cluster.cohort_state import unit_status;"
        "pid = unit_status(sys.argv[1])['pid'];"
        "status = dict(l.split(':', 1) for l in open(f'/proc/{pid}/status') if ':' in l);"
        "print(json.dumps({'pid': pid, 'argv': open(f'/proc/{pid}/cmdline').read().split(chr(0))[:-1],"
        "'cgroup': open(f'/proc/{pid}/cgroup').read(), 'uid': status['Uid'].split()[0],"
        "'cap_eff': status['CapEff'].strip(),"
        "'image_root': __import__('os').path.isdir(f'/proc/{pid}/root/opt/shadowline/runtime')}))")
    site = "/opt/shadowline/demo/venv/lib/python3.11/site-packages"
    return json.loads(d.on(host, "/usr/bin/python3", "-c", script, unit, site))


def containers(host: str) -> dict[str, str]:
    return {c["Names"][0]: c["State"] for c in json.loads(d.on(host, "podman", "ps", "--all", "--format", "json"))}


def test_every_gpu_process_runs_the_plans_argv_in_the_image(deployment: dict[str, Any]) -> None:
    plan = d.plan()
    assert plan.container is not None and plan.container.image == IMAGE
    uid = d.on("node0", "id", "-u", plan.service_user).strip()
    for host in HOSTS:
        units = {plan.unit_name("gms"): plan.gms_server_on(host).argv}
        units.update({plan.unit_name("engine", c.cohort): c.rank_on(host).process.argv for c in plan.cohorts})
        if host == plan.infra.frontend.host:
            units[plan.unit_name("frontend")] = plan.infra.frontend.argv
        for unit, argv in units.items():
            main = unit_main(host, unit)
            assert main["argv"] == list(argv), f"{host} {unit}: {main['argv']}"
            assert main["image_root"], f"{host} {unit}: pid {main['pid']} does not run in the image"
            assert f"/{unit}/libpod-payload-" in main["cgroup"], main["cgroup"]  # in its unit's cgroup
            assert main["uid"] == uid and main["cap_eff"] == "0000000000000000", main
        running = containers(host)
        assert running == {
            unit[:-len(".service")].replace("@", "-"): "running" for unit in units}, running
        # the host itself has no runtime of the image: the processes cannot be running from the host's files
        probe = tb.exec_in(host, ["test", "-e", "/opt/shadowline/runtime"], timeout=10)
        assert probe.returncode == 1


def test_a_second_run_changes_nothing_and_restarts_no_container(deployment: dict[str, Any]) -> None:
    plan = d.plan()
    since = time.time()
    before = {h: unit_main(h, plan.unit_name("engine", 0))["pid"] for h in HOSTS}
    proc = d.playbook("site.yml", "--tags", "runtime,gms_server,frontend,engine,agent", timeout=600)
    assert proc.returncode == 0, tail(proc)
    recap = dict(re.findall(r"^(node\d+)\s+: ok=\d+\s+changed=(\d+)", proc.stdout, re.MULTILINE))
    assert recap == {host: "0" for host in HOSTS}, (recap, tail(proc))
    after = {h: unit_main(h, plan.unit_name("engine", 0))["pid"] for h in HOSTS}
    assert after == before, f"new engine processes {before} -> {after}; the agents said:\n{d.story(since)}"


def test_a_kill_leader_drill_kills_the_engine_and_relaunches_it_in_a_new_container(
        deployment: dict[str, Any], tmp_path: Any) -> None:
    plan = d.plan()
    unit = plan.unit_name("engine", d.serving())  # the drill kills the serving cohort's leader
    before = unit_main("node0", unit)
    report_path = tmp_path / "kill-leader.json"
    proc = d.playbook("drill.yml", "-e", "fault=kill-leader", "-e", f"drill_report={report_path}",
                      "-e", "drill_warmup_s=1", "-e", "drill_tail_s=1")
    assert proc.returncode == 0 and "result: PASS" in proc.stdout, tail(proc)
    report = json.loads(report_path.read_text())
    assert f"SIGKILL pid {before['pid']} (" in proc.stdout, "the drill did not kill the engine process itself"
    print(f"\n[figure] container kill-leader: detect {report['detect_s']} s, promotion {report['promote_s']} s, "
          f"relaunch {report['relaunch_s']} s, failed {report['requests']['failed_raw']} raw / "
          f"{report['requests']['failed_sdk']} through the SDK")
    d.assert_whole()
    after = unit_main("node0", unit)
    assert after["pid"] != before["pid"] and after["image_root"] and after["argv"] == before["argv"]
    # the agent tracks the relaunched rank by the engine's own pid, not podman's (whose exit trails the engine's)
    launched = [e for e in d.events("node0", event="rank-launched") if e["cohort"] == 0]
    assert launched and launched[-1]["detail"]["pid"] == after["pid"], (launched[-1:], after["pid"])
    assert containers("node0")[unit[:-len(".service")].replace("@", "-")] == "running"


def test_teardown_leaves_no_container(deployment: dict[str, Any]) -> None:
    proc = d.playbook("teardown.yml")
    assert proc.returncode == 0, tail(proc)
    for host in HOSTS:
        assert containers(host) == {}, host
        assert d.on(host, "podman", "image", "exists", IMAGE) == ""  # the image stays: a redeploy loads nothing
