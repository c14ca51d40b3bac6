"""A multi-host testbed on one machine: N hosts with systemd, sshd and (optionally) Slurm.

The command line of testbed/testbed.py: install-packages | up [--nodes N] [--replicas R] [--slurm] | status | exec HOST -- CMD...
| down | leaks. See docs/testbed.md."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from .boot import system_state
from .cgroups import memory_usage
from .errors import TestbedError
from .helpers import mib
from .hostexec import current_state
from .journal import State, load_journal
from .leaks import leaks
from .lifecycle import down, reboot, up
from .names import INVENTORY, MAX_NODES
from .packages import install_packages


def status_rows(state: State) -> list[list[str]]:
    rows = [["host", "address", "systemd", "pid", "memory"]]
    for host in state.hosts:
        rows.append([host.name, host.address, system_state(host), str(host.pid), mib(memory_usage(host.name))])
    return rows


def print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def cmd_up(args: argparse.Namespace) -> int:
    already = load_journal() is not None
    state = up(args.nodes, args.slurm, args.keep_on_failure, args.replicas, args.spares)
    if already:
        print(f"testbed already up with {state.nodes} hosts (slurm {'on' if state.slurm else 'off'}): healthy")
    else:
        print(f"booted {state.nodes} hosts (slurm {'on' if state.slurm else 'off'}) in {state.boot_seconds:.2f} s")
    if state.replicas > 1:
        print(f"inventory: {state.replicas} replicas of {(state.nodes - state.spares) // state.replicas} hosts "
              "(gms_replica, gms_replica_rank)")
    if state.spares:
        print(f"inventory: {state.spares} spare node(s) (gms_spares): {', '.join(h.name for h in state.hosts[-state.spares:])}")
        print("  " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in state.phases.items()))
    print_table(status_rows(state))
    print(f"inventory: {INVENTORY}")
    return 0


def cmd_down(_args: argparse.Namespace) -> int:
    seconds = down()
    print(f"testbed down in {seconds:.2f} s")
    return 0


def cmd_status(_args: argparse.Namespace) -> int:
    state = load_journal()
    if state is None:
        print("no testbed is up")
        return 1
    print(f"{state.nodes} hosts, slurm {'on' if state.slurm else 'off'}")
    print_table(status_rows(state))
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise TestbedError("usage: testbed.py exec HOST -- CMD...")
    pid = current_state().host(args.host).pid
    os.execvp("nsenter", ["nsenter", "-t", str(pid), "-a", "--", *argv])
    return 127  # not reached


def cmd_reboot(args: argparse.Namespace) -> int:
    print(f"{args.host} rebooted in {reboot(args.host)} s")
    return 0


def cmd_leaks(_args: argparse.Namespace) -> int:
    found = leaks()
    for item in found:
        print(item)
    if not found:
        print("no leaks")
    return 1 if found else 0


def cmd_install(_args: argparse.Namespace) -> int:
    installed = install_packages()
    print(f"installed: {' '.join(installed)}" if installed else "all packages already installed")
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="testbed.py", description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install-packages", help="apt-get install what the hosts need").set_defaults(func=cmd_install)
    p_up = sub.add_parser("up", help="boot the hosts (or check a running testbed)")
    p_up.add_argument("--nodes", type=int, default=3, help=f"number of hosts, 1..{MAX_NODES} (default 3)")
    p_up.add_argument("--replicas", type=int, default=1,
                      help="the inventory's deployment: this many replicas of nodes/replicas hosts (default 1)")
    p_up.add_argument("--spares", type=int, default=0,
                      help="the inventory's last hosts as spare nodes (gms_spares); the replicas are of the others")
    p_up.add_argument("--slurm", action="store_true", help="munge + slurmctld on node0 + slurmd everywhere")
    p_up.add_argument("--keep-on-failure", action="store_true", help="leave a failed boot in place to debug")
    p_up.set_defaults(func=cmd_up)
    sub.add_parser("down", help="remove every trace of the testbed").set_defaults(func=cmd_down)
    sub.add_parser("status", help="one line per host").set_defaults(func=cmd_status)
    p_exec = sub.add_parser("exec", help="run a command inside a host: exec HOST -- CMD...")
    p_exec.add_argument("host")
    p_exec.add_argument("argv", nargs=argparse.REMAINDER)
    p_exec.set_defaults(func=cmd_exec)
    sub.add_parser("leaks", help="list what the testbed left on the machine; exit 1 if anything").set_defaults(
        func=cmd_leaks)
    p_reboot = sub.add_parser("reboot", help="power-cycle one host (every process killed at once, booted again)")
    p_reboot.add_argument("host")
    p_reboot.set_defaults(func=cmd_reboot)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return args.func(args)
    except TestbedError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `testbed.py up | head -1`: the work is done, only the output was cut
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
