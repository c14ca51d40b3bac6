"""``gms_slurm``: the Slurm options of a deployment, with defaults, parsed into typed values.

Failure handling (watchdog timeouts, relaunch backoff) is not here: it is ``gms_failover`` of the contract, the
same for the Slurm supervisor as for the node agent.

Every problem names the field (``gms_slurm.<key>``) and the fix, and all of them are collected, as for the
rest of the inventory contract (values.py). The defaults suit the CPU stand-in on the testbed and a
typical GPU cluster alike; see docs/slurm.md for each option.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from ..backends import BACKENDS
from ..common.problems import Problem
from ..common.values import Reader, describe

RUNTIMES = ["pyxis", "apptainer"]
TIME_RE = re.compile(r"^(?:\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}"  # minutes, MM:SS, HH:MM:SS
                     r"|\d+-\d{1,2}|\d+-\d{1,2}:\d{1,2}|\d+-\d{1,2}:\d{1,2}:\d{1,2}"  # D-HH, D-HH:MM, D-HH:MM:SS
                     r"|UNLIMITED|INFINITE|unlimited|infinite)$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
OUTPUT_RE = re.compile(r"^[A-Za-z0-9%][A-Za-z0-9._%-]{0,127}$")  # %x (job name) and %j (job id) patterns allowed
WORD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._,:+=@/-]*$")  # partition, account, qos, module names
MOUNT_RE = re.compile(r"^/[^\s,:]*(?::/[^\s,:]*)?(?::[a-z,+]+)?$")
# sbatch options shadowline sets itself: a user who repeats them in extra_sbatch would fight the script.
MANAGED_SBATCH = {"--nodes": "gms_engine.nnodes", "-N": "gms_engine.nnodes", "--ntasks-per-node": "(one per node)",
                  "--job-name": "gms_slurm.job_name", "-J": "gms_slurm.job_name", "--output": "gms_slurm.output",
                  "-o": "gms_slurm.output", "--signal": "gms_slurm.signal_lead_s", "--partition": "gms_slurm.partition",
                  "-p": "gms_slurm.partition", "--account": "gms_slurm.account", "-A": "gms_slurm.account",
                  "--qos": "gms_slurm.qos", "-q": "gms_slurm.qos", "--time": "gms_slurm.time", "-t": "gms_slurm.time",
                  "--exclusive": "gms_slurm.exclusive", "--gpus-per-node": "gms_slurm.gpus_per_node"}

DEFAULTS: dict[str, Any] = {
    "partition": None, "account": None, "qos": None, "time": None, "exclusive": True, "gpus_per_node": None,
    "cpus_per_task": None, "container_image": None, "container_mounts": [], "container_runtime": "pyxis",
    "modules": [], "job_name": None, "output": "%x-%j.out", "output_dir": None, "node_dir": None,
    "signal_lead_s": 120, "extra_sbatch": [], "model_check": True, "python": None,
    "ready_timeout_s": 600, "stop_grace_s": 30, "library_dir": None,
}


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None
    account: str | None
    qos: str | None
    time: str | None
    exclusive: bool
    gpus_per_node: int | None  # None: no --gpus-per-node
    cpus_per_task: int | None
    container_image: str | None
    container_mounts: tuple[str, ...]
    container_runtime: str
    modules: tuple[str, ...]
    job_name: str
    output: str
    output_dir: str | None  # None: the directory sbatch was run from
    node_dir: str
    signal_lead_s: int
    extra_sbatch: tuple[str, ...]
    model_check: bool
    python: str | None  # None: gms_python
    ready_timeout_s: int
    stop_grace_s: int  # an orderly stop (scancel of the job, the time limit) waits this long per step
    library_dir: str | None = None  # holds the shadowline package: PYTHONPATH of the job, mounted in its containers

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SlurmOptions:
        """The options back from the spec embedded in a rendered script (``asdict`` of them, as JSON)."""
        values = {f.name: data.get(f.name, DEFAULTS.get(f.name)) for f in fields(cls)}
        for name in ("container_mounts", "modules", "extra_sbatch"):
            values[name] = tuple(values[name] or ())
        return cls(**values)


def parse_slurm_options(value: Any, deployment: str, backend: str | None, engine_gpus: int | None,  # noqa: C901, PLR0912, PLR0915 (over the size limits of pyproject.toml; split it when it changes next)
                        problems: list[Problem]) -> SlurmOptions | None:
    """Parse ``gms_slurm``; problems are appended (each names the field and its fix)."""
    read = Reader(problems)
    start = len(problems)
    values = read.mapping("gms_slurm", value, DEFAULTS)

    partition = _word(read, "partition", values["partition"], "gpu")
    account = _word(read, "account", values["account"], "my-project")
    qos = _word(read, "qos", values["qos"], "normal")
    time_limit = values["time"]
    if time_limit is not None:
        time_limit = str(time_limit).strip()
        if not TIME_RE.match(time_limit):
            read.problem("gms_slurm.time", f"{describe(values['time'])} is not a Slurm time limit.",
                         "use minutes, HH:MM:SS or D-HH:MM:SS, e.g. '04:00:00' or '2-00:00:00' (quote it in YAML).")
            time_limit = None
    exclusive = read.boolean("gms_slurm.exclusive", values["exclusive"])
    gpus = values["gpus_per_node"]
    if gpus is None:
        strategy = BACKENDS.get(backend or "")
        gpus = engine_gpus if strategy is not None and strategy.uses_gpus else 0
    else:
        gpus = read.integer("gms_slurm.gpus_per_node", gpus, minimum=0, maximum=64, example=8)
    cpus = None
    if values["cpus_per_task"] is not None:
        cpus = read.integer("gms_slurm.cpus_per_task", values["cpus_per_task"], minimum=1, maximum=4096, example=32)

    image = values["container_image"]
    if image is not None and not (isinstance(image, str) and image.strip() and " " not in image.strip()):
        read.problem("gms_slurm.container_image", f"must be an image reference, got {describe(image)}.",
                     "set it to e.g. nvcr.io#nvidia/ai-dynamo/vllm-runtime:0.6.1 (pyxis) or a .sif path (apptainer).")
        image = None
    runtime = read.choice("gms_slurm.container_runtime", values["container_runtime"], RUNTIMES)
    mounts = read.string_list("gms_slurm.container_mounts", values["container_mounts"], "['/data:/data:ro']")
    for mount in mounts or []:
        if not MOUNT_RE.match(mount):
            read.problem("gms_slurm.container_mounts", f"{mount!r} is not SRC[:DST[:FLAGS]] with absolute paths.",
                         "write each mount as /host/path:/container/path (optionally :ro).")
    if mounts and not image:
        read.problem("gms_slurm.container_mounts", "is set but gms_slurm.container_image is not.",
                     "set gms_slurm.container_image too, or remove the mounts.")
    modules = read.string_list("gms_slurm.modules", values["modules"], "['cuda/12.4']")
    for module in modules or []:
        if not WORD_RE.match(module):
            read.problem("gms_slurm.modules", f"{module!r} is not a module name.",
                         "list environment modules as names such as cuda/12.4, one per item.")

    job_name = values["job_name"] if values["job_name"] is not None else f"shadowline-{deployment}"
    if not (isinstance(job_name, str) and NAME_RE.match(job_name)):
        read.problem("gms_slurm.job_name", f"{describe(job_name)} is not a job name.",
                     "use letters, digits, '.', '_' and '-' (at most 64), e.g. shadowline-llama.")
        job_name = None
    output = values["output"]
    if not (isinstance(output, str) and OUTPUT_RE.match(output)):
        read.problem("gms_slurm.output", f"{describe(output)} is not a file name pattern.",
                     "use a name such as %x-%j.out (%x job name, %j job id); "
                     "put the directory in gms_slurm.output_dir.")
        output = None
    output_dir = _absolute(read, "output_dir", values["output_dir"], "/shared/jobs/shadowline")
    node_dir = values["node_dir"] if values["node_dir"] is not None else f"/tmp/shadowline-{deployment}"
    node_dir = _absolute(read, "node_dir", node_dir, "/tmp/shadowline-<deployment>")
    python = _absolute(read, "python", values["python"], "/opt/shadowline/venv/bin/python")
    lead = read.integer("gms_slurm.signal_lead_s", values["signal_lead_s"], minimum=10, maximum=3600, example=120)
    ready = read.integer("gms_slurm.ready_timeout_s", values["ready_timeout_s"], minimum=10, maximum=86400, example=600)
    model_check = read.boolean("gms_slurm.model_check", values["model_check"])
    extra = read.string_list("gms_slurm.extra_sbatch", values["extra_sbatch"], "['--constraint=h100']")
    for arg in extra or []:
        flag = arg.split("=", 1)[0]
        unsafe = any(c in "'\"`$\\" or c.isspace() or not c.isprintable() for c in arg)
        if not arg.startswith("-") or unsafe:
            read.problem("gms_slurm.extra_sbatch", f"{arg!r} is not one sbatch option.",
                         "write each as one option such as --constraint=h100 (no quotes, no spaces).")
        elif flag in MANAGED_SBATCH:
            read.problem("gms_slurm.extra_sbatch", f"contains {flag}, which shadowline sets itself.",
                         f"remove it; it comes from {MANAGED_SBATCH[flag]}.")
    stop_grace = read.integer("gms_slurm.stop_grace_s", values["stop_grace_s"], minimum=1, maximum=3600, example=30)
    library = _library_dir(read, values["library_dir"])

    if len(problems) > start:
        return None
    if not (exclusive is not None and runtime and mounts is not None and modules is not None and job_name and output):
        raise AssertionError("unreachable: checked above")
    if not (node_dir and lead is not None and ready is not None and model_check is not None and extra is not None):
        raise AssertionError("unreachable: checked above")
    if not (stop_grace is not None and gpus is not None):
        raise AssertionError("unreachable: checked above")
    return SlurmOptions(
        partition=partition, account=account, qos=qos, time=time_limit, exclusive=exclusive,
        gpus_per_node=gpus or None, cpus_per_task=cpus, container_image=image.strip() if image else None,
        container_mounts=tuple(mounts), container_runtime=runtime, modules=tuple(modules), job_name=job_name,
        output=output, output_dir=output_dir, node_dir=node_dir, signal_lead_s=lead, extra_sbatch=tuple(extra),
        model_check=model_check, python=python, ready_timeout_s=ready, stop_grace_s=stop_grace, library_dir=library,
    )


def _word(read: Reader, key: str, value: Any, example: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, (str, int)) and not isinstance(value, bool) and WORD_RE.match(str(value).strip()):
        return str(value).strip()
    read.problem(f"gms_slurm.{key}", f"{describe(value)} is not a Slurm {key} name.",
                 f"set gms_slurm.{key} to a name such as {example}, or remove it for the cluster's default.")
    return None


LIBRARY_EXAMPLE = "/shared/ansible_collections/shadowline/gms/plugins/module_utils"


def _library_dir(read: Reader, value: Any) -> str | None:
    """gms_slurm.library_dir: the directory holding the ``shadowline`` package on every node of the job (a shared
    file system), which the script puts on PYTHONPATH and mounts read-only into the job's containers at the same
    path; it must name the directory that holds the package, not the package itself."""
    path = _absolute(read, "library_dir", value, LIBRARY_EXAMPLE)
    if path is None:
        return None
    if ":" in path or "," in path:
        read.problem("gms_slurm.library_dir", f"{path!r} contains ':' or ',', which separate PYTHONPATH entries and "
                     "container mounts.", f"put the library under a path without them, such as {LIBRARY_EXAMPLE}.")
        return None
    if path.rsplit("/", 1)[-1] == "shadowline":
        read.problem("gms_slurm.library_dir", f"{path!r} names the shadowline package itself; PYTHONPATH needs the "
                     "directory that holds it.", f"set it to {path.rsplit('/', 1)[0]} (the package's parent).")
        return None
    return path


def _absolute(read: Reader, key: str, value: Any, example: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and value.startswith("/") and not any(c in value for c in " \n'\"`$\\"):
        # normalised, not the root or a system directory (the job removes node_dir at its start and end)
        return read.path(f"gms_slurm.{key}", value, example)
    read.problem(f"gms_slurm.{key}", f"must be an absolute path without spaces or quotes, got {describe(value)}.",
                 f"set gms_slurm.{key} to an absolute path such as {example}.")
    return None
