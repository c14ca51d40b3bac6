"""The container runtime delivery (python_env_mode: container): the GMS server, the engines and the frontend run
from an OCI image under systemd through podman, with the plan's argv and environment unchanged.

The one home of the container policy: the variable gms_container (parsed and checked here), each backend's image
and devices, and the ``podman run`` command a unit runs. Why podman and not docker: ``podman run`` under a unit
with ``Delegate=yes`` and ``--cgroups=split`` keeps conmon and the container's processes in the unit's own cgroup,
so stopping the unit, the agent's cgroup kill and its "is anything of the rank left" all reach the engine, as
without containers. A docker container is a child of dockerd, outside the unit: a kill of the unit would leave the
engine running.

Every container shares the host's network, IPC and PID namespaces (GMS hands CUDA memory to the engines over its
Unix sockets; the agent reads and signals the engines' processes by their host PIDs), runs as the service user
(the host's /etc/passwd and /etc/group mounted read-only, so the name resolves), with no capability, no privilege
gain and a read-only root; only the plan's directories are mounted, the model read-only. Its resource limits are
the unit's (``--ulimit host``: LimitNOFILE, LimitMEMLOCK=infinity for pinned GPU memory), not podman's defaults.
"""

from __future__ import annotations

import re
from typing import Any

from ..common.settings import Container
from ..common.values import Reader, describe

