"""Fixtures and helpers of the deployment-role tests: ``test_site.py`` (site.yml on a 3-host testbed) and
``test_molecule.py`` (one Molecule scenario per role).

Testbed instances. Several testbeds run side by side on this machine; these tests use their own:

* ``test_site.py``: instance 4 (198.18.4.0/24, network namespaces ``sl4-node*``), inventory
  ``.testbed-4/inventory`` (its ``group_vars`` link is ``inventories/testbed/group_vars``: deployment ``demo``).
* the Molecule scenarios: instance 5 (198.18.5.0/24), booted and removed by the scenarios themselves
  (``extensions/molecule/default``), so both can run in one pytest session without touching each other.

``testbed/testbed.py`` reads ``SHADOWLINE_TESTBED`` once, when it is imported; other test directories of the same
session import it for their own instance. So ``tb`` below is the module loaded a second time, under its own name,
bound to instance 4 (``testbed.instances.load_testbed``); ``testbed.testbed`` itself is left alone.

Fixtures (registered for every test by tests/conftest.py: ``pytest_plugins``):
``site_runtime`` (the engines' runtime and the tiny model, made when missing) and ``site_testbed`` (three hosts
of instance 4, torn down at the end of the session; fails if anything of them is left).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

from testbed.instances import load_testbed
from testbed.pytest_fixtures import skip_reason

from .conftest import ensure_model
from .launch import NATS_JOURNAL, REPO, TINY_MODEL
from .launch import nats_refusals as launch_nats_refusals

SITE_INSTANCE = "4"
MOLECULE_INSTANCE = "5"
VENV_BIN = REPO / ".venv" / "bin"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # testbed addresses only, never a proxy
RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
                   r"\s+failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)\s+rescued=(?P<rescued>\d+)"
                   r"\s+ignored=(?P<ignored>\d+)", re.MULTILINE)

tb = load_testbed(SITE_INSTANCE)
SITE_INVENTORY = tb.INVENTORY.parent  # the directory: hosts.yml and the group_vars link


# -- fixtures ------------------------------------------------------------------------------------------------ #

@pytest.fixture(scope="session")
def site_runtime(standin_runtime: Path) -> Path:
    """The engines' interpreter (``.runtime``, tests/e2e/conftest.py) and the tiny model the testbed inventory
    and the Molecule scenarios stage (``.cache/models/tiny-llama``, as `make runtime` makes it)."""
    ensure_model(TINY_MODEL)
    return standin_runtime


INSTANCE_LOCK_WAIT_S = 600.0


@contextlib.contextmanager
def instance_lock(instance: str, wait_s: float = INSTANCE_LOCK_WAIT_S) -> Iterator[None]:
    """Hold testbed instance ``instance`` for this pytest session: another session that runs these tests at the
    same time (e.g. `make test` twice) waits, at most ``wait_s``, instead of tearing this one's hosts down."""
    path = Path(f"/run/lock/shadowline-e2e-testbed-{instance}.lock")
    with path.open("a+") as handle:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.seek(0)
                    raise AssertionError(f"testbed instance {instance} is still in use by another test session "
                                         f"({handle.read().strip() or 'unknown'}) after {wait_s:.0f} s")
                time.sleep(5)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def site_testbed() -> Iterator[Any]:
    """Three fresh hosts of testbed instance 4 (a running one is removed first: the deployment must start from
    nothing); removed at the end of the session, and nothing of them may be left on the machine."""
    if reason := skip_reason():
        pytest.skip(reason)
    with instance_lock(SITE_INSTANCE):
        tb.down()
        state = tb.up(3, False)
        try:
            yield state
        finally:
            tb.down()
            left = tb.leaks()
            assert not left, f"testbed instance {SITE_INSTANCE} left things on the machine: {left}"


