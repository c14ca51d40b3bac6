"""scripts/gpu-proof (issue #43): its parsing and report code on recorded output of a real H200 node, and the whole
script on this machine, which has no GPU: it says which checks need one, writes its report and exits 0.

The GPU branch of the checks that need no CUDA (node facts, GPU events) also runs here against stand-ins: an
``nvidia-smi`` that answers as an H200 node's does, a ``pynvml`` with nvidia-ml-py's names and an NVML that answers
as one GPU does, and a ``torch`` that only names its devices. What needs CUDA itself (shared weights, load rates,
the parked process, the provoked fault) runs only on a GPU machine (docs/gpu-cluster.md).
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from shadowline import gpu_proof as gp
from shadowline.common.xid_table import NODE_SERVICE, RECOVERY_ACTIONS, RESTART_APP
from shadowline.model.safetensors_header import check_safetensors
from shadowline.slurm.render import ansible_inventory, read_with_ansible

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-proof"

# nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,memory.free,driver_version,pci.bus_id
#            --format=csv,noheader,nounits on a node of one H200 (141 GB HBM3e; 143771 MiB as the driver reports it)
H200_UUID = "GPU-5f3c9b8e-2a41-7d6e-9c0b-1e8f4a7d2c63"
H200_SMI = f"0, {H200_UUID}, NVIDIA H200, 143771, 1, 143180, 570.133.20, 00000000:19:00.0\n"
H200_SMI_8 = "".join(
    f"{i}, GPU-5f3c9b8e-2a41-7d6e-9c0b-1e8f4a7d2c6{i}, NVIDIA H200, 143771, {'[N/A]' if i == 7 else 1}, 143180, "
    f"570.133.20, 00000000:{0x19 + 0x10 * i:02X}:00.0\n" for i in range(8))

# what the kernel log holds of NVIDIA's driver (dmesg's form; journalctl -k -o cat has no time stamps): the
# module's load line, and the three lines the driver writes for an application's MMU fault on an H200
KERNEL_LOG = "".join(line + "\n" for line in (
    "[    0.000000] Linux version 6.8.0-52-generic (buildd@lcy02-amd64-046) (x86_64-linux-gnu-gcc-13 (Ubuntu 13.3.0))",
    "[    4.803112] nvidia: loading out-of-tree module taints kernel.",
    "[    4.912345] nvidia-nvlink: Nvlink Core is being initialized, major device number 511",
    "[    4.985311] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  "
    "(dvs-builder@U16-I1-N07-12-3)  Fri Feb 28 00:41:15 UTC 2025",
    f"[  812.443210] NVRM: GPU at PCI:0000:19:00: {H200_UUID}",
    "[  812.443215] NVRM: GPU Board Serial Number: 1654924012345",
    "[  812.443219] NVRM: Xid (PCI:0000:19:00): 31, pid=48213, name=python3, channel 0x00000002, intr 00000000. "
    "MMU Fault: ENGINE GRAPHICS GPC0 GPCCLIENT_T1_0 faulted @ 0x0_00001000. "
    "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE",
    "[  990.000001] NVRM: Xid (PCI:0000:29:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "[ 1001.120000] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 44 egress non-posted PRIV error",
))


def load_script():
    """scripts/gpu-proof as a module (its name has no .py)."""
    loader = importlib.machinery.SourceFileLoader("gpu_proof_script", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_proof_script", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


# -- parsing ------------------------------------------------------------------------------------------------------ #

def test_nvidia_smi_csv_of_an_h200_node():
    (gpu,) = gp.parse_smi_csv(H200_SMI)
    assert gpu == {"index": 0, "uuid": H200_UUID, "name": "NVIDIA H200", "memory.total": 143771.0,
                   "memory.used": 1.0, "memory.free": 143180.0, "driver_version": "570.133.20",
                   "pci.bus_id": "00000000:19:00.0"}
    eight = gp.parse_smi_csv(H200_SMI_8)
    assert [g["index"] for g in eight] == list(range(8))
    assert eight[7]["memory.used"] is None  # [N/A]
    assert eight[7]["pci.bus_id"] == "00000000:89:00.0"
    assert gp.parse_smi_csv("\n\n") == []


def test_kernel_log_through_the_agents_reader():
    log = gp.read_kernel_log(KERNEL_LOG.splitlines())
    assert log["driver"] == "570.133.20"
    assert log["nvrm_lines"] == 5
    assert log["gpu_at"] == {"0000:19:00": H200_UUID}
    assert len(log["xid_lines"]) == 3  # the two Xid lines and the NVSwitch's SXid line
    mmu, bus = log["faults"]
    assert (mmu["xid"], mmu["pci_bus"], mmu["gpu_uuid"], mmu["action"]) == (31, "0000:19:00", H200_UUID, RESTART_APP)
    assert "MMU Fault" in mmu["detail"]
    assert (bus["xid"], bus["pci_bus"], bus["gpu_uuid"], bus["action"]) == (79, "0000:29:00", None, NODE_SERVICE)
    assert log["unparsed"] == [KERNEL_LOG.splitlines()[-1].strip()]  # the agent does not read NVSwitch SXids
    known = gp.read_kernel_log(KERNEL_LOG.splitlines(), known={"00000000:29:00.0": "GPU-aaaa"})
    assert known["faults"][1]["gpu_uuid"] == "GPU-aaaa"  # NVML's 8-digit domain and function, normalized


def test_xid_classes_rows():
    rows = gp.xid_class_rows("gpu-events", [31, 79, 31, 9999])
    assert [r.item for r in rows] == ["Xid 31 in the catalog", "Xid 79 in the catalog", "Xid 9999 in the catalog"]
    assert rows[0].measured.startswith("restart-app: Xid 31 ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT")
    assert rows[1].measured.startswith("node-service")
    assert "not in shadowline's table" in rows[2].measured
    assert {r.status for r in rows} == {gp.INFO}


def test_nvml_constants_against_nvidia_ml_py_names():
    nvml = FakeNvmlNames()
    rows = gp.nvml_constant_rows("gpu-events", nvml)
    by_item = {r.item: r for r in rows}
    assert by_item["gpu_health's nvmlEventTypeXidCriticalError"].status == gp.PASS
    assert by_item["gpu_health's NVML_ERROR_TIMEOUT"].status == gp.PASS
    recovery = by_item["NVML recovery actions known to xid_table"]
    missing = sorted(set(range(8)) - set(RECOVERY_ACTIONS))
    assert recovery.status == (gp.FAIL if missing else gp.PASS)
    for value in missing:
        assert f"{value} " in recovery.measured
    nvml.nvmlEventTypeXidCriticalError = 0x10
    assert {r.item: r for r in gp.nvml_constant_rows("gpu-events", nvml)}[
        "gpu_health's nvmlEventTypeXidCriticalError"].status == gp.FAIL


def test_registration_rows_put_the_agents_events_first():
    names = gp.event_type_names(FakeNvmlNames())
    assert names[0x8] == "XidCriticalError" and 0 not in names and names[0x8000] == "GpuRecoveryAction"
    outcomes = {bit: "accepted" for bit in names}
    outcomes[0x4000] = "refused: Not Supported"
    rows = gp.registration_rows("gpu-events", 0xFFFF & ~0x4000, outcomes, names)
    assert [r.item.endswith("[agent]") for r in rows[:4]] == [True] * 4
    unavailable = next(r for r in rows if "GpuUnavailableError" in r.item)
    assert unavailable.status == gp.FAIL and unavailable.measured == "not supported; refused: Not Supported"
    assert {r.status for r in rows[4:]} == {gp.INFO}


# -- the memory budget -------------------------------------------------------------------------------------------- #

def test_the_example_figures_are_the_inventorys():
    tool = ansible_inventory()
    assert tool, "ansible-inventory is part of the dev venv (make setup)"
    hostvars, groups = read_with_ansible(tool, str(ROOT / gp.EXAMPLE_INVENTORY))
    node = hostvars[groups["gms_nodes"][0]]
    assert {"weights_gib": node["gms_memory"]["weights_gib"], "kv_reserve_gib": node["gms_memory"]["kv_reserve_gib"],
            "engine_overhead_gib": node["gms_memory"]["engine_overhead_gib"],
            "tensor_parallel_size": node["gms_engine"]["tensor_parallel_size"],
            "cohorts": node["gms_cohorts"]} == gp.EXAMPLE


def test_preflights_budget_on_an_h200_and_on_a_small_gpu():
    assert round(gp.budget_need_gib(), 2) == 65.44
    h200 = [{"uuid": H200_UUID, "memory_mib": 143771.0}]
    assert gp.example_budget(h200) == []
    (problem,) = gp.example_budget([{"uuid": H200_UUID, "memory_mib": 40960.0}])
    assert "each GPU needs 65.4 GiB" in problem and "has 40.0 GiB" in problem
    assert gp.default_overhead_gib() == 3.0


# -- rows, the table, the report ---------------------------------------------------------------------------------- #

def test_rows_table_and_report(tmp_path: Path):
    rows = [gp.same("node-facts", "GPU count", 1, 1), gp.same("node-facts", "UUIDs", ["a"], ["b"]),
            gp.row("load-rates", "cold", "(recorded)", 2.3456), gp.needs_gpu("parked-cost", "cost"),
            gp.row("node-facts", "x" * 80, None, [], None)]
    assert [r.status for r in rows] == [gp.PASS, gp.FAIL, gp.INFO, gp.NEEDS_GPU, gp.INFO]
    assert rows[2].measured == "2.35" and rows[4].expected == "(none)" and rows[4].measured == "(none)"
    assert gp.row_from_json(gp.row_to_json(rows[1])) == rows[1]
    assert gp.row_from_json("{not json") is None
    table = gp.format_table(rows)
    head, rule = table.splitlines()[:2]
    assert head.split() == ["check", "item", "expected", "measured", "pass"] and set(rule) <= {"-", " "}
    assert "x" * 59 + "~" in table
    results = [gp.CheckResult("node-facts", True, 1.2, False, 0, rows[:2] + rows[4:], "", ""),
               gp.CheckResult("parked-cost", False, 0.0, False, None, rows[3:4], "", "")]
    report = gp.build_report({"has_gpu": False}, results, 1767225600.0, 1767225603.5)
    assert report["started"] == "2026-01-01T00:00:00Z" and report["seconds"] == 3.5
    assert report["counts"] == {gp.PASS: 1, gp.FAIL: 1, gp.INFO: 1, gp.NEEDS_GPU: 1}
    assert gp.exit_code(report) == 1
    path = gp.write_report(str(tmp_path / "out"), report, table)
    assert json.loads(Path(path).read_text()) == report
    assert (tmp_path / "out" / gp.TABLE_NAME).read_text() == table + "\n"
    results[0].rows.pop(1)
    assert gp.exit_code(gp.build_report({}, results, 0.0, 1.0)) == 0
    results[0].error = "killed at its deadline of 45 s"
    assert gp.exit_code(gp.build_report({}, results, 0.0, 1.0)) == 1


def test_gpu_presence():
    assert gp.gpu_presence(None, None, None) == (False, "nvidia-smi is not on PATH (no NVIDIA driver)")
    assert gp.gpu_presence("/usr/bin/nvidia-smi", [], "NVIDIA-SMI has failed because it couldn't communicate "
                           "with the NVIDIA driver")[0] is False
    assert gp.gpu_presence("/usr/bin/nvidia-smi", ["No devices were found"], None) == (False, "nvidia-smi lists no GPU")
    has, why = gp.gpu_presence("/usr/bin/nvidia-smi", [f"GPU 0: NVIDIA H200 (UUID: {H200_UUID})"], None)
    assert has and why.startswith("nvidia-smi lists 1 GPU(s)")


def test_checks_fit_one_command():
    assert gp.TOTAL_BUDGET_S < 600 and all(c.timeout_s <= gp.TOTAL_BUDGET_S for c in gp.CHECKS)
    assert gp.CHECK_NAMES == ("node-facts", "gpu-events", "shared-weights", "load-rates", "parked-cost", "xid-fault")
    assert set(load_script().CHECK_FUNCTIONS) == set(gp.CHECK_NAMES)


# -- synthetic data ----------------------------------------------------------------------------------------------- #

def test_synthetic_safetensors_file_is_well_formed(tmp_path: Path):
    data = 3 * gp.MIB + 2
    header = gp.safetensors_header(data, tensor_bytes=gp.MIB)
    assert (len(header) - 8) % 8 == 0
    meta = json.loads(header[8:])
    assert [meta[f"proof.layers.{i}.weight"]["data_offsets"] for i in range(4)] == [
        [0, gp.MIB], [gp.MIB, 2 * gp.MIB], [2 * gp.MIB, 3 * gp.MIB], [3 * gp.MIB, data]]
    block = gp.pattern_block("t", gp.MIB)
    path = tmp_path / "model.safetensors"
    path.write_bytes(header + (block * 4)[:data])
    assert check_safetensors(str(path)) is None
    with pytest.raises(ValueError):
        gp.safetensors_header(3)


def test_pattern_helpers():
    block = gp.pattern_block("seed", 1000)
    assert block == gp.pattern_block("seed", 1000) != gp.pattern_block("other", 1000)
    assert gp.pattern_at(block, 990, 30) == block[990:] + block[:20]
    assert gp.pattern_at(block, 2500, 2100) == (block * 5)[500:2600]
    import hashlib

    assert gp.pattern_digest(block, 2500) == hashlib.sha256((block * 3)[:2500]).hexdigest()
    assert gp.gbps(4 * 10**9, 2.0) == 2.0
    assert gp.meminfo_kib("MemTotal:       131891328 kB\nCached:          5242880 kB\n") == 5242880
    assert gp.meminfo_kib("MemTotal: 1 kB\n", "Cached") is None


def test_gms_framing_passes_a_descriptor(tmp_path: Path):
    script = load_script()
    target = tmp_path / "weights"
    target.write_bytes(b"resident")
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(target, os.O_RDONLY)
    script.send_message(left, {"allocations": 1, "size": 8}, fd)
    os.close(fd)
    message, received = script.recv_message(right)
    assert message == {"allocations": 1, "size": 8} and received >= 0
    assert os.fstat(received).st_ino == target.stat().st_ino
    os.close(received)
    script.send_message(left, {"allocations": 0})
    assert script.recv_message(right) == ({"allocations": 0}, -1)
    left.close()
    with pytest.raises(ConnectionResetError):
        script.recv_message(right)


# -- stdlib only -------------------------------------------------------------------------------------------------- #

def test_the_script_imports_only_the_standard_library_and_shadowline():
    stdlib = set(sys.stdlib_module_names)
    tree = ast.parse(SCRIPT.read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and n.module]
    assert set(names) - stdlib - {"__future__"} == {"shadowline"}
    lazy = {n.names[0].name.split(".")[0] if isinstance(n, ast.Import) else (n.module or "").split(".")[0]
            for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and n not in top}
    assert lazy == {"torch", "pynvml", "cuda"}
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    code = ("import sys; sys.path.insert(0, 'plugins/module_utils'); import shadowline.gpu_proof, "
            "shadowline.control.gpu_watch, shadowline.common.proc, shadowline.deployment.node_facts, "
            "shadowline.deployment.preflight, shadowline.model.safetensors_header")
    subprocess.run([python, "-S", "-c", code], cwd=ROOT, check=True, timeout=60)


# -- the whole script --------------------------------------------------------------------------------------------- #

def run_script(tmp_path: Path, *args: str, path: str | None = None, env: dict | None = None,
               python_flags: tuple[str, ...] = ("-S",)) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out"
    empty = tmp_path / "empty-path"
    empty.mkdir(exist_ok=True)
    environment = {"PATH": path or str(empty), "LANG": "C.UTF-8", **(env or {})}
    done = subprocess.run([sys.executable, *python_flags, str(SCRIPT), "--out", str(out), *args],
                          capture_output=True, text=True, timeout=120, env=environment, cwd=tmp_path, check=False)
    report = json.loads((out / gp.REPORT_NAME).read_text())
    return done, report


def test_the_whole_script_without_a_gpu(tmp_path: Path):
    """On this machine: stdlib only (python -S), no nvidia-smi on PATH."""
    done, report = run_script(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu-proof: nvidia-smi is not on PATH" in done.stdout
    assert ("no GPU on this machine: these checks need a GPU and are not run: 3 shared weights, 4 load rates, "
            "5 parked cost, 6 provoked Xid; these run only their parts that need none: 1 node facts, 2 GPU events"
            in done.stdout)
    assert report["machine"]["has_gpu"] is False
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == list(gp.CHECK_NAMES)
    for name in ("shared-weights", "load-rates", "parked-cost", "xid-fault"):
        assert not checks[name]["ran"] and [r["status"] for r in checks[name]["rows"]] == [gp.NEEDS_GPU]
    for name in ("node-facts", "gpu-events"):
        assert checks[name]["ran"] and checks[name]["returncode"] == 0 and not checks[name]["error"]
        statuses = {r["status"] for r in checks[name]["rows"]}
        assert gp.NEEDS_GPU in statuses and gp.FAIL not in statuses
    assert gp.FAIL not in report["counts"]
    assert (tmp_path / "out" / gp.TABLE_NAME).read_text().startswith("check ")
    assert (tmp_path / "out" / "logs" / "node-facts.log").exists()


def test_a_saved_kernel_log_is_read(tmp_path: Path):
    saved = tmp_path / "dmesg.txt"
    saved.write_text(KERNEL_LOG)
    done, report = run_script(tmp_path, "--only", "gpu-events", "--kernel-log", str(saved))
    assert done.returncode == 0, done.stdout + done.stderr
    (events,) = report["checks"]
    rows = {r["item"]: r for r in events["rows"]}
    assert rows["kernel module version (NVRM: loading ...)"]["measured"] == "570.133.20"
    parsed = rows["Xid lines read by the agent's kernel-log reader"]
    assert parsed["status"] == gp.FAIL and parsed["measured"].startswith("2 parsed; unparsed: ['[ 1001.120000] "
                                                                         "nvidia-nvswitch0: SXid")
    assert rows["Xid 31 in the catalog"]["measured"].startswith("restart-app")


# -- the GPU branch of checks 1 and 2, against stand-ins ---------------------------------------------------------- #

class FakeNvmlNames:
    """nvidia-ml-py 13's names of the constants the checks read."""

    def __init__(self) -> None:
        events = {"SingleBitEccError": 1, "DoubleBitEccError": 2, "PState": 4, "XidCriticalError": 8, "Clock": 16,
                  "PowerSourceChange": 128, "SingleBitEccErrorStorm": 512, "DramRetirementEvent": 1024,
                  "DramRetirementFailure": 2048, "NonFatalPoisonError": 4096, "FatalPoisonError": 8192,
                  "GpuUnavailableError": 16384, "GpuRecoveryAction": 32768, "None": 0, "All": 65439}
        for name, value in events.items():
            setattr(self, f"nvmlEventType{name}", value)
        for value, name in enumerate(("NONE", "GPU_RESET", "NODE_REBOOT", "DRAIN_P2P", "DRAIN_AND_RESET",
                                      "RECOVER_IMEX_DOMAIN", "BUS_RESET", "SYSTEM_REBOOT")):
            setattr(self, f"NVML_GPU_RECOVERY_ACTION_{name}", value)
        self.NVML_ERROR_TIMEOUT, self.NVML_ERROR_GPU_IS_LOST = 10, 15


