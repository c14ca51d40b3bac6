"""Slurm on the hosts (--slurm): slurm.conf and cgroup.conf, the units enabled, and the wait for idle nodes."""

from __future__ import annotations

import os
from pathlib import Path

from .helpers import wait_until
from .hostexec import exec_in
from .journal import Host, State
from .names import SLURM_UNITS
from .upper import seed_file, seed_symlink


def slurm_conf(state: State) -> str:
    controller = state.hosts[0]
    names = ",".join(h.name for h in state.hosts)
    nodes = "\n".join(
        f"NodeName={h.name} NodeAddr={h.address} CPUs={os.cpu_count()} CoresPerSocket={os.cpu_count()} "
        f"ThreadsPerCore=1 RealMemory=4000 State=UNKNOWN" for h in state.hosts)
    return f"""# Written by testbed/testbed.py for the shadowline testbed; see docs/testbed.md.
ClusterName=shadowline
SlurmctldHost={controller.name}({controller.address})
AuthType=auth/munge
CryptoType=crypto/munge
SlurmUser=slurm
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MailProg=/bin/true
ReturnToService=2
MpiDefault=none
KillWait=5
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=30
Waittime=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
{nodes}
PartitionName=gpu Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


CGROUP_CONF = """# Written by testbed/testbed.py for the shadowline testbed; see docs/testbed.md.
CgroupPlugin=cgroup/v1
ConstrainCores=yes
ConstrainRAMSpace=no
ConstrainDevices=no
"""


def seed_slurm(host: Host, state: State, upper: Path) -> None:
    seed_file(upper, "etc/slurm/slurm.conf", slurm_conf(state))
    seed_file(upper, "etc/slurm/cgroup.conf", CGROUP_CONF)
    units = sorted(SLURM_UNITS) + (["slurmctld.service"] if host.index == 0 else [])
    for unit in units:
        seed_symlink(upper, f"etc/systemd/system/multi-user.target.wants/{unit}", f"/lib/systemd/system/{unit}")


def slurm_node_states(state: State) -> dict[str, str]:
    proc = exec_in(state.hosts[0].name, ["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10, pid=state.hosts[0].pid)
    states = {}
    for line in proc.stdout.splitlines():
        name, node_state = line.split()
        states[name] = node_state
    return states


def wait_slurm(state: State, timeout: float) -> None:
    names = {h.name for h in state.hosts}

    def probe() -> bool:
        states = slurm_node_states(state)
        return set(states) == names and all(s == "idle" for s in states.values())

    wait_until(f"sinfo on {state.hosts[0].name} to show {', '.join(sorted(names))} idle", timeout, probe, 0.1)
