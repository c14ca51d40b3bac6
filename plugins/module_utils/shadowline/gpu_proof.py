"""The pure parts of ``scripts/gpu-proof`` (issue #43): what it parses, compares and reports, with no GPU library.

``scripts/gpu-proof`` runs on a bare GPU machine with only ``python3`` (torch, cuda-bindings and nvidia-ml-py
installed, nothing of the project's virtualenv), so this module imports the standard library and this library only;
the GPU libraries are imported by the checks themselves, in their own processes. Everything here is tested on
recorded output in ``tests/unit/test_gpu_proof.py``.

- ``parse_smi_csv``: ``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits``.
- ``read_kernel_log``: what the kernel log says of NVIDIA's driver (the module's version, the bus-id to UUID lines,
  every Xid line, parsed with the agent's own kernel-log reader, ``common/gpu_health.KernelLog``).
- ``example_budget``: preflight's memory budget (``deployment/preflight._memory_problems``) for the example
  inventory ``EXAMPLE_INVENTORY`` on a node's GPUs as ``node_facts.nvidia_gpus`` reports them.
- ``Row``, ``row``, ``same``, ``format_table``, ``build_report``, ``write_report``, ``exit_code``: the table and
  the JSON report.
- ``gpu_presence``: whether a machine has a GPU for the checks that need one.
- ``safetensors_header``, ``pattern_block``: the synthetic weights file of the load check and the bytes GPU memory
  is filled with.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import struct
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any

from .common.gpu_health import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_GPU_RECOVERY_ACTION,
    EVENT_GPU_UNAVAILABLE,
    EVENT_MASK,
    EVENT_XID_CRITICAL,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_TIMEOUT,
    KernelLog,
    classify,
    normal_bus,
    parse_kernel_line,
)
from .common.xid_table import RECOVERY_ACTIONS
from .deployment.contract import DEFAULT_MEMORY, Memory

REPORT_NAME = "gpu-proof.json"
TABLE_NAME = "gpu-proof.txt"
REPORT_VERSION = 1
GIB = 1 << 30
MIB = 1 << 20

# -- the checks -------------------------------------------------------------------------------------------------- #

PASS, FAIL, INFO, NEEDS_GPU, SKIPPED = "pass", "FAIL", "info", "needs GPU", "skipped"


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    timeout_s: int  # the check's own bound: its process is killed after this long
    needs_gpu: str  # "all" | "part": what of it runs without a GPU
    proves: str


CHECKS = (
    Check("node-facts", "1 node facts", 45, "part",
          "preflight's GPU detection (node_facts.nvidia_gpus) against nvidia-smi and NVML: count, UUIDs, memory; "
          "model and driver; the CUDA order of CUDA_DEVICE_ORDER=PCI_BUS_ID against nvidia-smi's; the memory "
          "budget of the example inventory against the GPU's total and free memory"),
    Check("gpu-events", "2 GPU events", 45, "part",
          "the agent's NVML event source (control/gpu_watch.GpuWatch) starts on the device; which event types the "
          "driver accepts and refuses; gpu_health's NVML constants against nvidia-ml-py's; the kernel log's NVRM lines "
          "through the agent's kernel-log reader; the Xid catalog's class of every Xid the log holds"),
    Check("shared-weights", "3 shared weights", 90, "all",
          "GPU memory made with cuMemCreate by a server that never maps it, exported as a POSIX file descriptor over "
          "a Unix socket (SCM_RIGHTS), filled by a writer, mapped read-only by two readers, still read intact after "
          "the server's SIGKILL; a new server starts empty; the memory is freed when the last reader ends"),
    Check("load-rates", "4 load rates", 200, "all",
          "GB/s of a synthetic safetensors file from this machine's disk into GPU memory, cold (page cache dropped) "
          "and warm (page cache), and from pinned host memory"),
    Check("parked-cost", "5 parked cost", 120, "all",
          "GPU memory a process holds with a CUDA context, a captured CUDA graph and an NCCL communicator, beyond "
          "its weights, against gms_memory.engine_overhead_gib"),
    Check("xid-fault", "6 provoked Xid", 45, "all",
          "a kernel of the proof's own writes to an unmapped address (an application fault, Xid 31 on Hopper): the "
          "agent's listener receives it from NVML with the GPU's UUID and the catalog's class, the kernel log has "
          "its NVRM line and the agent's reader parses it"),
)
CHECK_NAMES = tuple(c.name for c in CHECKS)
TOTAL_BUDGET_S = 540  # every check's bound together stays inside one 10-minute command
MIN_CHECK_S = 20  # a check is not started with less than this left of the budget


def check_named(name: str) -> Check:
    for check in CHECKS:
        if check.name == name:
            return check
    raise KeyError(name)


# -- rows, the table and the report ------------------------------------------------------------------------------ #

@dataclass(frozen=True)
class Row:
    check: str  # the check's name (CHECK_NAMES)
    item: str  # what was compared or measured
    expected: str
    measured: str
    status: str  # PASS | FAIL | INFO | NEEDS_GPU | SKIPPED


def row(check: str, item: str, expected: Any, measured: Any, ok: bool | None = None,
        status: str | None = None) -> Row:
    """A row: ``ok`` True/False is pass/FAIL, None is info (a figure with no target); ``status`` overrides."""
    if status is None:
        status = INFO if ok is None else (PASS if ok else FAIL)
    return Row(check, item, _text(expected), _text(measured), status)


def same(check: str, item: str, expected: Any, measured: Any) -> Row:
    """A row that passes when ``measured`` equals ``expected``."""
    return row(check, item, expected, measured, expected == measured)


def needs_gpu(check: str, item: str, expected: Any = "") -> Row:
    return row(check, item, expected, "not run: no GPU on this machine", status=NEEDS_GPU)


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_text(v) for v in value) if value else "(none)"
    if value is None:
        return "(none)"
    return str(value)


def row_to_json(item: Row) -> str:
    return json.dumps(asdict(item), sort_keys=True)


def row_from_json(line: str) -> Row | None:
    try:
        data = json.loads(line)
        return Row(str(data["check"]), str(data["item"]), str(data["expected"]), str(data["measured"]),
                   str(data["status"]))
    except (ValueError, KeyError, TypeError):
        return None


def format_table(rows: Iterable[Row], width: int = 60) -> str:
    """The table of every row: check, item, expected, measured, pass; long cells are cut at ``width``."""
    head = ("check", "item", "expected", "measured", "pass")
    cells = [head] + [(r.check, r.item, r.expected, r.measured, r.status) for r in rows]
    cut = [tuple(c if len(c) <= width else c[:width - 1] + "~" for c in line) for line in cells]
    widths = [max(len(line[i]) for line in cut) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cut]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@dataclass
class CheckResult:
    name: str
    ran: bool  # a process was started for it
    seconds: float
    timed_out: bool
    returncode: int | None
    rows: list[Row]
    error: str  # what ended it early, else ""
    stderr_tail: str


def build_report(machine: dict[str, Any], results: list[CheckResult], started: float, ended: float) -> dict[str, Any]:
    rows = [r for result in results for r in result.rows]
    counts: dict[str, int] = {}
    for item in rows:
        counts[item.status] = counts.get(item.status, 0) + 1
    return {
        "version": REPORT_VERSION,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(ended - started, 1),
        "machine": machine,
        "counts": counts,
        "checks": [{"name": r.name, "title": check_named(r.name).title, "proves": check_named(r.name).proves,
                    "ran": r.ran, "seconds": round(r.seconds, 1), "timed_out": r.timed_out,
                    "returncode": r.returncode, "error": r.error, "stderr_tail": r.stderr_tail,
                    "rows": [asdict(x) for x in r.rows]} for r in results],
    }


def write_report(out_dir: str, report: dict[str, Any], table: str) -> str:
    """The JSON report and the table under ``out_dir`` (made if missing); the report's path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, REPORT_NAME)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.replace(path + ".tmp", path)
    with open(os.path.join(out_dir, TABLE_NAME), "w", encoding="utf-8") as handle:
        handle.write(table + "\n")
    return path


