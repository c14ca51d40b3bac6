"""The Debian packages the hosts need."""

from __future__ import annotations

from .errors import TestbedError
from .helpers import require_root, run
from .names import PACKAGES, REPO_ROOT


def check_packages(slurm: bool) -> None:
    needed = ["systemd", "openssh-server", "iproute2", "util-linux"] + (["slurm-wlm", "munge"] if slurm else [])
    if missing := missing_packages(needed):
        raise TestbedError(f"missing packages {' '.join(missing)}: run `testbed.py install-packages` first")


def missing_packages(packages: list[str]) -> list[str]:
    out = run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Abbrev}\n", *packages], check=False).stdout
    installed = {line.split()[0] for line in out.splitlines() if len(line.split()) > 1 and line.split()[1] == "ii"}
    return [p for p in packages if p not in installed]


def install_packages() -> list[str]:
    """Install what hosts need with scripts/setup-system (which starts no service on the machine)."""
    require_root()
    missing = missing_packages(PACKAGES)
    if missing:
        run([str(REPO_ROOT / "scripts" / "setup-system")], stdout=None, stderr=None)
    return missing
