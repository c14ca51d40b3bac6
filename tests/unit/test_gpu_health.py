"""shadowline.common.gpu_health and its Xid table: every table row checked against the catalog's bucket, kernel log
lines in the driver's format, NVML events through a fake nvidia-ml-py (the stand-in's fake event file:
test_gpu_events.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from shadowline.common import gpu_health, xid_table
from shadowline.common.gpu_health import (
    KERNEL_LOG,
    NVML,
    GpuFault,
    KernelLog,
    NvmlEvents,
    classify,
    normal_bus,
    parse_kernel_line,
    worst,
)
from shadowline.common.xid_table import NODE_SERVICE, NONE, RESET_GPU, RESTART_APP
from shadowline.standin.gpu_events import FAKE

UUID = "GPU-7f4e2c1a-9b3d-4e5f-8a6b-0c1d2e3f4a5b"


# -- the table ---------------------------------------------------------------------------------------------------- #

@pytest.mark.parametrize("xid", sorted(xid_table.XIDS))
def test_each_row_follows_its_bucket_or_says_why(xid):
    mnemonic, bucket, action, why = xid_table.XIDS[xid]
    assert mnemonic.isupper() and action in xid_table.ACTIONS
    if bucket in xid_table.BUCKET_ACTIONS and xid_table.BUCKET_ACTIONS[bucket] == action:
        return
    assert why, f"Xid {xid}: {action} differs from the catalog's {bucket} without a reason"


@pytest.mark.parametrize("xid, action", [
    (13, RESTART_APP), (31, RESTART_APP), (43, RESTART_APP),  # application-level
    (45, NONE),  # the teardown's own trace (SIGKILL of an engine), never a new fault
    (48, RESET_GPU), (63, NONE), (64, RESET_GPU), (74, RESET_GPU), (79, NODE_SERVICE), (92, NONE),
    (94, RESTART_APP), (95, RESET_GPU), (119, RESET_GPU), (120, RESET_GPU),
])
def test_the_xids_of_the_issue(xid, action):
    assert classify(xid)[0] == action


def test_unknown_xid_fails_over_and_says_so():
    action, detail = classify(999)
    assert action == RESTART_APP and "not in shadowline's table" in detail and xid_table.VERSION in detail


@pytest.mark.parametrize("message, action", [
    ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", NODE_SERVICE),
    ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", RESET_GPU),
    ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", NONE),
    ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", RESET_GPU),
    ("GPU recovery action changed from 0x0 (None) to 0x9 (Something New)", NODE_SERVICE),
])
def test_xid_154_by_the_action_it_names(message, action):
    assert classify(154, message)[0] == action


def test_worst_action():
    def fault(action: str) -> GpuFault:
        return GpuFault(UUID, None, 1, action, "", FAKE)

    assert worst([]) == NONE
    assert worst([fault(RESTART_APP), fault(NODE_SERVICE), fault(RESET_GPU)]) == NODE_SERVICE
    assert fault(RESET_GPU).fails_gpu and fault(NODE_SERVICE).fails_gpu and not fault(RESTART_APP).fails_gpu


# -- kernel log --------------------------------------------------------------------------------------------------- #

def test_kernel_xid_lines():
    fault = parse_kernel_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.", now=5.0)
    assert fault == GpuFault(None, "0000:3b:00", 79, NODE_SERVICE, fault.detail, KERNEL_LOG, 5.0)
    assert "GPU has fallen off the bus" in fault.detail
    dmesg = "[ 8812.431207] NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, "\
            "reset gpu to activate."
    assert parse_kernel_line(dmesg).action == NONE
    dbe = "NVRM: Xid (PCI:0000:B4:00): 48, pid=22345, name=python3, An uncorrectable double bit error (DBE) has "\
          "been detected on GPU in the framebuffer at physAddr 0x5d2e8f000."
    fault = parse_kernel_line(dbe, {"0000:b4:00": UUID})
    assert (fault.xid, fault.action, fault.gpu_uuid, fault.pci_bus) == (48, RESET_GPU, UUID, "0000:b4:00")
    rec = "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    assert parse_kernel_line(rec).action == NODE_SERVICE


def test_fallen_off_the_bus_line_without_an_xid():
    fault = parse_kernel_line("NVRM: GPU at 0000:01:00.0 has fallen off the bus.")
    assert (fault.xid, fault.pci_bus, fault.action) == (79, "0000:01:00", NODE_SERVICE)


def test_other_kernel_lines_are_not_faults():
    for line in ("NVRM: GPU at PCI:0000:3b:00: " + UUID, "NVRM: GPU Board Serial Number: 1321021035263",
                 "nvidia-nvlink: Nvlink Core is being initialized", "EXT4-fs (nvme0n1p2): mounted filesystem", ""):
        assert parse_kernel_line(line) is None


def test_kernel_log_learns_the_uuid_of_a_bus():
    lines = ["NVRM: GPU at PCI:0000:3b:00: " + UUID,
             "NVRM: GPU Board Serial Number: 1321021035263",
             "NVRM: Xid (PCI:0000:3b:00): 95, pid=4242, name=python3, Uncontained: FBHUB. RST: Yes, D-RST: No",
             "NVRM: Xid (PCI:0000:5e:00): 13, pid=4243, name=python3, Graphics Exception: ESR 0x50"]
    faults = list(KernelLog().feed(lines, now=1.0))
    assert [(f.gpu_uuid, f.xid, f.action) for f in faults] == [(UUID, 95, RESET_GPU), (None, 13, RESTART_APP)]
    known = KernelLog({"00000000:5E:00.0": "GPU-other"})
    assert next(iter(known.feed(lines[3:]))).gpu_uuid == "GPU-other"


@pytest.mark.parametrize("bus, normal", [
    ("0000:3B:00", "0000:3b:00"), ("00000000:3B:00.0", "0000:3b:00"), ("3b:00", "0000:3b:00"),
    ("0000:01:00.0", "0000:01:00"),
])
def test_bus_ids_compare_in_one_form(bus, normal):
    assert normal_bus(bus) == normal


# -- NVML, through a fake nvidia-ml-py ------------------------------------------------------------------------------ #

class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """The part of pynvml the listener calls, with queued events."""

    def __init__(self, events: list[tuple[int, int, int]], fail_init: bool = False) -> None:
        self.events = list(events)  # (device index, event type, event data)
        self.fail_init = fail_init
        self.registered: list[tuple[int, int]] = []
        self.closed = False

    def nvmlInit(self):  # noqa: N802 (pynvml's names)
        if self.fail_init:
            raise FakeNvmlError(9)  # NVML_ERROR_DRIVER_NOT_LOADED

    def nvmlEventSetCreate(self):  # noqa: N802
        return "set"

    def nvmlDeviceGetCount(self):  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):  # noqa: N802
        return SimpleNamespace(value=1000 + index)

    def nvmlDeviceGetUUID(self, handle):  # noqa: N802
        return f"GPU-{handle.value}".encode()

    def nvmlDeviceGetPciInfo(self, handle):  # noqa: N802
        return SimpleNamespace(busId=f"00000000:{handle.value - 1000 + 0x3b:02X}:00.0".encode())

    def nvmlDeviceGetSupportedEventTypes(self, handle):  # noqa: N802
        return 0xFFFF

    def nvmlDeviceRegisterEvents(self, handle, mask, event_set):  # noqa: N802
        self.registered.append((handle.value, mask))

    def nvmlEventSetWait(self, event_set, timeout_ms):  # noqa: N802
        if not self.events:
            raise FakeNvmlError(gpu_health.NVML_ERROR_TIMEOUT)
        index, event_type, data = self.events.pop(0)
        return SimpleNamespace(device=SimpleNamespace(value=1000 + index), eventType=event_type, eventData=data)

    def nvmlEventSetFree(self, event_set):  # noqa: N802
        self.closed = True

    def nvmlShutdown(self):  # noqa: N802
        pass


def test_nvml_events_become_faults():
    nvml = FakeNvml([(0, gpu_health.EVENT_XID_CRITICAL, 79), (1, gpu_health.EVENT_XID_CRITICAL, 13),
                     (1, gpu_health.EVENT_DOUBLE_BIT_ECC, 0), (0, gpu_health.EVENT_GPU_UNAVAILABLE, 0),
                     (1, gpu_health.EVENT_GPU_RECOVERY_ACTION, 2)])
    events = NvmlEvents.open(nvml)
    assert events is not None
    assert nvml.registered == [(1000, gpu_health.EVENT_MASK), (1001, gpu_health.EVENT_MASK)]
    assert events.uuids_by_bus == {"0000:3b:00": "GPU-1000", "0000:3c:00": "GPU-1001"}
    faults = events.poll(10)
    assert [(f.gpu_uuid, f.pci_bus, f.xid, f.action, f.source) for f in faults] == [
        ("GPU-1000", "0000:3b:00", 79, NODE_SERVICE, NVML), ("GPU-1001", "0000:3c:00", 13, RESTART_APP, NVML),
        ("GPU-1001", "0000:3c:00", None, RESET_GPU, NVML), ("GPU-1000", "0000:3b:00", None, NODE_SERVICE, NVML),
        ("GPU-1001", "0000:3c:00", None, NODE_SERVICE, NVML)]
    assert events.poll(10) == []
    events.close()
    assert nvml.closed


def test_no_driver_means_no_nvml_source():
    assert NvmlEvents.open(FakeNvml([], fail_init=True)) is None


def test_a_failing_wait_is_reported():
    nvml = FakeNvml([])
    events = NvmlEvents.open(nvml)

    def broken(event_set, timeout_ms):
        raise FakeNvmlError(15)  # NVML_ERROR_GPU_IS_LOST

    nvml.nvmlEventSetWait = broken
    (fault,) = events.poll(10)
    assert fault.action == NODE_SERVICE and "NVML event wait failed" in fault.detail


def test_an_nvml_error_that_is_no_gpu_fault_blinds_the_listener_and_fences_nothing():
    nvml = FakeNvml([])
    events = NvmlEvents.open(nvml)

    def broken(event_set, timeout_ms):
        raise FakeNvmlError(999)  # NVML_ERROR_UNKNOWN

    nvml.nvmlEventSetWait = broken
    with pytest.raises(OSError, match="NVML event wait failed"):
        events.poll(10)