def exit_code(report: dict[str, Any]) -> int:
    """0 unless a row failed or a check ended without its rows (timed out, crashed)."""
    if report["counts"].get(FAIL):
        return 1
    return 1 if any(c["ran"] and c["error"] for c in report["checks"]) else 0


# -- is there a GPU -------------------------------------------------------------------------------------------- #

def gpu_presence(smi_path: str | None, smi_lines: list[str] | None, smi_error: str | None) -> tuple[bool, str]:
    """(whether the GPU checks can run, why): a GPU is there when ``nvidia-smi -L`` ran and listed one."""
    if smi_path is None:
        return False, "nvidia-smi is not on PATH (no NVIDIA driver)"
    if smi_error:
        return False, f"nvidia-smi failed: {smi_error}"
    gpus = [line for line in smi_lines or [] if line.startswith("GPU ")]
    if not gpus:
        return False, "nvidia-smi lists no GPU"
    return True, f"nvidia-smi lists {len(gpus)} GPU(s): {gpus[0]}"


# -- nvidia-smi ------------------------------------------------------------------------------------------------- #

SMI_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "memory.free", "driver_version", "pci.bus_id")
SMI_ARGV = ("nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits")
_NUMBERS = {"index": int, "memory.total": float, "memory.used": float, "memory.free": float}


