"""Start the processes of a cohort plan inside testbed hosts, by hand (no Ansible), and look at them.

Every process runs as a transient systemd unit of the host (``systemd-run``), so it lives in the host's
cgroups and dies with the host; commands reach a host through ``nsenter`` (``exec_in``). Each host's
``/run`` and ``/tmp`` are its own tmpfs: files there (the GMS sockets, the failover lock, heartbeats) are
visible only inside that host, so they are read through ``exec_in`` too.

The testbed instance: several engineers share one machine, so these tests use their own instance
(``SHADOWLINE_E2E_TESTBED``, default 1: 198.18.1.0/24, network namespaces ``sl1-node*``). The testbed
module reads ``SHADOWLINE_TESTBED`` once, at import; ``tb`` below is a copy of it loaded for this
instance only, so other test directories of the same pytest session keep the default instance.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "plugins" / "module_utils"
for _path in (str(REPO), str(LIB)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from shadowline.cluster.waits import poll
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan import Plan, Process
from shadowline.deployment.plan_builder import build_plan
from testbed.instances import load_testbed  # launch.load_testbed: tests/e2e/test_drills.py uses it

RUNTIME_PY = REPO / ".runtime" / "bin" / "python"
TINY_MODEL = REPO / ".cache" / "models" / "tiny-llama"  # `make runtime`'s: 6.3 MB of weights
# 44 MB of weights (scripts/make-tiny-model with these arguments): a process that loads it from disk reads
# several times what a Python process reads to start (about 3.3 MB here), so reading none of it shows.
SIZED_MODEL = REPO / ".cache" / "models" / "tiny-llama-l4h512"
SIZED_MODEL_ARGS = ("--layers", "4", "--hidden", "512")
INSTANCE = os.environ.get("SHADOWLINE_E2E_TESTBED", "1")
Check = Callable[[], str | None]  # a readiness check: None when ready, else what it saw

tb = load_testbed(INSTANCE)


# -- the plan ------------------------------------------------------------------------------------------- #

def standin_plan(hosts: Sequence[Any], deployment: str, model_dir: Path, *, cohorts: int = 2,
                 tensor_parallel_size: int = 2, gpus_per_node: int = 1) -> Plan:
    """The cohort plan of a stand-in deployment over testbed hosts (``State.hosts``, in rank order)."""
    shared = {
        "gms_deployment": deployment,
        "gms_model": {"id": "shadowline/tiny-llama", "revision": "0123456789abcdef0123456789abcdef01234567",
                      "local_dir": str(model_dir)},
        "gms_engine": {"backend": "standin", "tensor_parallel_size": tensor_parallel_size,
                       "gpus_per_node": gpus_per_node},
        "gms_cohorts": cohorts,
        "gms_python": str(RUNTIME_PY),
        # these tests start the plan's processes as units without the roles, so no credentials are installed:
        # the plain control plane (the secure default is tested through the roles, tests/e2e/test_site.py)
        "gms_insecure": True,
    }
    hostvars = {h.name: {**shared, "gms_node_rank": i, "ansible_host": h.address} for i, h in enumerate(hosts)}
    contract, problems = parse_contract(hostvars, [h.name for h in hosts])
    assert contract is not None, "the test's inventory is refused:\n" + "\n".join(str(p) for p in problems)
    return build_plan(contract, model_view=False)  # transient units without the roles' bind mount of the model


def unit(plan: Plan, kind: str, cohort: int | None = None) -> str:
    """The unit name the roles give this process (``shadowline-<deployment>-<kind>[@<cohort>].service``)."""
    return plan.unit_name(kind, cohort)


# -- running things inside a host ----------------------------------------------------------------------- #

NATS_JOURNAL = "journalctl -u shadowline-{deployment}-nats --no-pager -o cat"  # the NATS server's log on its host


def nats_refusals(journal: str) -> list[str]:
    """The lines of a NATS server's log that refuse a client with a certificate of the deployment's CA: a subject
    outside its permissions (``Publish Violation``, ``Subscription Violation``) or a certificate that maps to no
    user (``authentication error``)."""
    return [line for line in journal.splitlines() if "Violation" in line or "authentication error" in line]


def run_in(host: str, argv: Sequence[str], *, check: bool = True, timeout: float = 30.0,
           input: str | None = None) -> subprocess.CompletedProcess[str]:
    """argv inside ``host``; with ``check``, a non-zero exit raises with the command's output."""
    proc = tb.exec_in(host, list(argv), timeout=timeout, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"{host}: {shlex.join(argv)} exited {proc.returncode}\n"
                             f"stdout: {proc.stdout.strip()}\nstderr: {proc.stderr.strip()}")
    return proc


def make_dirs(host: str, paths: Sequence[str]) -> None:
    run_in(host, ["mkdir", "-p", "--", *paths])