FAKE_PYNVML = '''
"""A stand-in of nvidia-ml-py over one H200 (tests/unit/test_gpu_proof.py)."""
import time

MIB = 1 << 20
UUID = "{uuid}"
{constants}


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML error {{value}}")
        self.value = value


class Handle:
    value = 1


class Memory:
    total, free, used = 143771 * MIB, 143180 * MIB, 1 * MIB


class Pci:
    busId = b"00000000:19:00.0"


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return 1


def nvmlDeviceGetHandleByIndex(index):
    return Handle()


def nvmlDeviceGetMemoryInfo(handle):
    return Memory()


def nvmlDeviceGetUUID(handle):
    return UUID


def nvmlDeviceGetName(handle):
    return "NVIDIA H200"


def nvmlDeviceGetPciInfo(handle):
    return Pci()


def nvmlSystemGetDriverVersion():
    return "570.133.20"


def nvmlSystemGetCudaDriverVersion():
    return 12080


def nvmlDeviceGetSupportedEventTypes(handle):
    return 0x3f8e  # no GPU-unavailable or recovery-action events on this driver


def nvmlEventSetCreate():
    return object()


def nvmlEventSetFree(event_set):
    pass


def nvmlDeviceRegisterEvents(handle, mask, event_set):
    if mask & ~nvmlDeviceGetSupportedEventTypes(handle):
        raise NVMLError(3)


def nvmlEventSetWait(event_set, timeout_ms):
    time.sleep(min(timeout_ms, 50) / 1000)
    raise NVMLError(NVML_ERROR_TIMEOUT)
'''

