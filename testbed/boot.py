"""Booting the hosts: each one's launcher (unshare into its namespaces, host-init.sh, systemd as PID 1), then
the waits until systemd runs, sshd answers and (with Slurm) every node is idle."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

from .cgroups import enter_host_cgroups, hierarchies, make_host_cgroups
from .errors import TestbedError
from .helpers import pid_alive, wait_until
from .hostexec import exec_in
from .journal import Host, State, save_journal
from .names import BOOT_TIMEOUT, HOST_INIT, SLURM_TIMEOUT
from .network import make_bridge, make_host_network
from .overlay import prepare_host_dir, seed_upper
from .slurm import wait_slurm
from .ssh import wait_sshd

launchers: dict[str, subprocess.Popen[bytes]] = {}  # reaped by down() when up() ran in this process


def launch_host(host: Host) -> None:
    argv = ["ip", "netns", "exec", host.netns, "unshare", "--pid", "--fork", "--mount", "--uts", "--ipc", "--cgroup",
            "--propagation", "private", "/bin/sh", str(HOST_INIT), str(host.dir), host.name,
            *(h.name for h in hierarchies())]
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "container": "shadowline-testbed",
           "LANG": "C.UTF-8"}
    log = open(host.dir / "boot.log", "wb")
    with log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd="/",
                                start_new_session=True, preexec_fn=lambda: enter_host_cgroups(host.name))
    launchers[host.name] = proc
    host.launcher_pid = proc.pid  # `ip netns exec` execs unshare: this is unshare's pid


def find_pid1(host: Host) -> int | bool:
    """The host's systemd is the only child of the launcher (unshare --fork)."""
    launcher = launchers.get(host.name)
    if launcher is None or launcher.poll() is not None:
        raise TestbedError(f"{host.name}: the launcher exited; {host.dir}/boot.log says: {boot_log(host)}")
    try:
        children = Path(f"/proc/{host.launcher_pid}/task/{host.launcher_pid}/children").read_text().split()
    except FileNotFoundError:
        return False
    if not children:
        return False
    pid = int(children[0])
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    return pid if comm == "systemd" else False


def boot_log(host: Host) -> str:
    with contextlib.suppress(FileNotFoundError):
        return (host.dir / "boot.log").read_text(errors="replace")[-2000:]
    return ""


def system_state(host: Host, timeout: float = 5.0) -> str:
    if not pid_alive(host.pid):
        return "dead"
    try:
        proc = exec_in(host.name, ["systemctl", "is-system-running"], timeout=timeout, pid=host.pid)
    except subprocess.TimeoutExpired:
        return "no-answer"
    return proc.stdout.strip() or "no-answer"


def wait_systemd(hosts: list[Host], timeout: float) -> None:
    """Wait for every host's systemd to finish starting up (running, or degraded if a unit failed)."""
    pending = {h.name: h for h in hosts}

    def probe() -> bool:
        for name, host in list(pending.items()):
            if not pid_alive(host.pid):
                raise TestbedError(f"{name}: systemd (pid {host.pid}) died while booting: {boot_log(host)}")
            if system_state(host) in ("running", "degraded"):
                del pending[name]
        return not pending

    wait_until(f"systemd on {', '.join(pending)} to reach running/degraded", timeout, probe, interval=0.05)


def boot(state: State, public_key: str) -> None:
    started = time.monotonic()

    def phase(name: str) -> None:
        state.phases[name] = round(time.monotonic() - started, 3)

    make_bridge()
    for host in state.hosts:
        prepare_host_dir(host)
        seed_upper(host, state, public_key)
        make_host_cgroups(host.name)
        make_host_network(host)
    phase("prepared")
    for host in state.hosts:
        launch_host(host)
        save_journal(state)  # the launcher pid is known now
    for host in state.hosts:
        host.pid = wait_until(f"systemd of {host.name} to start", 10, lambda: find_pid1(host), 0.005)
        save_journal(state)
    phase("systemd started")
    wait_systemd(state.hosts, BOOT_TIMEOUT)
    phase("systemd running")
    wait_sshd(state.hosts, BOOT_TIMEOUT)
    phase("sshd answering")
    if state.slurm:
        wait_slurm(state, SLURM_TIMEOUT)
        phase("slurm nodes idle")