def say(request: pytest.FixtureRequest, text: str) -> None:
    """A line on the terminal even while pytest captures output (the figures docs/roles.md quotes)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        print(text)
        return
    with capture.global_and_fixture_disabled():
        print(f"\n{text}")


# -- Ansible ------------------------------------------------------------------------------------------------- #

def ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    env["ANSIBLE_DEPRECATION_WARNINGS"] = "False"
    for name in ("ANSIBLE_INVENTORY", "ANSIBLE_STDOUT_CALLBACK", "ANSIBLE_CALLBACKS_ENABLED", "SHADOWLINE_TESTBED"):
        env.pop(name, None)
    return env


@dataclass
class PlaybookRun:
    """A finished ansible-playbook (or molecule) run."""

    argv: list[str]
    returncode: int
    output: str
    seconds: float
    recap: dict[str, dict[str, int]] = field(default_factory=dict)
    task_seconds: list[tuple[float, str]] = field(default_factory=list)  # (seconds, task), in run order
    log: Path | None = None

    def changed_tasks(self) -> list[str]:
        """``[host] task`` for every task that reported a change (to name them when there should be none)."""
        found, task = [], "?"
        for line in self.output.splitlines():
            if line.startswith(("TASK [", "RUNNING HANDLER [")):
                task = line.split("[", 1)[1].split("]")[0]
            elif line.startswith("changed: ["):
                found.append(f"[{line[10:].split(']')[0]}] {task}")
        return found

    def slowest(self, count: int = 8) -> str:
        return ", ".join(f"{task} {sec:.1f} s" for sec, task in sorted(self.task_seconds, reverse=True)[:count])

    def tail(self, lines: int = 60) -> str:
        return f"(full output: {self.log})\n" + "\n".join(self.output.splitlines()[-lines:])

    def ok(self) -> bool:
        return (self.returncode == 0 and bool(self.recap)
                and all(r["failed"] == 0 and r["unreachable"] == 0 for r in self.recap.values()))


LOG_DIR = REPO / ".cache" / "e2e-site"


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


# Where one step of a run's output starts: a play, a task, a handler, the recap; and Molecule's actions.
STEP = re.compile(r"^(TASK \[|PLAY \[|PLAY RECAP|RUNNING HANDLER \[|INFO +\[\S+ > \S+\] Executing)")


def run_logged(argv: list[str], log: Path, env: dict[str, str], timeout: float) -> PlaybookRun:
    """Run ``argv`` from the checkout root, timing every step of its output as it arrives (a task, a play, a
    Molecule action); the whole output, and the slowest steps, are kept in ``log``. Killed (with everything it
    started) after ``timeout`` seconds, also when it prints nothing."""
    started = time.monotonic()
    lines: list[str] = []
    tasks: list[tuple[float, str]] = []
    task, task_started = "", started
    with subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True) as proc:
        killer = threading.Timer(timeout, _kill_group, (proc.pid,))
        killer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                now = time.monotonic()
                if STEP.match(line):
                    if task:
                        tasks.append((round(now - task_started, 1), task))
                    task, task_started = line.strip().rstrip("*").strip(), now
                lines.append(line)
            returncode = proc.wait()
        finally:
            killer.cancel()
    if returncode == -signal.SIGKILL:
        lines.append(f"\n[test] {Path(argv[0]).name} killed after {timeout} s\n")
    output = "".join(lines)
    run = PlaybookRun(argv, returncode, output, round(time.monotonic() - started, 1), task_seconds=tasks)
    run.recap = {m["host"]: {k: int(v) for k, v in m.groupdict().items() if k != "host"}
                 for m in RECAP.finditer(output)}
    log.parent.mkdir(parents=True, exist_ok=True)
    run.log = log
    log.write_text(output + f"\n[test] {' '.join(argv[1:])}: {run.seconds} s; slowest steps: {run.slowest(15)}\n")
    return run


def run_playbook(playbook: str, *args: str, inventory: Path = SITE_INVENTORY, timeout: float = 900,
                 log_name: str | None = None) -> PlaybookRun:
    """ansible-playbook from the checkout root, as the README says; the PLAY RECAP parsed, every task timed, the
    whole output kept in .cache/e2e-site/<log_name>.log."""
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "playbooks" / playbook), *args]
    return run_logged(argv, LOG_DIR / f"{log_name or Path(playbook).stem}.log", ansible_env(), timeout)


def ansible_adhoc(pattern: str, module: str, module_args: str = "", *args: str, inventory: Path = SITE_INVENTORY,
                  timeout: float = 300) -> dict[str, dict[str, Any]]:
    """``ansible PATTERN -m MODULE -a ARGS``: every host's JSON result, by host (failed results included)."""
    argv = [str(VENV_BIN / "ansible"), "-i", str(inventory), pattern, "-m", module,
            *(["-a", module_args] if module_args else []), *args]
    proc = subprocess.run(argv, cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, check=False)
    results: dict[str, dict[str, Any]] = {}
    decoder = json.JSONDecoder()
    for match in re.finditer(r"^(\S+) \| (SUCCESS|CHANGED|FAILED!|UNREACHABLE!) => ", proc.stdout, re.MULTILINE):
        value, _unused = decoder.raw_decode(proc.stdout, match.end())
        results[match.group(1)] = {**value, "_status": match.group(2)}
    if not results:
        raise AssertionError(f"{' '.join(argv[:6])}...: no result (rc {proc.returncode}):\n{proc.stdout[-3000:]}")
    return results


