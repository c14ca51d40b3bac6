"""The machine's mount table, and unmounting what the testbed mounted under its state directory."""

from __future__ import annotations

from pathlib import Path

from .helpers import run
from .names import STATE_ROOT


def is_mountpoint(path: Path) -> bool:
    return any(mountpoint == str(path) for mountpoint in mountpoints())


def mountpoints() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        points.append(line.split()[4].replace("\\040", " "))
    return points


def testbed_mounts() -> list[str]:
    root = str(STATE_ROOT)
    return [m for m in mountpoints() if m == root or m.startswith(root + "/")]


def unmount_all() -> None:
    for point in sorted(testbed_mounts(), key=lambda m: m.count("/"), reverse=True):
        if run(["umount", point], check=False).returncode != 0:
            run(["umount", "-l", point])
