#!/usr/bin/python3
"""A multi-host testbed on one machine: N hosts with systemd, sshd and (optionally) Slurm.

Each host is a network namespace on a private bridge, an overlay of the machine's root and systemd as PID 1 of
its own PID, mount, UTS, IPC and cgroup namespaces.  See docs/testbed.md for the design and the measured figures.

Run as root:  testbed.py install-packages | up [--nodes N] [--replicas R] [--slurm] | status | exec HOST -- CMD... | down | leaks

Importable too (``import testbed.testbed as tb``): up(nodes, slurm) -> State, down(), leaks() -> list[str],
exec_in(host, argv, **kw), and every name below. This file is the entry point and the one namespace of the
package ``testbed/``, one module per concern:

  names      names and places of the instance (SHADOWLINE_TESTBED)   journal    State, Host, the journal, the lock
  errors     TestbedError                                            helpers    run, wait_until, pid_alive, ...
  cgroups    the hosts' cgroups                                      network    bridge, namespaces, veths
  mounts     the mount table, unmounting                             upper      writing a host's upper directory
  overlay    a host's root, seeded before boot                       ssh        keys, known_hosts, sshd drop-in
  slurm      slurm.conf, cgroup.conf, idle nodes                     inventory  the inventory and state.json
  boot       launchers, systemd as PID 1, the waits                  hostexec   a command inside a host
  teardown   kill, remove everything                                 lifecycle  up(), down(), problems()
  leaks      what is left on the machine                             packages   the Debian packages
  cli        the command line

Python standard library only.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as a script (testbed/testbed.py up ...): import the package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
    from testbed.cli import main

    sys.exit(main())

from .boot import (
    boot,
    boot_log,
    find_pid1,
    launch_host,
    launchers,
    system_state,
    wait_systemd,
)
from .cgroups import (
    cgroup_pids,
    enter_host_cgroups,
    hierarchies,
    host_cgroups,
    in_testbed_cgroup,
    make_host_cgroups,
    memory_usage,
    remove_cgroups,
    testbed_cgroup_dirs,
)
from .cli import (
    cmd_down,
    cmd_exec,
    cmd_install,
    cmd_leaks,
    cmd_status,
    cmd_up,
    main,
    parse_args,
    print_table,
    status_rows,
)
from .errors import (
    TestbedError,
)
from .helpers import (
    comm,
    mib,
    pid_alive,
    require_root,
    run,
    wait_until,
)
from .hostexec import (
    current_state,
    exec_in,
    unit_cpu_cores,
)
from .inventory import (
    inventory_text,
    remove_outputs,
    write_outputs,
)
from .journal import (
    Host,
    State,
    load_journal,
    locked,
    plan,
    save_journal,
    write_json_atomic,
)
from .leaks import (
    leaks,
    processes_connected_to_testbed,
    testbed_socket_inodes,
)
from .lifecycle import (
    check_running,
    down,
    problems,
    reboot,
    up,
)
from .mounts import (
    is_mountpoint,
    mountpoints,
    testbed_mounts,
    unmount_all,
)
from .names import (
    ALWAYS_MASKED,
    BOOT_TIMEOUT,
    BRIDGE,
    BRIDGE_ADDRESS,
    CGROUP_MOUNT,
    CGROUP_PARENT,
    GROUP_VARS,
    HOST_INIT,
    HOST_TMPFS_SIZE,
    INSTANCE,
    INVENTORY,
    JOURNAL,
    KEY_FILE,
    KILL_TIMEOUT,
    KNOWN_HOSTS,
    LOCK_FILE,
    MAX_NODES,
    NAME_PREFIX,
    NETNS_DIR,
    PACKAGE_LIST,
    PACKAGES,
    PREFIX,
    REPO_ROOT,
    SLURM_TIMEOUT,
    SLURM_UNITS,
    SSH_PORT,
    SSH_UNITS,
    STATE_JSON,
    STATE_ROOT,
    SUFFIX,
    TESTBED_DIR,
)
from .network import (
    delete_network,
    link_exists,
    make_bridge,
    make_host_network,
    netns_pids,
    record_run_netns,
    restore_run_netns,
    testbed_links,
    testbed_netns,
)
from .overlay import (
    JOURNALD_CONF,
    RESOLV_CONF,
    enabled_units_on_machine,
    hosts_file,
    masked_units,
    prepare_host_dir,
    seed_upper,
)
from .packages import (
    check_packages,
    install_packages,
    missing_packages,
)
from .slurm import (
    CGROUP_CONF,
    seed_slurm,
    slurm_conf,
    slurm_node_states,
    wait_slurm,
)
from .ssh import (
    HOST_KEY,
    SSHD_CONF,
    ensure_key,
    known_hosts_text,
    make_host_key,
    ssh_banner,
    wait_sshd,
    write_known_hosts,
)
from .teardown import (
    down_locked,
    kill_everything,
)
from .upper import (
    mirror_dirs,
    seed_file,
    seed_symlink,
)

__all__ = [  # the package's names, re-exported: the API tests and scripts use
    "ALWAYS_MASKED", "BOOT_TIMEOUT", "BRIDGE", "BRIDGE_ADDRESS", "CGROUP_CONF", "CGROUP_MOUNT", "CGROUP_PARENT",
    "GROUP_VARS", "HOST_INIT", "HOST_TMPFS_SIZE", "Host", "INSTANCE", "INVENTORY", "JOURNAL", "JOURNALD_CONF",
    "HOST_KEY", "KEY_FILE", "KILL_TIMEOUT", "KNOWN_HOSTS", "LOCK_FILE", "MAX_NODES", "NAME_PREFIX", "NETNS_DIR", "PACKAGES", "PACKAGE_LIST",
    "PREFIX", "REPO_ROOT", "RESOLV_CONF", "SLURM_TIMEOUT", "SLURM_UNITS", "SSHD_CONF", "SSH_PORT", "SSH_UNITS",
    "STATE_JSON", "STATE_ROOT", "SUFFIX", "State", "TESTBED_DIR", "TestbedError", "boot", "boot_log", "cgroup_pids",
    "check_packages", "check_running", "cmd_down", "cmd_exec", "cmd_install", "cmd_leaks", "cmd_status", "cmd_up",
    "comm", "current_state", "delete_network", "down", "down_locked", "enabled_units_on_machine", "ensure_key",
    "enter_host_cgroups", "exec_in", "find_pid1", "hierarchies", "host_cgroups", "hosts_file", "in_testbed_cgroup",
    "install_packages", "inventory_text", "known_hosts_text", "is_mountpoint", "kill_everything", "launch_host", "launchers", "leaks",
    "link_exists", "load_journal", "locked", "main", "make_bridge", "make_host_cgroups", "make_host_key", "make_host_network",
    "masked_units", "memory_usage", "mib", "mirror_dirs", "missing_packages", "mountpoints", "netns_pids",
    "parse_args", "pid_alive", "plan", "prepare_host_dir", "print_table", "problems", "reboot",
    "processes_connected_to_testbed", "record_run_netns", "remove_cgroups", "remove_outputs", "require_root",
    "restore_run_netns", "run", "save_journal", "seed_file", "seed_slurm", "seed_symlink", "seed_upper",
    "slurm_conf", "slurm_node_states", "ssh_banner", "status_rows", "system_state", "testbed_cgroup_dirs",
    "testbed_links", "testbed_mounts", "testbed_netns", "testbed_socket_inodes", "unit_cpu_cores", "unmount_all", "up",
    "wait_slurm",
    "wait_sshd", "wait_systemd", "wait_until", "write_json_atomic", "write_known_hosts", "write_outputs",
]