def parse_smi_csv(text: str, fields: tuple[str, ...] = SMI_FIELDS) -> list[dict[str, Any]]:
    """One dict per GPU; numbers as numbers, ``[N/A]`` and the like as None."""
    gpus = []
    for values in csv.reader(line for line in text.splitlines() if line.strip()):
        gpu: dict[str, Any] = {}
        for name, raw in zip(fields, values):
            value = raw.strip()
            if not value or value.startswith("[") or value == "N/A":
                gpu[name] = None
                continue
            try:
                gpu[name] = _NUMBERS[name](value) if name in _NUMBERS else value
            except ValueError:
                gpu[name] = None
        gpus.append(gpu)
    return gpus


# -- the kernel log --------------------------------------------------------------------------------------------- #

KERNEL_LOG_READERS = (("journalctl", "-k", "-b", "-o", "cat", "--no-pager"), ("dmesg",))
_DRIVER_LINE = re.compile(r"NVRM: loading NVIDIA UNIX (?:Open )?Kernel Module for \S+\s+(?P<version>\d+(?:\.\d+)+)")
_ANY_XID = re.compile(r"\bS?Xid \(PCI:")  # the driver's Xid lines and NVSwitch's SXid lines
_GPU_AT_LINE = re.compile(r"NVRM: GPU at PCI:(?P<bus>[0-9A-Fa-f:.]+): (?P<uuid>GPU-[0-9A-Fa-f-]+)")


def read_kernel_log(lines: Iterable[str], known: dict[str, str] | None = None) -> dict[str, Any]:
    """What the kernel log says of NVIDIA's driver, read with the agent's reader (gpu_health.KernelLog): the kernel
    module's version, the bus ids the driver named with a UUID, every Xid-looking line and the faults the reader
    made of them (a line the reader skips shows as ``unparsed``)."""
    lines = list(lines)
    reader = KernelLog(known)
    faults = list(reader.feed(lines, now=0.0))
    xid_lines = [line.strip() for line in lines if _ANY_XID.search(line)]
    driver = None
    for line in lines:
        match = _DRIVER_LINE.search(line)
        if match:
            driver = match.group("version")  # the last load wins
    gpu_at = {}
    for line in lines:
        match = _GPU_AT_LINE.search(line)
        if match:
            gpu_at[normal_bus(match.group("bus"))] = match.group("uuid")
    unparsed = [line for line in xid_lines if parse_kernel_line(line) is None]
    return {
        "nvrm_lines": sum(1 for line in lines if "NVRM" in line),
        "driver": driver,
        "gpu_at": gpu_at,
        "xid_lines": xid_lines,
        "faults": [{"xid": f.xid, "pci_bus": f.pci_bus, "gpu_uuid": f.gpu_uuid, "action": f.action,
                    "detail": f.detail} for f in faults],
        "unparsed": unparsed,
    }


# -- NVML's constants ------------------------------------------------------------------------------------------- #

# gpu_health's masks and error codes, by the name nvidia-ml-py gives them
NVML_NAMES = {
    "nvmlEventTypeDoubleBitEccError": EVENT_DOUBLE_BIT_ECC,
    "nvmlEventTypeXidCriticalError": EVENT_XID_CRITICAL,
    "nvmlEventTypeGpuUnavailableError": EVENT_GPU_UNAVAILABLE,
    "nvmlEventTypeGpuRecoveryAction": EVENT_GPU_RECOVERY_ACTION,
    "NVML_ERROR_TIMEOUT": NVML_ERROR_TIMEOUT,
    "NVML_ERROR_GPU_IS_LOST": NVML_ERROR_GPU_IS_LOST,
}