PODMAN = "/usr/bin/podman"
RUNTIME_MODE = "container"
# an image reference: [registry[:port]/]path[:tag][@sha256:digest], lowercase path (the distribution spec)
IMAGE_RE = re.compile(r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
                      r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")
# CDI device names (vendor/class=name) or device paths
DEVICE_RE = re.compile(r"^(?:[a-z0-9.-]+/[a-z0-9.-]+=[A-Za-z0-9_.:-]+|/dev/[A-Za-z0-9_./-]+)$")
OCI_RUNTIMES = ["", "crun", "runc"]
DEFAULT_CONTAINER: dict[str, Any] = {"image": None, "archive": "", "runtime": "", "devices": None, "python": "python3"}
# The image and GPU access each backend defaults to: NVIDIA's runtime image of the pinned Dynamo, every GPU through
# the NVIDIA container toolkit's CDI specification; the stand-in's local image (scripts/build-standin-image), no GPU.
BACKEND_IMAGES = {"dynamo_vllm": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1",
                  "standin": "localhost/shadowline/standin-runtime:1.6.1"}
BACKEND_DEVICES: dict[str, tuple[str, ...]] = {"dynamo_vllm": ("nvidia.com/gpu=all",), "standin": ()}


def parse_container(read: Reader, value: Any, backend_name: str) -> Container | None:
    """gms_container, with the backend's image and devices as defaults; a problem per bad key."""
    values = read.mapping("gms_container", value, DEFAULT_CONTAINER)
    image = values["image"] if values["image"] is not None else BACKEND_IMAGES.get(backend_name)
    ok = True
    if not isinstance(image, str) or not IMAGE_RE.match(image):
        read.problem("gms_container.image", f"is not an image reference, got {describe(image)}.",
                     f"set it to a reference such as {BACKEND_IMAGES['dynamo_vllm']}.")
        ok = False
    archive = values["archive"]
    if not isinstance(archive, str) or archive and not archive.startswith(("/", "~")):
        read.problem("gms_container.archive", f"must be an absolute path on the controller, got {describe(archive)}.",
                     "set it to a `podman save` archive of the image (build/standin-runtime.tar), or leave it "
                     "empty to pull the image.")
        ok = False
    elif archive.startswith(("/", "~/")) and read.path("gms_container.archive", archive,
                                                       "/srv/images/standin-runtime.tar", home_ok=True) is None:
        ok = False
    runtime = values["runtime"]
    if runtime not in OCI_RUNTIMES:
        read.problem("gms_container.runtime", f"is {describe(runtime)}, not one of crun, runc.",
                     "leave it empty for podman's default, or set crun or runc (runc on cgroup v1 hosts).")
        ok = False
    devices = values["devices"] if values["devices"] is not None else list(BACKEND_DEVICES.get(backend_name, ()))
    device_list = read.string_list("gms_container.devices", devices, "[nvidia.com/gpu=all]")
    bad = [d for d in device_list or [] if not DEVICE_RE.match(d)]
    if device_list is None or bad:
        if bad:
            read.problem("gms_container.devices", f"has {', '.join(map(repr, bad))}, neither a CDI name nor a "
                         "device path.", "list CDI names such as nvidia.com/gpu=all (nvidia-ctk cdi generate) "
                         "or paths such as /dev/nvidia0.")
        ok = False
    python = values["python"]
    if not isinstance(python, str) or not re.match(r"^[A-Za-z0-9_./-]+$", python):
        read.problem("gms_container.python", f"must be an interpreter's name or path in the image, got "
                     f"{describe(python)}.", "set it to python3 (on the image's PATH) or an absolute path.")
        ok = False
    if not ok:
        return None
    return Container(image=str(image), archive=archive, runtime=runtime, devices=tuple(device_list or ()),
                     python=python)


def container_name(unit: str) -> str:
    """The container of a unit: the unit's name without .service, @ as - (shadowline-demo-engine-1)."""
    base = unit[:-len(".service")] if unit.endswith(".service") else unit
    return base.replace("@", "-")


def run_prefix(container: Container) -> list[str]:
    """``podman [--runtime R] run --rm --pull never`` with the image's devices: what every container of the
    deployment starts with (a unit's, the runtime check's)."""
    command = [PODMAN] + (["--runtime", container.runtime] if container.runtime else [])
    command += ["run", "--rm", "--pull", "never"]
    for device in container.devices:
        command += ["--device", device]
    return command


def podman_run(container: Container, unit: str, argv: tuple[str, ...] | list[str], env_names: list[str],
               mounts: list[tuple[str, bool] | tuple[str, bool, str]], user: str) -> list[str]:
    """The ``podman run`` command of one unit: the process's argv in the image, each environment variable passed
    by name (its value stays in the unit's Environment= lines), ``mounts`` as (path, writable) at the same path
    or (path, writable, target) at another."""
    command = run_prefix(container)
    command += ["--replace", "--name", container_name(unit),
                "--cgroups", "split", "--network", "host", "--ipc", "host", "--pid", "host",
                "--log-driver", "passthrough", "--user", f"{user}:{user}", "--cap-drop", "all",
                "--security-opt", "no-new-privileges", "--read-only", "--ulimit", "host",
                "--volume", "/etc/passwd:/etc/passwd:ro", "--volume", "/etc/group:/etc/group:ro"]
    for path, writable, *target in sorted(set(mounts)):
        command += ["--volume", f"{path}:{target[0] if target else path}:{'rw' if writable else 'ro'}"]
    for name in sorted(set(env_names)):
        command += ["--env", name]
    return command + [container.image, *argv]


CHECK_LIBRARY = "/opt/shadowline-check"


def runtime_check_argv(container: Container | None, python: str, library: str, backend_name: str,
                       gpus: int) -> list[str]:
    """The command that runs shadowline.deployment.runtime_check in the runtime: the host's interpreter, or in
    container mode a throwaway container of the image (its devices, no network) with the host's copy of the
    library (``library``, the directory that holds the shadowline package) mounted read-only."""
    check = ["-m", "shadowline.deployment.runtime_check", "--backend", backend_name, "--gpus", str(gpus)]
    if container is None:
        return [python, *check]
    command = run_prefix(container) + ["--network", "none", "--volume",
                                       f"{library}/shadowline:{CHECK_LIBRARY}/shadowline:ro",
                                       "--env", f"PYTHONPATH={CHECK_LIBRARY}"]
    return command + [container.image, container.python, *check]


def stop_post(unit: str) -> str:
    """ExecStopPost= of a container unit: remove the container whatever ended it (a kill of the unit's cgroup
    leaves podman's record of it, and its root file system mounted, behind)."""
    return f"ExecStopPost=-{PODMAN} rm --force --ignore --time 0 {container_name(unit)}"
