"""Read-only facts about one node that preflight needs: listening ports and who owns them, the filesystem
under the lock path, GPUs, the runtime's Python, and a staged model's manifest. Nothing here writes.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from typing import Any

from ..backends import BACKENDS
from ..backends import backend as backend_strategy
from ..common.proc import mounts, pids, process_cgroup, process_environ, process_name, socket_inodes, tcp_listeners
from ..model.errors import SpecError
from ..model.hf_token import FIELD as TOKEN_FIELD
from ..model.hf_token import read_token_file
from ..model.policy import MANIFEST_NAME
from .container import BACKEND_IMAGES, RUNTIME_MODE
from .contract import CONFIG_DIR
from .plan import Plan
from .secrets_guard import installed_digests

NETWORK_FILESYSTEMS = {
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "afs", "9p", "ceph", "glusterfs",
    "fuse.glusterfs", "fuse.sshfs", "fuse.gcsfuse", "fuse.s3fs", "fuse.beegfs", "pvfs2", "orangefs",
}


def gather(deployment: str | None, lock_path: str | None, python: str | None, backend: str | None,  # noqa: PLR0913 (one per fact)
           model_dir: str | None, service_user: str | None, runtime_mode: str | None = None,
           wheelhouse: str | None = None, container: dict[str, Any] | None = None,
           hf_token_file: str | None = None) -> dict[str, Any]:
    privilege = privilege_facts()
    if privilege["uid"] != 0:  # not root: refused by name (preflight.privilege_problems), nothing else read
        return {"privilege": privilege}
    running = running_plan(CONFIG_DIR.format(deployment=deployment)) if deployment else None
    return {
        "runtime_mode": runtime_mode,
        "wheelhouse": wheelhouse_facts(wheelhouse) if runtime_mode == "wheelhouse" and wheelhouse else None,
        "image": image_facts(container or {}, backend) if runtime_mode == RUNTIME_MODE else None,
        "listening": listening_sockets(deployment),
        "processes": deployment_processes(deployment) if deployment else [],
        "lock_dir": path_facts(os.path.dirname(lock_path), service_user) if lock_path else None,
        "gpus": nvidia_gpus(),
        "python": python_facts(python, backend) if python else None,
        "manifest_weight_bytes": manifest_weight_bytes(model_dir) if model_dir else None,
        "running_model": running_model(running),
        "running_secure": running.secure if running else None,  # Plan.secure: etcd's authentication, NATS's TLS
        # digests (never content) of the secrets it runs with: preflight refuses to mint others (secrets_guard.py)
        "installed_secrets": installed_digests(running.security.dir) if running and running.secure
        and running.security is not None else None,
        "platform": platform_facts(),
        "hf_token_file": token_file_facts(hf_token_file) if hf_token_file else None,
        "privilege": privilege,
    }


def privilege_facts() -> dict[str, Any]:
    """Who the modules run as on this node (after become, when the inventory asks for it): the roles install
    packages, units and the firewall, which needs root."""
    uid = os.geteuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return {"uid": uid, "user": name}


def token_file_facts(path: str) -> dict[str, Any]:
    """Whether the model module could read its Hugging Face token on this node, by the module's own check
    (model/hf_token.py: there, a regular file, 0600, root's, one token); the token itself is dropped at once."""
    try:
        read_token_file(os.path.expanduser(path))
    except SpecError as err:
        message = err.message[len(TOKEN_FIELD) + 1:] if err.message.startswith(TOKEN_FIELD + " ") else err.message
        return {"ok": False, "message": message, "fix": err.fix or ""}
    return {"ok": True}


def running_plan(config_dir: str) -> Plan | None:
    """The plan the agent role wrote on this node (``<config_dir>/plan.json``): what runs now. None before a
    first deployment (or unreadable)."""
    try:
        return Plan.load(os.path.join(config_dir, "plan.json"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def running_model(plan: Plan | None) -> dict[str, Any] | None:
    """The model the node's engines run now (``plan``: running_plan): its revision, directory, tensor parallel
    size and weight bytes (its manifest). None before a first deployment. Preflight budgets GPU memory for both
    residencies when the inventory names another revision."""
    if plan is None:
        return None
    try:
        argv = list(plan.cohort(0).ranks[0].process.argv)
        tp = int(argv[argv.index("--tensor-parallel-size") + 1])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return {"revision": plan.revision, "model_dir": plan.model_dir, "tensor_parallel_size": tp,
            "weight_bytes": manifest_weight_bytes(plan.model_dir)}


def platform_facts(os_release: str = "/etc/os-release") -> dict[str, Any]:
    """The distribution (os-release's ID, VERSION_ID, PRETTY_NAME) and the Python that runs the modules."""
    fields: dict[str, str] = {}
    try:
        with open(os_release, encoding="utf-8") as handle:
            for line in handle:
                key, sep, value = line.strip().partition("=")
                if sep:
                    fields[key] = value.strip().strip('"').strip("'")
    except OSError:
        pass
    return {"id": fields.get("ID", "").lower(), "version_id": fields.get("VERSION_ID", ""),
            "pretty_name": fields.get("PRETTY_NAME", ""), "python": list(sys.version_info[:3])}


def listening_sockets(deployment: str | None) -> list[dict[str, Any]]:
    """Every listening TCP socket with its owning process and whether that process is ours."""
    listeners = {listener.inode: listener for listener in tcp_listeners()}
    owners = _socket_owners(set(listeners))
    result = []
    for inode, listener in sorted(listeners.items(), key=lambda kv: kv[1].port):
        pid = owners.get(inode)
        result.append({
            "port": listener.port, "address": listener.address, "pid": pid,
            "process": process_name(pid) if pid else None,
            "ours": bool(pid and deployment and _belongs_to(pid, deployment)),
        })
    return result


def deployment_processes(deployment: str) -> list[dict[str, Any]]:
    """Every process of the deployment on this node (by unit cgroup or environment marker)."""
    return [{"pid": pid, "process": process_name(pid)} for pid in pids()
            if pid != os.getpid() and _belongs_to(pid, deployment)]


def _socket_owners(inodes: set[str]) -> dict[str, int]:
    owners: dict[str, int] = {}
    for pid in pids():
        for inode in socket_inodes(pid) & inodes:
            owners.setdefault(inode, pid)
    return owners


def _belongs_to(pid: int, deployment: str) -> bool:
    """A process is ours when it runs in one of the deployment's units or carries its environment marker."""
    if f"shadowline-{deployment}-" in (process_cgroup(pid) or ""):
        return True
    return f"SHADOWLINE_DEPLOYMENT={deployment}".encode() in process_environ(pid)


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
    for mount in mounts():
        inside = real == mount.mountpoint or real.startswith(mount.mountpoint.rstrip("/") + "/")
        if inside and len(mount.mountpoint) >= len(best.get("mountpoint", "")):
            best = {"mountpoint": mount.mountpoint, "fstype": mount.fstype, "options": list(mount.options)}
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
        uuid_text, _unused, mib = line.partition(",")
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


def project_name(wheel_file: str) -> str:
    """A wheel's project name, normalized (PEP 503): ``gpu_memory_service-0.1-py3-none-any.whl`` is
    ``gpu-memory-service``."""
    return re.sub(r"[-_.]+", "-", wheel_file.split("-", 1)[0]).lower()


PULL_CHECK_S = 30


def image_facts(container: dict[str, Any], backend: str | None) -> dict[str, Any]:
    """container mode: whether the node has the image, else (without an archive to load) whether its registry
    serves it, read-only (``podman manifest inspect``); nothing is known before podman is installed."""
    image = container.get("image") or BACKEND_IMAGES.get(backend or "")
    facts: dict[str, Any] = {"image": image, "podman": shutil.which("podman") is not None, "present": None,
                             "pullable": None, "error": None}
    if not image or not facts["podman"]:
        return facts
    try:
        facts["present"] = subprocess.run(["podman", "image", "exists", image], capture_output=True,
                                          timeout=PULL_CHECK_S, check=False).returncode == 0
        if not facts["present"] and not container.get("archive"):
            inspect = subprocess.run(["podman", "manifest", "inspect", image], capture_output=True, text=True,
                                     timeout=PULL_CHECK_S, check=False)
            facts["pullable"] = inspect.returncode == 0
            facts["error"] = None if facts["pullable"] else (inspect.stderr.strip().splitlines() or ["?"])[-1]
    except (OSError, subprocess.TimeoutExpired) as err:
        facts["error"] = f"podman did not answer: {err}"
    return facts


def wheelhouse_facts(path: str) -> dict[str, Any]:
    """Which projects a wheelhouse directory holds wheels of."""
    try:
        names = sorted({project_name(f) for f in os.listdir(path) if f.endswith(".whl")})
    except OSError as err:
        return {"path": path, "exists": False, "error": err.strerror or str(err), "projects": []}
    return {"path": path, "exists": True, "projects": names}


def manifest_weight_bytes(model_dir: str) -> int | None:
    """Bytes of the weight files (``weight_bytes`` of shadowline-manifest.json; configs and tokenizers excluded)."""
    try:
        with open(os.path.join(model_dir, MANIFEST_NAME), encoding="utf-8") as handle:
            manifest = json.load(handle)
        return int(manifest["weight_bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
