"""The Molecule scenarios of the roles (extensions/molecule/<scenario>), one test each, so `make test` runs them.

Every scenario converges preflight plus its role (with what the role needs) on testbed hosts, runs it again for
idempotence and runs its verify playbook (extensions/molecule/README in docs/roles.md). They share one boot of
testbed instance 5 (198.18.5.0/24, three hosts): ``shared_state`` makes the ``default`` scenario create it once
(the first test) and ``--destroy never`` keeps it across the tests; the module's teardown destroys it (testbed
down) and checks that nothing of it is left. Each scenario has its own deployment name and ports, so they never
collide on the shared hosts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator

import pytest

from testbed.instances import load_testbed
from testbed.pytest_fixtures import skip_reason

from .site_helpers import (
    MOLECULE_INSTANCE,
    REPO,
    VENV_BIN,
    PlaybookRun,
    instance_lock,
    run_logged,
    say,
)

# In the order they build up a deployment (molecule's own --all order is alphabetical).
SCENARIOS = ["base", "python_env", "python_env_wheelhouse", "model_cache", "gms_server", "etcd", "nats", "frontend",
             "engine", "agent"]
LOGS = REPO / ".cache" / "molecule" / "logs"
SCENARIO_TIMEOUT_S = 900


def molecule_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOLECULE_", "ANSIBLE_"))}
    env.update(PATH=f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}", NO_COLOR="1", PY_COLORS="0",
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", MOLECULE_NO_LOG="false",
               SHADOWLINE_TESTBED=MOLECULE_INSTANCE)
    return env


def molecule(*args: str, log: Path) -> PlaybookRun:
    """`molecule ARGS` from the repository root (collection mode); its output, with its slowest steps, in
    ``log``."""
    return run_logged([str(VENV_BIN / "molecule"), *args], log, molecule_env(), SCENARIO_TIMEOUT_S)


@pytest.fixture(scope="module")
def molecule_testbed(site_runtime: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, float]]:
    """Starts from no testbed (destroys a leftover one and molecule's shared state), lets the first scenario
    create it, and destroys it after the last one: no process, namespace, mount or cgroup of it may be left."""
    if reason := skip_reason():
        pytest.skip(reason)
    with instance_lock(MOLECULE_INSTANCE):
        yield from _molecule_testbed(request)


def _molecule_testbed(request: pytest.FixtureRequest) -> Iterator[dict[str, float]]:
    LOGS.mkdir(parents=True, exist_ok=True)
    before = molecule("destroy", log=LOGS / "destroy-before.log")
    assert before.returncode == 0, f"molecule destroy (before) failed:\n{before.tail()}"
    timings: dict[str, float] = {}
    yield timings
    destroy = molecule("destroy", log=LOGS / "destroy.log")
    say(request, "molecule scenarios: " + ", ".join(f"{k} {v} s" for k, v in timings.items())
        + f"; destroy {destroy.seconds} s; total {round(sum(timings.values()) + destroy.seconds, 1)} s")
    assert destroy.returncode == 0, f"molecule destroy failed:\n{destroy.tail()}"
    left = load_testbed(MOLECULE_INSTANCE).leaks()
    assert not left, f"testbed instance {MOLECULE_INSTANCE} left things on the machine: {left}"


@pytest.mark.timeout(SCENARIO_TIMEOUT_S + 60)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(molecule_testbed: dict[str, float], scenario: str) -> None:
    run = molecule("test", "--scenario-name", scenario, "--destroy", "never", log=LOGS / f"{scenario}.log")
    molecule_testbed[scenario] = run.seconds
    assert run.returncode == 0, f"molecule test -s {scenario} failed after {run.seconds} s:\n{run.tail(80)}"
    for step in ("converge", "idempotence", "verify"):  # molecule logs "[base > verify] Executed: Successful"
        assert re.search(rf"\[{scenario} > {step}\] Executed: Successful", run.output), \
            f"{scenario}: no successful {step} in {run.log}"