def write_files(host: str, files: Mapping[str, str]) -> None:
    """Write each ``path -> text`` inside the host (parents created), e.g. ``Process.files``."""
    for path, text in files.items():
        run_in(host, ["sh", "-c", 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', "sh", path], input=text)


def read_file(host: str, path: str) -> str | None:
    """A file's content inside the host; None when it does not exist."""
    proc = run_in(host, ["cat", "--", path], check=False)
    return proc.stdout if proc.returncode == 0 else None


def start_unit(host: str, name: str, process: Process, extra_env: Mapping[str, str] | None = None) -> None:
    """Run ``process`` (argv and environment verbatim, plus ``extra_env``) as the transient unit ``name``."""
    assert process.host == host, f"the plan puts this process on {process.host}, not {host}"
    write_files(host, process.files)
    run_in(host, ["systemctl", "reset-failed", name], check=False)  # a failed unit of that name blocks reuse
    env = {**process.env, **(extra_env or {})}
    run_in(host, ["systemd-run", "--quiet", f"--unit={name}", "--property=KillMode=control-group",
                  *(f"--setenv={key}={value}" for key, value in sorted(env.items())), "--", *process.argv])


def stop_unit(host: str, name: str) -> None:
    """Stop the unit (SIGTERM with SIGCONT, then SIGKILL: every process of its cgroup) and forget it."""
    run_in(host, ["systemctl", "stop", name], check=False, timeout=60)
    run_in(host, ["systemctl", "reset-failed", name], check=False)


def unit_show(host: str, name: str) -> dict[str, str]:
    out = run_in(host, ["systemctl", "show", name, "--property=ActiveState,SubState,MainPID,ControlGroup"]).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def unit_pid(host: str, name: str) -> int:
    """The unit's main PID, in the host's PID namespace (0 when it runs nothing)."""
    return int(unit_show(host, name).get("MainPID") or 0)


def unit_active(host: str, name: str) -> bool:
    return unit_show(host, name).get("ActiveState") == "active"


def _journal_match(host: str, name: str) -> list[str]:
    """journalctl matches for the unit's current (or last) run only; a unit name is reused from test to test."""
    show = run_in(host, ["systemctl", "show", name, "--property=InvocationID", "--value"], check=False)
    invocation = show.stdout.strip()
    if not invocation:
        return ["--unit", name]
    return [f"_SYSTEMD_INVOCATION_ID={invocation}", "+", f"INVOCATION_ID={invocation}"]


def journal(host: str, name: str, lines: int = 50) -> str:
    """The last log lines of the unit's current run, for assertion messages."""
    proc = run_in(host, ["journalctl", "--no-pager", "-o", "short-precise", "-n", str(lines),
                         *_journal_match(host, name)], check=False)
    return f"--- journal of {name} on {host} (last {lines} lines) ---\n{proc.stdout}{proc.stderr}"


def journal_text(host: str, name: str) -> str:
    """The whole log of the unit's current run, messages only."""
    return run_in(host, ["journalctl", "--no-pager", "-o", "cat", *_journal_match(host, name)], check=False).stdout


def send_signal(host: str, pid: int, sig: signal.Signals, group: bool = False) -> None:
    """``kill -<sig> <pid>`` inside the host; ``group``: the whole process group led by ``pid``."""
    target = f"-{pid}" if group else str(pid)
    run_in(host, ["kill", f"-{sig.name.removeprefix('SIG')}", "--", target])


def proc_io(host: str, pid: int) -> dict[str, int]:
    """``/proc/<pid>/io`` of a process of the host (rchar, read_bytes, ...)."""
    text = read_file(host, f"/proc/{pid}/io")
    assert text is not None, f"{host}: no process {pid}"
    return {key: int(value) for key, value in (line.split(": ") for line in text.splitlines())}


def pid_alive(host: str, pid: int) -> bool:
    """The process exists and is not a zombie (state from /proc, inside the host)."""
    stat = read_file(host, f"/proc/{pid}/stat")
    return stat is not None and stat.rsplit(")", 1)[1].split()[0] != "Z"


def process_state(host: str, pid: int) -> str | None:
    """One-letter state of a host process (R, S, T, Z, ...), None when it is gone."""
    stat = read_file(host, f"/proc/{pid}/stat")
    return None if stat is None else stat.rsplit(")", 1)[1].split()[0]


def lock_state(host: str, lock_path: str) -> tuple[bool, str | None]:
    """(``shadowline.common.lock.is_locked``, ``read_holder``) of the lock file, evaluated inside the host."""
    code = ("import sys; from shadowline.common import lock; p = sys.argv[1]; "
            "print(lock.is_locked(p), lock.read_holder(p) or '')")
    out = run_in(host, [str(RUNTIME_PY), "-c", code, lock_path]).stdout.split()
    return out[0] == "True", (out[1] if len(out) > 1 else None)


@dataclass(frozen=True)
class MachineProcess:
    """A process of a host seen from the machine: its PID there and its start time (against PID reuse)."""
    pid: int
    start: str

    def alive(self) -> bool:
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return False
        return stat.rsplit(")", 1)[1].split()[19] == self.start


def machine_processes(host: str, name: str) -> list[MachineProcess]:
    """Every process of the unit's cgroup, by its PID on the machine (read from the machine's cgroup tree)."""
    cgroup = unit_show(host, name).get("ControlGroup", "")
    if not cgroup:
        return []
    root = Path(tb.CGROUP_MOUNT, "systemd", tb.CGROUP_PARENT, host, cgroup.lstrip("/"))
    found = []
    for procs in root.rglob("cgroup.procs"):
        for pid in procs.read_text().split():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except FileNotFoundError:
                continue
            found.append(MachineProcess(int(pid), stat.rsplit(")", 1)[1].split()[19]))
    return found


# -- waiting ------------------------------------------------------------------------------------------------ #

def wait_for(what: str, check: Check, timeout_s: float, interval_s: float = 0.1,
             explain: Callable[[], str] | None = None) -> float:
    """Poll ``check`` (None: ready, else what it saw; ``shadowline.cluster.waits.poll``) for at most ``timeout_s``.
    Returns the seconds waited; on timeout fails with what was seen last and ``explain()`` (e.g. a journal)."""
    ready, waited, seen = poll(check, timeout_s, interval_s)
    if not ready:
        detail = explain() if explain else ""
        raise AssertionError(f"timed out after {waited:.1f} s waiting for {what}; last seen: {seen}\n{detail}")
    return waited