def cohort_plan(extra_vars: Sequence[str] = ()) -> dict[str, Any]:
    """The cohort plan of the testbed inventory (shadowline.gms.cohort_plan, on the controller)."""
    args = [a for v in extra_vars for a in ("-e", v)]
    result = ansible_adhoc("gms_nodes[0]", "shadowline.gms.cohort_plan", "", *args)
    value = next(iter(result.values()))
    assert "plan" in value, f"cohort_plan failed: {value}"
    return value["plan"]


def cohort_info(plan: dict[str, Any], vars_dir: Path) -> dict[str, dict[str, Any]]:
    """shadowline.gms.cohort_info on every node, by host: ``ranks`` and ``lock_holder``."""
    vars_file = vars_dir / "cohort-info-plan.json"
    vars_file.write_text(json.dumps({"status_plan": plan}))
    results = ansible_adhoc("gms_nodes", "shadowline.gms.cohort_info",
                            '{"plan": "{{ status_plan }}", "host": "{{ inventory_hostname }}"}',
                            "-e", f"@{vars_file}")
    for host, value in results.items():
        assert value["_status"] == "SUCCESS" and "ranks" in value, f"cohort_info on {host}: {value}"
    return results


STATUS_ROW = re.compile(r'^\s*"?(?P<cohort>\d+)\s+(?P<role>primary|shadow)\s+(?P<node>\S+)\s+(?P<rank>\d+)\s+'
                        r'(?P<pid>\d+|-)\s+(?P<state>\S+)\s+(?P<lock>holder)?\s*(?P<ports>\d+/\d+/\d+)\s+(?P<model>[^\s"]+)"?,?$',
                        re.MULTILINE)


def status_table_rows(output: str) -> list[dict[str, str]]:
    """The rows of the last status table a playbook printed (playbooks/status.yml's shadowline.gms.show)."""
    start = output.rfind("TASK [Print the status table]")
    assert start >= 0, "the playbook printed no status table"
    return [m.groupdict() for m in STATUS_ROW.finditer(output[start:])]


# -- inside the testbed hosts -------------------------------------------------------------------------------- #

def host_sh(host: str, script: str, timeout: float = 60) -> str:
    """Run a shell script inside a testbed host (nsenter); its stdout. Fails on a non-zero exit."""
    proc = tb.exec_in(host, ["sh", "-c", script], timeout=timeout)
    assert proc.returncode == 0, f"{host}: `{script}` exited {proc.returncode}: {proc.stderr.strip()}"
    return proc.stdout


