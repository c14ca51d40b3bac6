"""The testbed's state and its journal on disk: written before anything is created, read by down() and by
every later command; one operation at a time (flock)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

from .errors import TestbedError
from .names import JOURNAL, LOCK_FILE, NAME_PREFIX, PREFIX, STATE_ROOT


@dataclasses.dataclass
class Host:
    name: str
    index: int
    address: str
    pid: int | None = None
    launcher_pid: int | None = None

    @property
    def netns(self) -> str:
        return f"{NAME_PREFIX}{self.name}"

    @property
    def veth(self) -> str:
        return f"{NAME_PREFIX}{self.name}"

    @property
    def dir(self) -> Path:
        return STATE_ROOT / self.name


@dataclasses.dataclass
class State:
    nodes: int
    slurm: bool
    hosts: list[Host]
    replicas: int = 1  # the deployment the inventory describes: this many replicas of nodes/replicas hosts each
    spares: int = 0  # the last hosts, the inventory's spare nodes (gms_spares); the replicas are of the others
    boot_seconds: float | None = None
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds since the start of up
    run_netns_created: bool = False  # by our `ip netns add`: down() removes /run/netns again
    run_netns_mounted: bool = False

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise TestbedError(f"no host {name!r} in the testbed (hosts: {', '.join(h.name for h in self.hosts)})")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> State:
        hosts = [Host(**h) for h in data.pop("hosts")]
        return cls(hosts=hosts, **data)


def plan(nodes: int, slurm: bool) -> State:
    hosts = [Host(name=f"node{i}", index=i, address=f"{PREFIX}.{10 + i}") for i in range(nodes)]
    return State(nodes=nodes, slurm=slurm, hosts=hosts)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def save_journal(state: State) -> None:
    """Record what exists (or is about to): down() reads this, and discovers by name whatever it misses."""
    write_json_atomic(JOURNAL, state.to_json())


def load_journal() -> State | None:
    try:
        return State.from_json(json.loads(JOURNAL.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError) as exc:
        print(f"testbed: ignoring unreadable {JOURNAL}: {exc}", file=sys.stderr)
        return None


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """One testbed operation at a time on this machine."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
