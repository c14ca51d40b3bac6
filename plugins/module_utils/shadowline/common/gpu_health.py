"""GPU health events of one node, as typed faults with the action each needs (common/xid_table.py): pure parsing
and classification, and three sources a per-node listener polls. Nothing here acts on a fault.

Sources, best first:
- NVML through ``nvidia-ml-py`` (``pynvml``) where it imports and a driver answers: an event set registered on every
  GPU for XID critical errors, double-bit ECC errors, GPU unavailable and GPU recovery action
  (``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents``, ``nvmlEventSetWait``), no polling of counters.
- The kernel log, as ``journalctl -k -f -o cat`` prints it (``KERNEL_LOG_ARGV``): ``NVRM: Xid (PCI:0000:3b:00): 79,
  pid=..., ...`` lines (``parse_kernel_line``); the driver's ``NVRM: GPU at PCI:<bus>: GPU-<uuid>`` lines name the
  UUID of a bus id (``KernelLog`` remembers them).
- A backend's own source (``Backend.gpu_event_source``): the stand-in's event file (standin/gpu_events.py), which
  drills append to, in the deployment's state dir (``GPU_EVENTS_FILE``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from . import xid_table
from .xid_table import ACTIONS, NODE_SERVICE, NONE, RECOVERY_ACTIONS, RESET_GPU, RESTART_APP, XIDS

NVML = "nvml"
KERNEL_LOG = "kernel-log"
KERNEL_LOG_ARGV = ("journalctl", "-k", "-f", "-o", "cat", "--since", "now")
# A node's GPU event file in the deployment's state dir (the stand-in's source, standin/gpu_events.py): named here,
# where the history reader (cluster/history.py) can leave it out of the event logs without importing the stand-in.
GPU_EVENTS_FILE = "gpu-events.jsonl"
XID_RECOVERY_ACTION = 154
XID_DOUBLE_BIT_ECC = 48
XID_FALLEN_OFF_THE_BUS = 79


@dataclass(frozen=True)
class GpuFault:
    gpu_uuid: str | None  # None when only the bus id is known (a kernel line before its UUID line)
    pci_bus: str | None  # e.g. 0000:3b:00
    xid: int | None  # None for an NVML event that carries no Xid (GPU unavailable, double-bit ECC)
    action: str  # xid_table.ACTIONS
    detail: str  # what happened, for the failure declaration and the report
    source: str  # nvml | kernel-log | a backend's own (the stand-in's: fake)
    time: float = 0.0  # wall-clock time the event was seen or written

    @property
    def fails_gpu(self) -> bool:
        """The GPU itself is out of service (reset-gpu or node-service): no cohort may use it, no shadow on it may
        be promoted, the node is fenced."""
        return self.action in (RESET_GPU, NODE_SERVICE)


def classify(xid: int, message: str = "") -> tuple[str, str]:
    """(action, detail) of an Xid, from the versioned table; Xid 154 by the recovery action its message names."""
    if xid == XID_RECOVERY_ACTION:
        action, name = recovery_action_from_text(message)
        return action, f"Xid 154 GPU_RECOVERY_ACTION_CHANGED: {name} (table {xid_table.VERSION})"
    row = XIDS.get(xid)
    if row is None:
        return RESTART_APP, (f"Xid {xid} is not in shadowline's table {xid_table.VERSION}: failing over as for an "
                             "application error; look it up in NVIDIA's Xid catalog")
    mnemonic, bucket, action, why = row
    return action, f"Xid {xid} {mnemonic} (NVIDIA: {bucket}{'; ' + why if why else ''})"


def recovery_action_from_text(message: str) -> tuple[str, str]:
    """The action of Xid 154's text ``... changed from 0x0 (None) to 0x2 (Node Reboot Required)``."""
    match = re.search(r"to\s+0x([0-9a-fA-F]+)\s*\(([^)]*)\)", message)
    if match:
        value = int(match.group(1), 16)
        if value in RECOVERY_ACTIONS:
            name, action = RECOVERY_ACTIONS[value]
            return action, name
        return NODE_SERVICE, f"recovery action 0x{value:x} ({match.group(2)}), unknown to the table"
    for name, action in RECOVERY_ACTIONS.values():
        if name.lower() in message.lower() and action != NONE:
            return action, name
    return RESET_GPU, "recovery action not named; taken as a GPU reset"


