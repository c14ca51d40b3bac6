"""Three hosts without Slurm: identity, isolation, reachability by ssh, paramiko and Ansible."""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import subprocess
from pathlib import Path

import pytest

import testbed.testbed as tb

pytestmark = pytest.mark.timeout(120)

REPO_ROOT = Path(__file__).resolve().parents[2]
BASE_UNITS = {"dbus.service", "ssh.service", "systemd-journald.service", "systemd-logind.service"}


@pytest.fixture(scope="module")
def hosts(testbed) -> list[tb.Host]:
    return testbed(nodes=3, slurm=False).hosts


def inside(host: tb.Host, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = tb.exec_in(host.name, argv, timeout=30)
    if check:
        assert proc.returncode == 0, f"{host.name}: {' '.join(argv)}: {proc.stderr}"
    return proc


def ssh(host: tb.Host, command: str, known_hosts: Path = tb.KNOWN_HOSTS) -> subprocess.CompletedProcess[str]:
    """ssh as Ansible does with the testbed's inventory: host keys checked against the testbed's known_hosts."""
    return subprocess.run(
        ["ssh", "-i", str(tb.KEY_FILE), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         "-o", "ConnectTimeout=10", f"root@{host.address}", command],
        capture_output=True, text=True, timeout=30, check=False)


def test_each_host_has_its_own_name_and_address(hosts):
    assert [h.name for h in hosts] == ["node0", "node1", "node2"]
    for host in hosts:
        assert inside(host, "hostname").stdout.strip() == host.name
        addresses = inside(host, "ip", "-4", "-o", "addr", "show", "dev", "eth0").stdout
        assert f"inet {host.address}/24" in addresses


def test_systemd_is_pid_1_and_only_base_services_run(hosts):
    for host in hosts:
        assert inside(host, "cat", "/proc/1/comm").stdout.strip() == "systemd"
        state = inside(host, "systemctl", "is-system-running", check=False).stdout.strip()
        assert state in ("running", "degraded")
        running = inside(host, "systemctl", "list-units", "--type=service", "--state=running", "--plain",
                         "--no-legend").stdout
        assert {line.split()[0] for line in running.splitlines()} == BASE_UNITS


def test_a_file_written_in_one_host_stays_there(hosts):
    path = f"/root/isolation-{secrets.token_hex(4)}"
    inside(hosts[0], "sh", "-c", f"echo {hosts[0].name} > {path}")
    assert inside(hosts[0], "cat", path).stdout.strip() == hosts[0].name
    for other in hosts[1:]:
        assert inside(other, "test", "!", "-e", path, check=False).returncode == 0, f"{path} seen in {other.name}"
    assert not os.path.exists(path), f"{path} seen on the machine"
    inside(hosts[0], "rm", path)


def test_the_repo_is_visible_in_every_host(hosts):
    for host in hosts:
        assert inside(host, "test", "-f", str(REPO_ROOT / "testbed" / "testbed.py"), check=False).returncode == 0


def test_ssh_with_the_testbed_key_runs_hostname(hosts):
    for host in hosts:
        proc = ssh(host, "hostname")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == host.name


def test_host_keys_are_checked_and_each_host_has_its_own(hosts, tmp_path):
    """The inventory checks host keys (ansible.cfg's default): each host offers only its own key, the one the
    testbed's known_hosts lists for it; a host key nobody listed, or another host's, is refused."""
    lines = tb.KNOWN_HOSTS.read_text().splitlines()
    assert [line.split()[0] for line in lines] == [f"{h.name},{h.address}" for h in hosts]
    assert len({line.split()[2] for line in lines}) == len(hosts), "two hosts share a host key"
    assert f"UserKnownHostsFile={tb.KNOWN_HOSTS}" in tb.INVENTORY.read_text()
    assert "StrictHostKeyChecking=yes" in tb.INVENTORY.read_text()
    nobody = tmp_path / "empty_known_hosts"
    nobody.write_text("")
    refused = ssh(hosts[0], "true", known_hosts=nobody)
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr, refused.stderr
    swapped = tmp_path / "swapped_known_hosts"  # node0's address with node1's key
    swapped.write_text(f"{hosts[0].address} {' '.join(lines[1].split()[1:])}\n")
    refused = ssh(hosts[0], "true", known_hosts=swapped)
    assert refused.returncode == 255, refused.stderr
    assert "IDENTIFICATION HAS CHANGED" in refused.stderr or "Host key verification failed" in refused.stderr


def test_root_starts_its_shell_with_the_hosts_own_files_not_the_machines(hosts):
    """Every ssh command runs root's ~/.bashrc (Debian's bash does so for sshd): the hosts have Debian's defaults,
    not the machine's own files (a developer's pyenv hooks there cost every Ansible task 80 ms per host)."""
    for name in (".bashrc", ".profile"):
        want = Path("/etc/skel", name).read_text() if Path("/etc/skel", name).is_file() else None
        for host in hosts:
            seen = ssh(host, f"cat /root/{name}")
            assert seen.returncode == 0, seen.stderr
            if want is not None:
                assert seen.stdout == want, f"{host.name}: /root/{name} is not Debian's default"
    path = ssh(hosts[0], "echo $PATH").stdout.strip()
    assert ".pyenv" not in path and ".cargo" not in path, path


def test_paramiko_connects(hosts):
    paramiko = pytest.importorskip("paramiko")
    for host in hosts:
        client = paramiko.SSHClient()
        client.load_host_keys(str(tb.KNOWN_HOSTS))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(host.address, username="root", key_filename=str(tb.KEY_FILE), timeout=10,
                           allow_agent=False, look_for_keys=False)
            _unused1, stdout, _unused2 = client.exec_command("hostname", timeout=10)
            assert stdout.read().decode().strip() == host.name
        finally:
            client.close()


def test_hosts_reach_each_other_and_nothing_else(hosts):
    probe = ("import socket, sys\n"
             "s = socket.socket()\n"
             "s.settimeout(5)\n"
             "try:\n"
             "    s.connect((sys.argv[1], 22)); print('connected')\n"
             "except OSError as e:\n"
             "    print(e.errno)\n")
    for host in hosts:
        routes = inside(host, "ip", "route", "show", "table", "all").stdout
        assert "default" not in routes
        [route] = inside(host, "ip", "route").stdout.splitlines()
        assert route.startswith(f"{tb.PREFIX}.0/24 dev eth0")
        peer = hosts[(host.index + 1) % len(hosts)]
        assert inside(host, "/usr/bin/python3", "-c", probe, peer.address).stdout.strip() == "connected"
        # Outside the /24, even inside the reserved /15: refused by routing before any packet leaves.
        for target in ("198.18.1.1", "198.19.0.1"):
            out = inside(host, "/usr/bin/python3", "-c", probe, target).stdout.strip()
            assert out == str(errno.ENETUNREACH), f"{host.name} -> {target}: {out} (expected ENETUNREACH)"


def test_hosts_answer_on_their_address_from_the_machine(hosts):
    for host in hosts:
        with socket.create_connection((host.address, 22), timeout=5) as conn:
            assert conn.recv(4) == b"SSH-"


def test_generated_inventory_works_with_ansible(hosts):
    ansible = REPO_ROOT / ".venv" / "bin" / "ansible"
    if not ansible.exists():
        pytest.skip(f"{ansible} is missing")
    assert tb.INVENTORY.exists()
    proc = subprocess.run(
        [str(ansible), "-i", str(tb.INVENTORY), "gms_nodes", "-m", "ansible.builtin.ping"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=90,
        env={**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_FORKS": "8"}, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host in hosts:
        assert f"{host.name} | SUCCESS" in proc.stdout


def test_state_json_and_memory(hosts):
    state = json.loads(tb.STATE_JSON.read_text())
    assert [h["name"] for h in state["hosts"]] == [h.name for h in hosts]
    assert state["slurm"] is False
    for host in hosts:
        usage = tb.memory_usage(host.name)
        assert usage is not None and 0 < usage < 256 * 2**20


def test_hosts_ask_no_resolver_outside_the_testbed(hosts):
    for host in hosts:
        resolv = inside(host, "cat", "/etc/resolv.conf").stdout
        servers = [line.split()[1] for line in resolv.splitlines() if line.startswith("nameserver")]
        assert servers == ["127.0.0.1"]
        peer = hosts[-1]
        assert inside(host, "getent", "hosts", peer.name).stdout.split()[0] == peer.address


def test_hosts_cannot_change_the_machines_kernel_settings(hosts):
    proc = inside(hosts[0], "sh", "-c", "echo 1 > /proc/sys/kernel/core_uses_pid", check=False)
    assert proc.returncode != 0 and "Read-only file system" in proc.stderr
    proc = inside(hosts[0], "sh", "-c", "touch /sys/kernel/testbed-probe", check=False)
    assert proc.returncode != 0
    # the host's own network namespace stays configurable
    inside(hosts[0], "sysctl", "-q", "-w", "net.ipv4.tcp_keepalive_time=7200")