def unit_states(host: str, deployment: str) -> dict[str, dict[str, str]]:
    """Every unit of the deployment systemd has loaded on a host (also an inactive one that something still
    references): name -> LoadState, ActiveState, SubState, MainPID (systemctl show)."""
    names = host_sh(host, f"systemctl list-units --all --plain --no-legend 'shadowline-{deployment}-*' "
                          "| awk '{print $1}'").split()
    if not names:
        return {}
    out = host_sh(host, "systemctl show -p Id -p LoadState -p ActiveState -p SubState -p MainPID " + " ".join(names))
    units = {}
    for block in out.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        units[props["Id"]] = props
    return units


def main_pid(host: str, unit: str) -> int:
    return int(host_sh(host, f"systemctl show -p MainPID --value {unit}").strip() or 0)


def proc_environ(host: str, pid: int) -> dict[str, str]:
    out = host_sh(host, f"tr '\\0' '\\n' < /proc/{pid}/environ")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def listeners(host: str) -> list[tuple[str, str]]:
    """Listening TCP sockets inside a host: (local address:port, owning process as ss shows it)."""
    rows = []
    for line in host_sh(host, "ss -Hltnp").splitlines():
        fields = line.split()
        rows.append((fields[3], " ".join(fields[5:])))
    return sorted(rows)


DEPLOYMENT_PROCESS = re.compile(r"shadowline|dynamo|etcd|nats-server")


def nats_refusals(host: str, deployment: str) -> list[str]:
    """What the deployment's NATS server on ``host`` has logged refusing a client (launch.nats_refusals)."""
    return launch_nats_refusals(host_sh(host, NATS_JOURNAL.format(deployment=deployment), timeout=60))


def host_rc(host: str, script: str, timeout: float = 120) -> tuple[int, str]:
    """Run a shell script inside a testbed host; (exit status, stdout and stderr)."""
    proc = tb.exec_in(host, ["sh", "-c", script], timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def marked_processes(host: str, deployment: str) -> dict[int, str]:
    """Processes inside a host that carry the plan's environment marker SHADOWLINE_DEPLOYMENT=<deployment>:
    pid -> their SHADOWLINE_COHORT ('' for the GMS server, the frontend and other non-engine processes)."""
    out = host_sh(host, "for f in /proc/[0-9]*/environ; do e=$(tr '\\0' '\\n' < $f 2>/dev/null) || continue; "
                        f"echo \"$e\" | grep -qx 'SHADOWLINE_DEPLOYMENT={deployment}' || continue; p=${{f#/proc/}}; "
                        "echo \"${p%/environ} $(echo \"$e\" | sed -n 's/^SHADOWLINE_COHORT=//p')\"; done; true")
    found = {}
    for line in out.splitlines():
        pid, _unused, cohort = line.partition(" ")
        found[int(pid)] = cohort.strip()
    return found


def deployment_processes(host: str, deployment: str) -> list[str]:
    """Processes of a deployment inside a host: by command line (the runtime, etcd, NATS, the stand-in) or by
    the environment marker SHADOWLINE_DEPLOYMENT the plan gives its processes."""
    by_args = [line.strip() for line in host_sh(host, "ps -eo pid=,args=").splitlines()
               if DEPLOYMENT_PROCESS.search(line)]
    return by_args + [f"pid {pid} (SHADOWLINE_DEPLOYMENT={deployment})" for pid in marked_processes(host, deployment)]


# -- HTTP ---------------------------------------------------------------------------------------------------- #

def http(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body); status 0 when nothing answered (the body says why)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with NO_PROXY.open(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except (OSError, TimeoutError) as err:
        return 0, str(err)


def chat_completion(frontend_url: str, model: str, attempts: int = 30, interval: float = 1.0) -> dict[str, Any]:
    """A chat completion through the frontend, retried at most ``attempts`` times; the response JSON."""
    seen = []
    for _unused in range(attempts):
        status, body = http("POST", f"{frontend_url}/v1/chat/completions",
                            {"model": model, "messages": [{"role": "user", "content": "shadowline e2e"}],
                             "max_tokens": 8}, timeout=30)
        if status == 200:
            return json.loads(body)
        seen.append(f"{status} {body[:200]}")
        time.sleep(interval)
    raise AssertionError(f"no completion from {frontend_url} in {attempts} attempts; last answers: {seen[-3:]}")