def worst(faults: Iterable[GpuFault]) -> str:
    """The most severe action among ``faults`` (``none`` for none)."""
    return max((f.action for f in faults), key=ACTIONS.index, default=NONE)


# -- kernel log ------------------------------------------------------------------------------------------------- #

_XID_LINE = re.compile(r"NVRM: Xid \(PCI:(?P<bus>[0-9A-Fa-f:.]+)\): (?P<xid>\d+),\s*(?P<rest>.*)$")
_GPU_AT = re.compile(r"NVRM: GPU at PCI:(?P<bus>[0-9A-Fa-f:.]+): (?P<uuid>GPU-[0-9A-Fa-f-]+)")
_OFF_THE_BUS = re.compile(r"NVRM: GPU at (?:PCI:)?(?P<bus>[0-9A-Fa-f:.]+) has fallen off the bus")


def normal_bus(bus: str) -> str:
    """A PCI bus id as the kernel log writes it (domain:bus:device, lower case, no function)."""
    bus = bus.strip().lower()
    parts = bus.split(":")
    if len(parts) == 3 and "." in parts[2]:
        parts[2] = parts[2].split(".", 1)[0]
    if len(parts) == 2:
        parts = ["0000", *parts]
    if len(parts) == 3 and len(parts[0]) == 8:
        parts[0] = parts[0][-4:]  # NVML's 8-digit domain
    return ":".join(parts)


def parse_kernel_line(line: str, uuids: dict[str, str] | None = None, now: float | None = None) -> GpuFault | None:
    """The fault a kernel log line reports, or None. ``uuids`` maps bus ids (normal_bus) to GPU UUIDs."""
    uuids = uuids or {}
    match = _XID_LINE.search(line)
    if match:
        bus = normal_bus(match.group("bus"))
        xid = int(match.group("xid"))
        rest = match.group("rest").strip()
        action, detail = classify(xid, rest)
        return GpuFault(uuids.get(bus), bus, xid, action, f"{detail}: {rest}", KERNEL_LOG,
                        time.time() if now is None else now)
    match = _OFF_THE_BUS.search(line)
    if match:
        bus = normal_bus(match.group("bus"))
        action, detail = classify(XID_FALLEN_OFF_THE_BUS)
        return GpuFault(uuids.get(bus), bus, XID_FALLEN_OFF_THE_BUS, action, detail, KERNEL_LOG,
                        time.time() if now is None else now)
    return None


class KernelLog:
    """Reads kernel log lines (a ``journalctl -k -f -o cat`` pipe, or any lines) into faults, learning the UUID of
    each bus id from the driver's ``NVRM: GPU at PCI:<bus>: GPU-<uuid>`` lines and from ``known`` (NVML's)."""

    def __init__(self, known: dict[str, str] | None = None) -> None:
        self.uuids = {normal_bus(bus): uuid for bus, uuid in (known or {}).items()}

    def feed(self, lines: Iterable[str], now: float | None = None) -> Iterator[GpuFault]:
        for line in lines:
            match = _GPU_AT.search(line)
            if match:
                self.uuids[normal_bus(match.group("bus"))] = match.group("uuid")
                continue
            fault = parse_kernel_line(line, self.uuids, now)
            if fault is not None:
                yield fault


# -- NVML ------------------------------------------------------------------------------------------------------- #

# nvidia-ml-py's nvmlEventType* masks (pynvml.py): the events a listener registers for.
EVENT_DOUBLE_BIT_ECC = 0x0000000000000002
EVENT_XID_CRITICAL = 0x0000000000000008
EVENT_GPU_UNAVAILABLE = 0x0000000000004000
EVENT_GPU_RECOVERY_ACTION = 0x0000000000008000
EVENT_MASK = EVENT_DOUBLE_BIT_ECC | EVENT_XID_CRITICAL | EVENT_GPU_UNAVAILABLE | EVENT_GPU_RECOVERY_ACTION
NVML_ERROR_TIMEOUT = 10  # pynvml.NVML_ERROR_TIMEOUT: nvmlEventSetWait saw no event
NVML_ERROR_GPU_IS_LOST = 15  # pynvml.NVML_ERROR_GPU_IS_LOST: a GPU fell off the bus or stopped answering


