"""Read-only facts about one node that preflight needs: listening ports and who owns them, the filesystem
under the lock path, GPUs, the runtime's Python, and a staged model's manifest. Nothing here writes.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from typing import Any

from ..backends import BACKENDS
from ..backends import backend as backend_strategy

NETWORK_FILESYSTEMS = {
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "afs", "9p", "ceph", "glusterfs",
    "fuse.glusterfs", "fuse.sshfs", "fuse.gcsfuse", "fuse.s3fs", "fuse.beegfs", "pvfs2", "orangefs",
}
MANIFEST_NAME = "shadowline-manifest.json"


def gather(deployment: str | None, lock_path: str | None, python: str | None, backend: str | None,
           model_dir: str | None, service_user: str | None) -> dict[str, Any]:
    return {
        "listening": listening_ports(deployment),
        "processes": deployment_processes(deployment) if deployment else [],
        "lock_dir": path_facts(os.path.dirname(lock_path), service_user) if lock_path else None,
        "gpus": nvidia_gpus(),
        "python": python_facts(python, backend) if python else None,
        "manifest_weight_bytes": manifest_weight_bytes(model_dir) if model_dir else None,
    }


def listening_ports(deployment: str | None) -> list[dict[str, Any]]:
    """Every listening TCP socket with its owning process and whether that process is ours."""
    inodes: dict[str, tuple[int, str]] = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for port, address, inode in _listen_entries(name):
            inodes[inode] = (port, address)
    owners = _socket_owners(set(inodes))
    result = []
    for inode, (port, address) in sorted(inodes.items(), key=lambda kv: kv[1][0]):
        pid = owners.get(inode)
        result.append({
            "port": port, "address": address, "pid": pid,
            "process": _comm(pid) if pid else None,
            "ours": bool(pid and deployment and _belongs_to(pid, deployment)),
        })
    return result


def deployment_processes(deployment: str) -> list[dict[str, Any]]:
    """Every process of the deployment on this node (by unit cgroup or environment marker)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid() and _belongs_to(int(name), deployment):
            found.append({"pid": int(name), "process": _comm(int(name))})
    return found


def _listen_entries(path: str) -> list[tuple[int, str, str]]:
    entries = []
    try:
        with open(path, encoding="ascii") as handle:
            next(handle, None)
            for line in handle:
                fields = line.split()
                if len(fields) > 9 and fields[3] == "0A":  # TCP_LISTEN
                    address_hex, port_hex = fields[1].split(":")
                    entries.append((int(port_hex, 16), _decode_address(address_hex), fields[9]))
    except OSError:
        pass
    return entries


def _decode_address(hexaddr: str) -> str:
    if len(hexaddr) == 8:
        return ".".join(str(b) for b in bytes.fromhex(hexaddr)[::-1])
    words = [bytes.fromhex(hexaddr[i:i + 8])[::-1].hex() for i in range(0, 32, 8)]
    joined = "".join(words)
    return ":".join(joined[i:i + 4] for i in range(0, 32, 4))


def _socket_owners(inodes: set[str]) -> dict[str, int]:
    owners: dict[str, int] = {}
    for pid_name in os.listdir("/proc"):
        if not pid_name.isdigit():
            continue
        fd_dir = f"/proc/{pid_name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                owners.setdefault(target[8:-1], int(pid_name))
    return owners


def _comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _belongs_to(pid: int, deployment: str) -> bool:
    """A process is ours when it runs in one of the deployment's units or carries its environment marker."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            if f"shadowline-{deployment}-" in handle.read():
                return True
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return f"SHADOWLINE_DEPLOYMENT={deployment}".encode() in handle.read().split(b"\0")
    except OSError:
        return False


def path_facts(path: str, service_user: str | None) -> dict[str, Any]:
    """The filesystem a path is (or will be) on, and whether it can be created there."""
    existing = path
    while not os.path.exists(existing) and existing not in ("", "/"):
        existing = os.path.dirname(existing)
    existing = existing or "/"
    mount = _mount_of(existing)
    facts: dict[str, Any] = {
        "path": path, "exists": os.path.exists(path), "existing_ancestor": existing,
        "ancestor_is_dir": os.path.isdir(existing), "fstype": mount.get("fstype"),
        "mountpoint": mount.get("mountpoint"), "read_only": "ro" in mount.get("options", []),
        "service_user_exists": None, "writable_by_service_user": None,
    }
    if service_user:
        try:
            user = pwd.getpwnam(service_user)
        except KeyError:
            facts["service_user_exists"] = False
        else:
            facts["service_user_exists"] = True
            if os.path.isdir(path):
                facts["writable_by_service_user"] = _writable_by(path, user.pw_uid, user.pw_gid)
    return facts


def _mount_of(path: str) -> dict[str, Any]:
    real = os.path.realpath(path)
    best: dict[str, Any] = {}
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as handle:
            for line in handle:
                left, _, right = line.partition(" - ")
                fields = left.split()
                mountpoint = fields[4].replace("\\040", " ")
                inside = real == mountpoint or real.startswith(mountpoint.rstrip("/") + "/")
                if inside and len(mountpoint) >= len(best.get("mountpoint", "")):
                    best = {"mountpoint": mountpoint, "fstype": right.split()[0],
                            "options": fields[5].split(",")}
    except OSError:
        pass
    return best


def _writable_by(path: str, uid: int, gid: int) -> bool:
    st = os.stat(path)
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & 0o200)
    if st.st_gid == gid:
        return bool(st.st_mode & 0o020)
    return bool(st.st_mode & 0o002)


def nvidia_gpus() -> list[dict[str, Any]] | None:
    """GPUs reported by nvidia-smi, or None when the node has no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return [{"error": str(err)}]
    gpus = []
    for line in out.strip().splitlines():
        uuid_text, _, mib = line.partition(",")
        gpus.append({"uuid": uuid_text.strip(), "memory_mib": float(mib.strip() or 0)})
    return gpus


PYTHON_PROBE = """
import importlib.util, json, sys
names = sys.argv[1:]
found = {}
for name in names:
    try:
        found[name] = importlib.util.find_spec(name) is not None
    except Exception:
        found[name] = False
print(json.dumps(found))
"""


def python_facts(python: str, backend: str | None) -> dict[str, Any]:
    """Whether the runtime interpreter exists and finds the modules the backend needs (without loading CUDA)."""
    modules = list(backend_strategy(backend).runtime_modules) if backend in BACKENDS else []
    facts: dict[str, Any] = {"path": python, "exists": os.access(python, os.X_OK), "modules": {}}
    if not facts["exists"] or not modules:
        return facts
    try:
        out = subprocess.run([python, "-c", PYTHON_PROBE, *modules], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        facts["modules"] = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as err:
        facts["error"] = str(err)
    return facts


def manifest_weight_bytes(model_dir: str) -> int | None:
    """Bytes of the weight files (``weight_bytes`` of shadowline-manifest.json; configs and tokenizers excluded)."""
    try:
        with open(os.path.join(model_dir, MANIFEST_NAME), encoding="utf-8") as handle:
            manifest = json.load(handle)
        return int(manifest["weight_bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
