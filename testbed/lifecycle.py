"""up() and down(): boot a testbed (or check a running one of the same shape), and remove every trace of it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from .boot import boot, find_pid1, launch_host, launchers, system_state, wait_systemd
from .errors import TestbedError
from .helpers import pid_alive, require_root, wait_until
from .inventory import write_outputs
from .journal import State, load_journal, locked, plan, save_journal
from .names import BOOT_TIMEOUT, MAX_NODES, REPO_ROOT, STATE_ROOT
from .network import record_run_netns
from .packages import check_packages
from .slurm import slurm_node_states
from .ssh import ensure_key, ssh_banner, wait_sshd
from .teardown import down_locked

HOST_PRIVATE_DIRS = ("/tmp", "/run")  # every host mounts a tmpfs of its own over these: the machine's files there are hidden


def checkout_hidden(root: Path) -> str | None:
    """Why the hosts cannot see this checkout (the runtime, the model and the library come from it), or None."""
    real = str(root.resolve())
    for hidden in HOST_PRIVATE_DIRS:
        if real == hidden or real.startswith(hidden + "/"):
            return (f"the checkout {real} is under {hidden}, which every testbed host mounts a tmpfs of its own over: "
                    f"the hosts could not see it. Fix: clone the repository outside {' and '.join(HOST_PRIVATE_DIRS)} "
                    "(e.g. under /srv or /root) and run from there.")
    return None


def up(nodes: int = 3, slurm: bool = False, keep_on_failure: bool = False, replicas: int = 1,  # noqa: PLR0913 (the shape's settings)
       spares: int = 0) -> State:
    """Boot the testbed, or check a running one of the same shape. Returns its state. ``replicas``: the inventory
    it writes describes a deployment of that many replicas (a fleet, docs/fleet-design.md) of the hosts but the
    last ``spares``, which are its spare nodes (gms_spares); the hosts are the same whatever it is."""
    require_root()
    if not 1 <= nodes <= MAX_NODES:
        raise TestbedError(f"--nodes must be 1..{MAX_NODES}, not {nodes}")
    if not 0 <= spares < nodes:
        raise TestbedError(f"--spares {spares}: give 0..{nodes - 1} (the last hosts of --nodes {nodes} are the spares; "
                           "at least one node remains)")
    if replicas < 1 or (nodes - spares) % replicas:
        raise TestbedError(f"--replicas {replicas} does not split the {nodes - spares} nodes (--nodes {nodes} less "
                           f"--spares {spares}) into whole replicas: each replica is nodes/replicas hosts; give a "
                           f"divisor of {nodes - spares} (1 for one engine group)")
    if reason := checkout_hidden(REPO_ROOT):
        raise TestbedError(reason)
    with locked():
        running = load_journal()
        if running is not None:
            running.replicas, running.spares = replicas, spares  # the inventory's matter only: the same hosts
            save_journal(running)
            return check_running(running, nodes, slurm)
        check_packages(slurm)
        state = plan(nodes, slurm)
        state.replicas, state.spares = replicas, spares
        public_key = ensure_key()
        started = time.monotonic()
        record_run_netns(state)
        STATE_ROOT.mkdir(parents=True, exist_ok=True)
        save_journal(state)  # every resource below is named after the journal's hosts, so down() finds it
        try:
            boot(state, public_key)
        except BaseException:
            if not keep_on_failure:
                down_locked()
            raise
        state.boot_seconds = round(time.monotonic() - started, 2)
        save_journal(state)
        write_outputs(state)
        return state


def problems(state: State) -> dict[str, str]:
    """What is wrong with a running testbed, by host; empty when every host is healthy."""
    found = {h.name: s for h in state.hosts if (s := system_state(h)) not in ("running", "degraded")}
    found.update({h.name: "sshd not answering" for h in state.hosts
                  if h.name not in found and not ssh_banner(h.address)})
    if state.slurm and not found:
        try:
            nodes = slurm_node_states(state)
        except (subprocess.TimeoutExpired, ValueError) as exc:
            nodes = {"sinfo": str(exc)}
        found.update({n: f"slurm {s}" for n, s in nodes.items() if not s.startswith(("idle", "alloc", "mix"))})
    return found


def check_running(running: State, nodes: int, slurm: bool) -> State:
    if running.nodes != nodes or running.slurm != slurm:
        raise TestbedError(
            f"a testbed with {running.nodes} hosts (slurm {'on' if running.slurm else 'off'}) is up; you asked for "
            f"{nodes} (slurm {'on' if slurm else 'off'}): run `testbed.py down` first")
    if bad := problems(running):
        raise TestbedError(f"the running testbed is unhealthy ({bad}): run `testbed.py down` and `up` again")
    write_outputs(running)
    return running


def down() -> float:
    """Remove every trace of the testbed (also after a half-failed up, or when nothing is up). Returns seconds."""
    require_root()
    with locked():
        return down_locked()


def reboot(name: str) -> float:
    """Power-cycle one host: its systemd is SIGKILLed, so the kernel kills its whole PID namespace at once (no unit
    stops, as in a power loss), then the host boots again from its disk (its overlay's upper directory survives;
    /run and /tmp are new). Its network namespace and address stay. Returns the seconds until sshd answers."""
    require_root()
    with locked():
        state = load_journal()
        if state is None:
            raise TestbedError("no testbed is up")
        host = next((h for h in state.hosts if h.name == name), None)
        if host is None:
            raise TestbedError(f"no host {name} (hosts: {', '.join(h.name for h in state.hosts)})")
        started = time.monotonic()
        if host.pid and pid_alive(host.pid):
            os.kill(host.pid, signal.SIGKILL)
        wait_until(f"{name}'s processes to exit", 10, lambda: not (host.pid and pid_alive(host.pid)) and not (
            host.launcher_pid and pid_alive(host.launcher_pid) and _not_reaped(name)), 0.01)
        launch_host(host)
        save_journal(state)
        host.pid = wait_until(f"systemd of {name} to start", 10, lambda: find_pid1(host), 0.005)
        save_journal(state)
        wait_systemd([host], BOOT_TIMEOUT)
        wait_sshd([host], BOOT_TIMEOUT)
        return round(time.monotonic() - started, 2)


def _not_reaped(name: str) -> bool:
    """The host's launcher (unshare) has not exited yet (reaped here when this process started it)."""
    launcher = launchers.get(name)
    return launcher is None or launcher.poll() is None
