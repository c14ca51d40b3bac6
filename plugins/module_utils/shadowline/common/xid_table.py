"""NVIDIA's Xid catalog, sorted into what shadowline does about each Xid: data only (common/gpu_health.py reads it).

Source: NVIDIA's "Analyzing Xid Errors with the Xid Catalog" (docs.nvidia.com/deploy/xid-errors/
analyzing-xid-catalog.html, the catalog for Ampere and newer GPUs), column "Resolution Bucket (Immediate
Action)". Each row keeps the catalog's mnemonic and bucket beside our action, so a change of the catalog is a diff
of this file (bump VERSION). Only Xids the catalog marks as applying to A100, H100, B100 or GB200 are listed; an
Xid not listed is handled as ``restart-app`` and reported as unknown (gpu_health.classify).

Actions:
- ``restart-app``: the engine on that GPU is lost, the GPU is fine: fail the cohort over to a parked shadow as usual.
- ``reset-gpu``: the GPU must be reset before anything runs on it again: every cohort with a rank on it is failed,
  no shadow on it is promoted, the node is fenced until the reset is done.
- ``node-service``: the machine needs a reboot or service: as ``reset-gpu``, and the node stays fenced.
- ``none``: nothing to do about the GPU (informational, or a consequence of something that already happened,
  such as Xid 45 after an engine was killed); a rank that died with it is handled as a rank exit.

How the catalog's buckets map (BUCKET_ACTIONS): RESTART_APP -> restart-app; RESET_GPU -> reset-gpu; RESTART_BM,
RESTART_VM, CHECK_MECHANICALS, UPDATE_SWFW, CONTACT_SUPPORT -> node-service; IGNORE -> none. Workflow buckets are
decided per row from the catalog's text (the ``why`` column).
"""

from __future__ import annotations

VERSION = "1 (catalog rows read 2026-11)"

RESTART_APP = "restart-app"
RESET_GPU = "reset-gpu"
NODE_SERVICE = "node-service"
NONE = "none"
ACTIONS = (NONE, RESTART_APP, RESET_GPU, NODE_SERVICE)  # in order of severity

BUCKET_ACTIONS = {
    "RESTART_APP": RESTART_APP, "RESET_GPU": RESET_GPU, "RESTART_BM": NODE_SERVICE, "RESTART_VM": NODE_SERVICE,
    "CHECK_MECHANICALS": NODE_SERVICE, "UPDATE_SWFW": NODE_SERVICE, "CONTACT_SUPPORT": NODE_SERVICE, "IGNORE": NONE,
}