def fault_of_nvml_event(event_type: int, event_data: int, gpu_uuid: str | None, pci_bus: str | None,
                        now: float | None = None) -> GpuFault | None:
    """The fault of one NVML event (``c_nvmlEventData_t``'s eventType and eventData), or None for other types."""
    when = time.time() if now is None else now
    if event_type & EVENT_XID_CRITICAL:
        action, detail = classify(int(event_data))
        return GpuFault(gpu_uuid, pci_bus, int(event_data), action, detail, NVML, when)
    if event_type & EVENT_DOUBLE_BIT_ECC:
        action, detail = classify(XID_DOUBLE_BIT_ECC)
        return GpuFault(gpu_uuid, pci_bus, None, action, f"NVML double-bit ECC error event ({detail})", NVML, when)
    if event_type & EVENT_GPU_UNAVAILABLE:
        return GpuFault(gpu_uuid, pci_bus, None, NODE_SERVICE,
                        "NVML: the GPU is unavailable (lost to the driver, as when it fell off the bus)", NVML, when)
    if event_type & EVENT_GPU_RECOVERY_ACTION:
        name, action = RECOVERY_ACTIONS.get(int(event_data), (f"unknown recovery action {event_data}", NODE_SERVICE))
        return GpuFault(gpu_uuid, pci_bus, None, action, f"NVML: GPU recovery action {name}", NVML, when)
    return None


class NvmlEvents:
    """NVML's event set over every GPU of this node. ``open()`` returns None where nvidia-ml-py does not import
    or no driver answers (the kernel log is the fallback there). ``poll(timeout_ms)`` waits for events."""

    def __init__(self, nvml: Any, event_set: Any, devices: dict[Any, tuple[str, str]]) -> None:
        self.nvml, self.event_set, self.devices = nvml, event_set, devices

    @classmethod
    def open(cls, nvml: Any = None) -> NvmlEvents | None:
        if nvml is None:
            try:
                import pynvml as nvml  # noqa: PLC0415 (nvidia-ml-py, only on GPU nodes)
            except ImportError:
                return None
        try:
            nvml.nvmlInit()
            event_set = nvml.nvmlEventSetCreate()
            devices: dict[Any, tuple[str, str]] = {}
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                bus = normal_bus(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle) & EVENT_MASK
                nvml.nvmlDeviceRegisterEvents(handle, supported, event_set)
                devices[_key(handle)] = (uuid, bus)
        except Exception:  # pynvml.NVMLError and its subclasses: no driver, no GPU, not supported  # noqa: BLE001
            return None
        return cls(nvml, event_set, devices)

    @property
    def uuids_by_bus(self) -> dict[str, str]:
        """What the kernel-log reader should know: bus id -> GPU UUID."""
        return {bus: uuid for uuid, bus in self.devices.values()}

    def poll(self, timeout_ms: int = 1000) -> list[GpuFault]:
        faults = []
        wait = timeout_ms
        while True:
            try:
                data = self.nvml.nvmlEventSetWait(self.event_set, wait)
            except Exception as err:  # noqa: BLE001 (pynvml.NVMLError; timeout is the usual answer)
                code = getattr(err, "value", None)
                if code == NVML_ERROR_GPU_IS_LOST:
                    faults.append(GpuFault(None, None, None, NODE_SERVICE, f"NVML event wait failed: {err} (a GPU "
                                           "is lost)", NVML, time.time()))
                elif code != NVML_ERROR_TIMEOUT:
                    # the listener is blind from here on; that is no fault of a GPU (never fence a node for it)
                    raise OSError(f"NVML event wait failed: {err}") from None
                return faults
            uuid, bus = self.devices.get(_key(data.device), (None, None))
            fault = fault_of_nvml_event(int(data.eventType), int(data.eventData), uuid, bus)
            if fault is not None:
                faults.append(fault)
            wait = 0  # drain what is queued, then return

    def close(self) -> None:
        try:
            self.nvml.nvmlEventSetFree(self.event_set)
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 (closing on the way out)
            pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _key(handle: Any) -> Any:
    """A device handle as a dict key (pynvml's are ctypes pointers: compare their addresses)."""
    value = getattr(handle, "value", None)
    if value is not None:
        return value
    try:
        import ctypes  # noqa: PLC0415

        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
