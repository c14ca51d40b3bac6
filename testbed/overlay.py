"""A host's root: a tmpfs with the overlay's upper and work directories, seeded before boot (hostname, hosts,
resolver, machine id, sshd and journald drop-ins, masked units, and with Slurm its configuration)."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from .helpers import run
from .journal import Host, State
from .mounts import is_mountpoint
from .names import ALWAYS_MASKED, HOST_TMPFS_SIZE, SLURM_UNITS, SSH_UNITS
from .slurm import seed_slurm
from .ssh import HOST_KEY, SSHD_CONF, make_host_key
from .upper import seed_file, seed_symlink


def enabled_units_on_machine() -> set[str]:
    """Units enabled in the machine's /etc/systemd/system/*.wants (what packages enabled by themselves)."""
    units = set()
    for wants in Path("/etc/systemd/system").glob("*.wants"):
        units.update(p.name for p in wants.iterdir())
    return units


def masked_units(host: Host, slurm: bool) -> list[str]:
    wanted = set(SSH_UNITS)
    if slurm:
        wanted |= SLURM_UNITS | ({"slurmctld.service"} if host.index == 0 else set())
    enabled = {u for u in enabled_units_on_machine() if not u.endswith(".target")}  # targets only group units
    return sorted((set(ALWAYS_MASKED) | enabled) - wanted)


def hosts_file(state: State) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             "ff02::1\tip6-allnodes", "ff02::2\tip6-allrouters"]
    lines += [f"{h.address}\t{h.name}" for h in state.hosts]
    return "\n".join(lines) + "\n"


# The machine's resolver is outside the testbed: hosts know each other from /etc/hosts and ask nobody else.
RESOLV_CONF = """# Written by testbed/testbed.py: testbed hosts resolve names from /etc/hosts only.
nameserver 127.0.0.1
options timeout:1 attempts:1
"""


JOURNALD_CONF = """# Written by testbed/testbed.py: keep each host's journal small and in memory.
[Journal]
Storage=volatile
RuntimeMaxUse=8M
"""


# root's shell start-up files on every host: Debian's defaults, not the machine's own (a developer's /root/.bashrc
# with pyenv or conda hooks ran on every ssh command Ansible sent: about 60 processes and 80 ms each on the
# development machine, a third of the time of a site.yml run that changes nothing).
SKEL = Path("/etc/skel")
ROOT_DOTFILES = (".bashrc", ".profile")


def root_dotfile(name: str) -> str:
    skel = SKEL / name
    return skel.read_text() if skel.is_file() else "# Written by testbed/testbed.py: root's own, empty.\n"


def seed_upper(host: Host, state: State, public_key: str) -> None:
    upper = host.dir / "upper"
    seed_file(upper, "etc/hostname", host.name + "\n")
    seed_file(upper, "etc/hosts", hosts_file(state))
    seed_file(upper, "etc/resolv.conf", RESOLV_CONF)
    seed_file(upper, "etc/machine-id", secrets.token_hex(16) + "\n", mode=0o444)
    seed_file(upper, "etc/ssh/sshd_config.d/shadowline-testbed.conf",
              SSHD_CONF.format(address=host.address, host_key=HOST_KEY))
    make_host_key(host)
    seed_file(upper, "root/.ssh/authorized_keys", public_key, mode=0o600)
    for name in ROOT_DOTFILES:
        seed_file(upper, f"root/{name}", root_dotfile(name))
    os.chmod(upper / "root/.ssh", 0o700)
    seed_file(upper, "etc/systemd/journald.conf.d/shadowline-testbed.conf", JOURNALD_CONF)
    for unit in masked_units(host, state.slurm):
        seed_symlink(upper, f"etc/systemd/system/{unit}", "/dev/null")
    seed_symlink(upper, "etc/systemd/system/multi-user.target.wants/ssh.service", "/lib/systemd/system/ssh.service")
    if state.slurm:
        seed_slurm(host, state, upper)


def prepare_host_dir(host: Host) -> None:
    """A tmpfs per host holds upper/, work/ and the mount point root/ (why a tmpfs: docs/testbed.md)."""
    host.dir.mkdir(parents=True, exist_ok=True)
    if not is_mountpoint(host.dir):
        run(["mount", "-t", "tmpfs", "-o", f"size={HOST_TMPFS_SIZE},mode=0755", f"shadowline-{host.name}",
             str(host.dir)])
    for sub in ("upper", "work", "root"):
        (host.dir / sub).mkdir(exist_ok=True)
    root_stat = os.stat("/")
    os.chmod(host.dir / "upper", stat.S_IMODE(root_stat.st_mode))