def nvml_constant_rows(check: str, nvml: Any) -> list[Row]:
    """gpu_health's NVML constants against ``nvml`` (the pynvml module), and the recovery actions nvidia-ml-py
    defines against xid_table.RECOVERY_ACTIONS (one the table lacks is classed node-service by the agent)."""
    rows = [same(check, f"gpu_health's {name}", hex(value) if name.startswith("nvmlEvent") else value,
                 _constant(nvml, name, hex if name.startswith("nvmlEvent") else int))
            for name, value in NVML_NAMES.items()]
    actions = {int(getattr(nvml, name)): name[len("NVML_GPU_RECOVERY_ACTION_"):] for name in dir(nvml)
               if name.startswith("NVML_GPU_RECOVERY_ACTION_") and isinstance(getattr(nvml, name), int)}
    missing = [f"{value} {name}" for value, name in sorted(actions.items()) if value not in RECOVERY_ACTIONS]
    rows.append(row(check, "NVML recovery actions known to xid_table", "every NVML_GPU_RECOVERY_ACTION_* value",
                    f"missing {', '.join(missing)} (the agent classes them node-service)" if missing
                    else f"all {len(actions)}", not missing))
    return rows


def _constant(nvml: Any, name: str, form: Any) -> Any:
    value = getattr(nvml, name, None)
    return "(absent)" if value is None else form(int(value))


def event_type_names(nvml: Any) -> dict[int, str]:
    """Every single-bit nvmlEventType* of ``nvml``: bit -> name."""
    names = {}
    for name in dir(nvml):
        value = getattr(nvml, name)
        if name.startswith("nvmlEventType") and isinstance(value, int) and value and not value & (value - 1):
            names[value] = name[len("nvmlEventType"):]
    return dict(sorted(names.items()))


def registration_rows(check: str, supported: int, outcomes: dict[int, str], names: dict[int, str]) -> list[Row]:
    """The event types the driver supports (``nvmlDeviceGetSupportedEventTypes``) and what registering each alone
    answered (``outcomes``: bit -> "accepted" or the error); the agent's own mask first."""
    rows = []
    for bit in sorted(outcomes, key=lambda b: (not b & EVENT_MASK, b)):
        ours = bool(bit & EVENT_MASK)
        name = names.get(bit, hex(bit))
        item = f"register {name} ({hex(bit)}){' [agent]' if ours else ''}"
        sup = "supported" if supported & bit else "not supported"
        ok = outcomes[bit] == "accepted" if ours else None
        rows.append(row(check, item, "accepted" if ours else "(recorded)", f"{sup}; {outcomes[bit]}", ok))
    return rows


def xid_class_rows(check: str, xids: Iterable[int]) -> list[Row]:
    """The catalog's class (xid_table, through gpu_health.classify) of each Xid seen on the device."""
    rows = []
    for xid in sorted(set(xids)):
        action, detail = classify(xid)
        rows.append(row(check, f"Xid {xid} in the catalog", "a class", f"{action}: {detail}", None))
    return rows


# -- the memory budget ------------------------------------------------------------------------------------------ #

EXAMPLE_INVENTORY = "inventories/examples/one-node-tp8"
# what EXAMPLE_INVENTORY's group_vars/all.yml set (tests/unit/test_gpu_proof.py reads them with ansible-inventory)
EXAMPLE = {"weights_gib": 131.5, "kv_reserve_gib": 40.0, "engine_overhead_gib": 3.0, "tensor_parallel_size": 8,
           "cohorts": 3}


def budget_need_gib(example: dict[str, Any] | None = None) -> float:
    """Preflight's need per GPU: weights / TP + KV reserve + one engine overhead per engine (cohort)."""
    e = example or EXAMPLE
    return e["weights_gib"] / e["tensor_parallel_size"] + e["kv_reserve_gib"] + e["engine_overhead_gib"] * e["cohorts"]