FAKE_TORCH = '''
class _Properties:
    uuid = "{uuid}"


class cuda:
    @staticmethod
    def device_count():
        return 1

    @staticmethod
    def get_device_properties(index):
        return _Properties()
'''

FAKE_SMI = f'''#!{sys.executable}
import sys
ROW = {{"index": "0", "uuid": "{H200_UUID}", "name": "NVIDIA H200", "memory.total": "143771", "memory.used": "1",
        "memory.free": "143180", "driver_version": "570.133.20", "pci.bus_id": "00000000:19:00.0"}}
if sys.argv[1:] == ["-L"]:
    print("GPU 0: NVIDIA H200 (UUID: {H200_UUID})")
else:
    fields = next(a for a in sys.argv if a.startswith("--query-gpu="))[len("--query-gpu="):].split(",")
    print(", ".join(ROW[f] for f in fields))
'''


def stand_ins(tmp_path: Path) -> tuple[str, dict]:
    bin_dir, lib = tmp_path / "bin", tmp_path / "lib"
    bin_dir.mkdir()
    (lib / "torch").mkdir(parents=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    names = FakeNvmlNames()
    constants = "\n".join(f"{k} = {v!r}" for k, v in sorted(vars(names).items()))
    (lib / "pynvml.py").write_text(FAKE_PYNVML.format(uuid=H200_UUID, constants=constants))
    (lib / "torch" / "__init__.py").write_text(FAKE_TORCH.format(uuid=H200_UUID[4:]))
    return str(bin_dir), {"PYTHONPATH": str(lib)}


def test_the_gpu_branch_of_node_facts_and_events_against_stand_ins(tmp_path: Path):
    path, env = stand_ins(tmp_path)
    saved = tmp_path / "dmesg.txt"
    saved.write_text("\n".join(KERNEL_LOG.splitlines()[:8]) + "\n")  # without the NVSwitch line
    done, report = run_script(tmp_path, "--only", "node-facts,gpu-events", "--kernel-log", str(saved), path=path,
                              env=env, python_flags=())
    assert "gpu-proof: nvidia-smi lists 1 GPU(s): GPU 0: NVIDIA H200" in done.stdout, done.stdout + done.stderr
    checks = {c["name"]: c for c in report["checks"]}
    assert report["machine"]["nvidia_smi"][0]["uuid"] == H200_UUID
    facts = {r["item"]: r for r in checks["node-facts"]["rows"]}
    for item in ("GPU count: preflight = nvidia-smi", "GPU count: NVML = nvidia-smi", "UUIDs: preflight = nvidia-smi",
                 "UUIDs: NVML = nvidia-smi", "memory.total MiB: preflight = nvidia-smi",
                 "memory total MiB: NVML = nvidia-smi", "model: NVML = nvidia-smi", "driver: NVML = nvidia-smi",
                 "CUDA order (CUDA_DEVICE_ORDER=PCI_BUS_ID) = nvidia-smi's (UUIDs)",
                 "preflight's verdict on this GPU (sized from memory.total)",
                 "the example's need against the GPU's free memory (NVML, idle)"):
        assert facts[item]["status"] == gp.PASS, facts[item]
    assert facts["CUDA version of the driver (NVML)"]["measured"] == "12.8"
    assert facts["memory.total - free on the idle GPU (counted by preflight, free to no process)"][
        "measured"] == "0.58 GiB"
    assert not checks["node-facts"]["error"]
    events = {r["item"]: r for r in checks["gpu-events"]["rows"]}
    assert events["GpuWatch('nvml') starts (the agent's listener)"]["status"] == gp.PASS
    assert events["GpuWatch('nvml') starts (the agent's listener)"]["measured"] == (
        "gpu-watch-started: NVML events on 1 GPU(s)")
    assert events["faults reported on the idle GPU in 1.5 s"]["status"] == gp.PASS
    assert events["GpuWatch stops within 3 s"]["status"] == gp.PASS
    assert events["the agent's mask, all supported (it registers only the supported part)"]["measured"] == "0xa"
    assert events["register XidCriticalError (0x8) [agent]"]["status"] == gp.PASS
    assert events["register GpuRecoveryAction (0x8000) [agent]"]["measured"].startswith("not supported; refused")
    assert events["'NVRM: GPU at PCI:0000:19:00' names the UUID NVML gives"]["status"] == gp.PASS
    assert events["Xid lines read by the agent's kernel-log reader"]["status"] == gp.PASS
    assert not checks["gpu-events"]["error"]
    assert done.returncode == 1  # the driver stand-in lacks two of the agent's events: rows failed, as they should
    assert "row(s) failed" in done.stdout
    assert not list(Path(tempfile.gettempdir()).glob("gpu-proof-node-facts-*.jsonl"))


# -- the shared-weights check's processes, against a stand-in of CUDA's virtual memory API ------------------------ #

# cuda.bindings.driver's calls as the check makes them, over Linux's own shareable memory: an allocation is a
# memfd, its exported handle a duplicate descriptor, an import another, a mapping an mmap. The kernel keeps a memfd
# while any descriptor or mapping of it is open, as the driver keeps an allocation while any handle of it is.
FAKE_CUDA_DRIVER = '''
"""A stand-in of cuda.bindings.driver's virtual memory calls over memfd (tests/unit/test_gpu_proof.py)."""
import ctypes
import enum
import mmap
import os

SPAN = 1 << 40


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_ILLEGAL_ADDRESS = 700


class CUmemAllocationType(enum.IntEnum):
    CU_MEM_ALLOCATION_TYPE_PINNED = 1


class CUmemLocationType(enum.IntEnum):
    CU_MEM_LOCATION_TYPE_DEVICE = 1


class CUmemAllocationHandleType(enum.IntEnum):
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1


class CUmemAccess_flags(enum.IntEnum):
    CU_MEM_ACCESS_FLAGS_PROT_READ = 1
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class CUmemAllocationGranularity_flags(enum.IntEnum):
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0


class _Location:
    type = 0
    id = 0


class CUmemAllocationProp:
    def __init__(self):
        self.location = _Location()


class CUmemAccessDesc:
    def __init__(self):
        self.location = _Location()
        self.flags = 0


class CUdeviceptr(int):
    pass


_maps = {}  # base address -> [mmap, access flags]
_next = [SPAN]


def cuInit(flags):
    return (CUresult.CUDA_SUCCESS,)


def cuMemGetAllocationGranularity(prop, flag):
    return CUresult.CUDA_SUCCESS, 2 << 20


def cuMemCreate(size, prop, flags):
    if prop.requestedHandleTypes != CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
        return CUresult.CUDA_ERROR_INVALID_VALUE, 0
    fd = os.memfd_create("fake-cuda-allocation")
    os.ftruncate(fd, size)
    return CUresult.CUDA_SUCCESS, fd


def cuMemExportToShareableHandle(handle, kind, flags):
    return CUresult.CUDA_SUCCESS, os.dup(int(handle))


def cuMemImportFromShareableHandle(fd, kind):
    return CUresult.CUDA_SUCCESS, os.dup(int(fd))


def cuDeviceGet(ordinal):
    return CUresult.CUDA_SUCCESS, ordinal


def cuDevicePrimaryCtxRetain(device):
    return CUresult.CUDA_SUCCESS, 1


def cuCtxSetCurrent(context):
    return (CUresult.CUDA_SUCCESS,)


def cuCtxSynchronize():
    return (CUresult.CUDA_SUCCESS,)


def cuMemAddressReserve(size, alignment, address, flags):
    _next[0] += SPAN
    return CUresult.CUDA_SUCCESS, CUdeviceptr(_next[0])


def cuMemMap(address, size, offset, handle, flags):
    _maps[int(address)] = [mmap.mmap(int(handle), size), 0]
    return (CUresult.CUDA_SUCCESS,)


def cuMemSetAccess(address, size, descs, count):
    _maps[int(address)][1] = int(descs[0].flags)
    return (CUresult.CUDA_SUCCESS,)


def _at(address, count):
    base = int(address) // SPAN * SPAN
    memory, access = _maps[base]
    offset = int(address) - base
    assert offset + count <= len(memory)
    return ctypes.addressof(ctypes.c_char.from_buffer(memory)) + offset, access


def cuMemcpyHtoD(address, host, count):
    target, access = _at(address, count)
    if access != CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
        return (CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,)
    ctypes.memmove(target, host, count)
    return (CUresult.CUDA_SUCCESS,)


def cuMemcpyDtoH(host, address, count):
    source, access = _at(address, count)
    if not access & CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ:
        return (CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,)
    ctypes.memmove(host, source, count)
    return (CUresult.CUDA_SUCCESS,)


def cuMemUnmap(address, size):
    _maps.pop(int(address))[0].close()
    return (CUresult.CUDA_SUCCESS,)


def cuMemRelease(handle):
    os.close(int(handle))
    return (CUresult.CUDA_SUCCESS,)


def cuMemAddressFree(address, size):
    return (CUresult.CUDA_SUCCESS,)
'''


def test_the_shared_weights_processes_against_a_stand_in_of_cuda(tmp_path: Path):
    """The server, writer and readers of check 3 as the check runs them, over the stand-in: a server that never maps,
    a read-write writer, two read-only readers that read the same bytes after the server's SIGKILL, a new server that
    starts empty. (The memory figures come from the pynvml stand-in, which holds still.)"""
    path, env = stand_ins(tmp_path)
    lib = Path(env["PYTHONPATH"])
    (lib / "cuda" / "bindings").mkdir(parents=True)
    (lib / "cuda" / "__init__.py").write_text("")
    (lib / "cuda" / "bindings" / "__init__.py").write_text("")
    (lib / "cuda" / "bindings" / "driver.py").write_text(FAKE_CUDA_DRIVER)
    done, report = run_script(tmp_path, "--only", "shared-weights", "--shared-mib", "40", path=path, env=env,
                              python_flags=())
    (check,) = report["checks"]
    rows = {r["item"]: r for r in check["rows"]}
    assert check["returncode"] == 0 and not check["error"], check["stderr_tail"]
    assert rows["the server's CUDA context (GMS's server has none)"]["status"] == gp.PASS
    assert rows["a writer imports it read-write and fills it"]["measured"].startswith(f"{40 * gp.MIB} bytes in")
    expected = gp.pattern_digest(gp.pattern_block("shadowline gpu-proof shared weights"), 40 * gp.MIB)[:16]
    for index in (1, 2):
        for item in (f"reader {index} (read-only mapping) reads the pattern",
                     f"reader {index} reads the same bytes after the server's SIGKILL"):
            assert (rows[item]["status"], rows[item]["measured"]) == (gp.PASS, expected)
    assert rows["a new server on the same socket starts empty"]["status"] == gp.PASS
    assert {r["status"] for r in check["rows"]} <= {gp.PASS, gp.INFO}
    assert done.returncode == 0, done.stdout