# xid: (mnemonic, the catalog's immediate-action bucket, our action, why where the bucket alone does not say it)
XIDS: dict[int, tuple[str, str, str, str]] = {
    8: ("ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP", RESTART_APP, ""),
    11: ("ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "RESTART_APP", RESTART_APP, ""),
    13: ("ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP", RESTART_APP, ""),
    25: ("ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "RESTART_APP", RESTART_APP, ""),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP", RESTART_APP, ""),
    32: ("ROBUST_CHANNEL_PBDMA_ERROR", "RESTART_APP", RESTART_APP, ""),
    37: ("ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "IGNORE", NONE, ""),
    38: ("ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "IGNORE", NONE, ""),
    39: ("ROBUST_CHANNEL_CE0_ERROR", "RESTART_APP", RESTART_APP, ""),
    40: ("ROBUST_CHANNEL_CE1_ERROR", "RESTART_APP", RESTART_APP, ""),
    41: ("ROBUST_CHANNEL_CE2_ERROR", "RESTART_APP", RESTART_APP, ""),
    43: ("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE", RESTART_APP,
         "the catalog: the application hit a software-induced fault and must terminate; the GPU stays healthy"),
    44: ("ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "IGNORE", NONE, ""),
    45: ("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45", NONE,
         "the catalog: logged when an application is aborted (Control-C, GPU reset, SIGKILL), so also when an engine "
         "is torn down; it follows the Xid that caused it, which is judged on its own"),
    46: ("ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU", RESET_GPU, ""),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", RESET_GPU,
         "the catalog: an uncorrectable (double-bit) ECC error; a GPU reset or node reboot is needed to clear it"),
    54: ("SILENT_RUNNING_PWR_REDUCED_CLOCKING", "CHECK_MECHANICALS", NODE_SERVICE,
         "the catalog: auxiliary power is not connected to the GPU board"),
    60: ("ROBUST_CHANNEL_SEC2_ERROR", "RESTART_APP", RESTART_APP, ""),
    62: ("PMU_HALT_ERROR", "RESET_GPU", RESET_GPU, ""),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE", NONE, "a row remapping event: ECC handled"),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU", RESET_GPU, ""),
    66: ("ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "IGNORE", NONE, ""),
    67: ("ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "IGNORE", NONE, ""),
    68: ("ROBUST_CHANNEL_NVDEC0_ERROR", "RESTART_APP", RESTART_APP, ""),
    69: ("ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP", RESTART_APP, ""),
    74: ("NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", RESET_GPU,
         "the catalog: a GPU reset or node reboot is needed to clear it; the remote end of the link may be the cause"),
    78: ("VGPU_START_ERROR", "UPDATE_SWFW", NODE_SERVICE, ""),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", NODE_SERVICE,
         "the catalog: the GPU is not accessible over PCI Express; restart the machine"),
    80: ("PBDMA_PUSHBUFFER_CRC_MISMATCH", "RESTART_APP", RESTART_APP, ""),
    92: ("EXCESSIVE_SBE_INTERRUPTS", "IGNORE", NONE, "a high single-bit (corrected) ECC error rate"),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP", RESTART_APP,
         "the catalog: contained to one application, which must restart; reset the GPU when convenient"),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU", RESET_GPU,
         "the catalog: affects several applications; the GPU must be reset before applications restart"),
    109: ("ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU", RESET_GPU, ""),
    110: ("SEC_FAULT_ERROR", "RESET_GPU", RESET_GPU, ""),
    119: ("GSP_RPC_TIMEOUT", "RESET_GPU", RESET_GPU, ""),
    120: ("GSP_ERROR", "RESET_GPU", RESET_GPU, ""),
    136: ("ALI_TRAINING_FAIL", "RESET_GPU", RESET_GPU, ""),
    137: ("NVLINK_PRIV_ERR", "IGNORE", NONE, ""),
    140: ("UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU", RESET_GPU, ""),
    143: ("GPU_INIT_ERROR", "RESET_GPU", RESET_GPU, ""),
    144: ("NVLINK_SAW_ERROR", "WORKFLOW_NVLINK5_ERR", RESET_GPU, "an NVLink5 error; treated as one that needs a reset"),
    145: ("NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR", RESET_GPU, "an NVLink5 error; treated as one that needs a reset"),
    146: ("NVLINK_TLW_ERROR", "WORKFLOW_NVLINK5_ERR", RESET_GPU, "an NVLink5 error; treated as one that needs a reset"),
    147: ("NVLINK_TREX_ERROR", "WORKFLOW_NVLINK5_ERR", RESET_GPU, "an NVLink5 error; treated as one that needs a reset"),
    148: ("NVLINK_NVLPW_CTRL_ERROR", "WORKFLOW_NVLINK5_ERR", RESET_GPU,
          "an NVLink5 error; treated as one that needs a reset"),
    149: ("NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR", RESET_GPU, "an NVLink5 error; treated as one that needs a reset"),
    150: ("NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR", RESET_GPU, "an NVLink5 error; treated as one that needs a reset"),
    151: ("ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM", NODE_SERVICE, ""),
    154: ("GPU_RECOVERY_ACTION_CHANGED", "XID_154", NONE,
          "summarises the recovery action another Xid needs; judged from the action it names (RECOVERY_ACTIONS)"),
    155: ("NVLINK_SW_DEFINED_ERROR", "RESET_GPU", RESET_GPU, ""),
    156: ("RESOURCE_RETIREMENT_EVENT", "RESET_GPU", RESET_GPU, ""),
    157: ("RESOURCE_RETIREMENT_FAILURE", "IGNORE", NONE, ""),
    158: ("GPU_FATAL_TIMEOUT", "RESET_GPU", RESET_GPU, ""),
}

# Xid 154's text and NVML's recovery-action event name a recovery action: the catalog's strings ("None", "Drain
# P2P", "Drain and Reset", "GPU Reset Required", "Node Reboot Required") and nvidia-ml-py's
# NVML_GPU_RECOVERY_ACTION_* values (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset; and, in
# nvidia-ml-py 13.615, 5 recover the IMEX domain, 6 bus reset, 7 system reboot: each takes the GPU out of service
# until someone acts, so each fences the node).
RECOVERY_ACTIONS: dict[int, tuple[str, str]] = {
    0: ("None", NONE),
    1: ("GPU Reset Required", RESET_GPU),
    2: ("Node Reboot Required", NODE_SERVICE),
    3: ("Drain P2P", RESET_GPU),
    4: ("Drain and Reset", RESET_GPU),
    5: ("Recover IMEX Domain", NODE_SERVICE),
    6: ("Bus Reset", RESET_GPU),
    7: ("System Reboot", NODE_SERVICE),
}