def example_budget(gpus: list[dict[str, Any]] | None, example: dict[str, Any] | None = None) -> list[str]:
    """Preflight's own memory check (``preflight._memory_problems``) of ``example`` on a node whose GPUs are
    ``gpus`` (node_facts.nvidia_gpus's answer; the GPU's size is measured, as with gpu_memory_gib unset): the
    problems' messages, none when it fits."""
    from .deployment.preflight import _memory_problems  # noqa: PLC0415 (preflight's private check, read as it is)

    e = example or EXAMPLE
    memory = Memory(gpu_memory_gib=None, weights_gib=e["weights_gib"], kv_reserve_gib=e["kv_reserve_gib"],
                    engine_overhead_gib=e["engine_overhead_gib"])
    contract = SimpleNamespace(memory=memory, nodes=[SimpleNamespace(host="gpu-proof")], spares=[],
                               engine=SimpleNamespace(tensor_parallel_size=e["tensor_parallel_size"]),
                               cohorts=e["cohorts"], model=SimpleNamespace(revision=None))
    facts = {"gpu-proof": {"gpus": gpus or [], "manifest_weight_bytes": None, "running_model": None}}
    return [p.message for p in _memory_problems(contract, facts)]  # type: ignore[arg-type]


def default_overhead_gib() -> float:
    return float(DEFAULT_MEMORY["engine_overhead_gib"])


# -- synthetic data --------------------------------------------------------------------------------------------- #

PATTERN_BLOCK = 16 * MIB
TENSOR_BYTES = 512 * MIB


def pattern_block(seed: str, size: int = PATTERN_BLOCK) -> bytes:
    """``size`` deterministic bytes of no visible structure (SHAKE-256 of ``seed``)."""
    return hashlib.shake_256(seed.encode()).digest(size)


def pattern_at(block: bytes, offset: int, length: int) -> bytes:
    """The ``length`` bytes at ``offset`` of ``block`` repeated without end."""
    start = offset % len(block)
    out = bytearray()
    while len(out) < length:
        take = min(len(block) - start, length - len(out))
        out += block[start:start + take]
        start = 0
    return bytes(out)


def pattern_digest(block: bytes, total: int) -> str:
    """SHA-256 of ``total`` bytes of ``block`` repeated (what a reader of the filled memory must find)."""
    digest = hashlib.sha256()
    remaining = total
    while remaining > 0:
        piece = block[:min(len(block), remaining)]
        digest.update(piece)
        remaining -= len(piece)
    return digest.hexdigest()


def safetensors_header(data_bytes: int, tensor_bytes: int = TENSOR_BYTES) -> bytes:
    """The header of a safetensors file of ``data_bytes`` of BF16 tensors of at most ``tensor_bytes`` each
    (``data_bytes`` even): the 8-byte little-endian length and the JSON, padded with spaces to 8 bytes as the
    format's writer does."""
    if data_bytes <= 0 or data_bytes % 2:
        raise ValueError(f"data_bytes must be even and positive, got {data_bytes}")
    tensors: dict[str, Any] = {"__metadata__": {"format": "pt", "writer": "shadowline scripts/gpu-proof"}}
    start, index = 0, 0
    while start < data_bytes:
        end = min(start + tensor_bytes, data_bytes)
        tensors[f"proof.layers.{index}.weight"] = {"dtype": "BF16", "shape": [(end - start) // 2],
                                                   "data_offsets": [start, end]}
        start, index = end, index + 1
    raw = json.dumps(tensors, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def gbps(nbytes: int, seconds: float) -> float:
    """Decimal GB/s (10^9 bytes a second), as disks and links are quoted."""
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def meminfo_kib(text: str, field: str = "Cached") -> int | None:
    """A field of /proc/meminfo in KiB."""
    match = re.search(rf"^{re.escape(field)}:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(match.group(1)) if match else None


# -- a kernel that faults (check xid-fault) ---------------------------------------------------------------------- #

# One thread stores to the address it is given; an unmapped one is an MMU fault of this process only (the driver
# logs an application Xid, 31 on Ampere and Hopper, and ends the context). JIT-compiled by the driver from PTX.
FAULT_PTX = """
.version 7.0
.target sm_70
.address_size 64

.visible .entry shadowline_fault(.param .u64 target)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [target];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, 57005;
    st.global.u32 [%rd2], %r1;
    ret;
}
"""
FAULT_KERNEL = "shadowline_fault"
FAULT_ADDRESS = 0x1000  # never mapped in a CUDA context
APP_FAULT_XIDS = (13, 31, 43)  # what an application's own fault may be logged as
