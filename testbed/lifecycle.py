"""up() and down(): boot a testbed (or check a running one of the same shape), and remove every trace of it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from .boot import boot, system_state
from .errors import TestbedError
from .helpers import require_root
from .inventory import write_outputs
from .journal import State, load_journal, locked, plan, save_journal
from .names import MAX_NODES, REPO_ROOT, STATE_ROOT
from .network import record_run_netns
from .packages import check_packages
from .slurm import slurm_node_states
from .ssh import ensure_key, ssh_banner
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


def up(nodes: int = 3, slurm: bool = False, keep_on_failure: bool = False) -> State:
    """Boot the testbed, or check a running one of the same shape. Returns its state."""
    require_root()
    if not 1 <= nodes <= MAX_NODES:
        raise TestbedError(f"--nodes must be 1..{MAX_NODES}, not {nodes}")
    if reason := checkout_hidden(REPO_ROOT):
        raise TestbedError(reason)
    with locked():
        running = load_journal()
        if running is not None:
            return check_running(running, nodes, slurm)
        check_packages(slurm)
        state = plan(nodes, slurm)
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
