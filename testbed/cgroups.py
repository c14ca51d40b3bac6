"""Every host's cgroup on every hierarchy of the machine: made before boot, measured, removed at teardown."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path

from .names import CGROUP_MOUNT, CGROUP_PARENT


def in_testbed_cgroup(pid: int) -> bool:
    try:
        return f"/{CGROUP_PARENT}/" in Path(f"/proc/{pid}/cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def hierarchies() -> list[Path]:
    """Every cgroup mount of the machine: the v1 controllers, name=systemd and the cgroup2 mount."""
    return sorted(p for p in CGROUP_MOUNT.iterdir()
                  if p.is_dir() and not p.is_symlink() and (p / "cgroup.procs").exists())


def host_cgroups(name: str) -> list[Path]:
    return [h / CGROUP_PARENT / name for h in hierarchies()]


def make_host_cgroups(name: str) -> None:
    for hierarchy in hierarchies():
        for path in (hierarchy / CGROUP_PARENT, hierarchy / CGROUP_PARENT / name):
            path.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":  # a cpuset cgroup takes no task until it has cpus and mems
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    if not (path / knob).read_text().strip():
                        (path / knob).write_text((path.parent / knob).read_text())


def enter_host_cgroups(name: str) -> None:
    """preexec_fn: the launcher moves itself into the host's cgroups before unshare makes them its ns root."""
    pid = str(os.getpid())
    for path in host_cgroups(name):
        (path / "cgroup.procs").write_text(pid)


def testbed_cgroup_dirs() -> list[Path]:
    """All cgroup directories of the testbed, deepest first."""
    found: list[Path] = []
    for hierarchy in hierarchies():
        top = hierarchy / CGROUP_PARENT
        if top.is_dir():
            found.extend(Path(d) for d, _dirs, _files in os.walk(top))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def cgroup_pids(dirs: list[Path]) -> set[int]:
    pids: set[int] = set()
    for path in dirs:
        with contextlib.suppress(FileNotFoundError, OSError):
            pids.update(int(line) for line in (path / "cgroup.procs").read_text().split() if line != "0")
    return pids


def memory_usage(name: str) -> int | None:
    path = CGROUP_MOUNT / "memory" / CGROUP_PARENT / name / "memory.usage_in_bytes"
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def remove_cgroups() -> list[str]:
    """rmdir every testbed cgroup, deepest first; returns the ones that would not go."""
    stuck: list[str] = []
    for path in testbed_cgroup_dirs():
        for attempt in range(50):
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or attempt == 49:
                    stuck.append(f"{path}: {exc.strerror}")
                    break
                time.sleep(0.02)
    return stuck
