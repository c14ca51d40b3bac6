"""systemd units rendered from the plan: the plan's argv verbatim, hardening, and systemd-analyze verify."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from shadowline.deployment import units
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan import Plan
from shadowline.deployment.plan_builder import build_plan

from .helpers import hostvars


def typed_plan(**shared) -> Plan:
    shared.setdefault("gms_engine", {"tensor_parallel_size": 16})
    hv, hosts = hostvars(2, gms_python="/usr/bin/python3", gms_service_user="root", **shared)
    contract, problems = parse_contract(hv, hosts)
    assert not problems
    return build_plan(contract)


def test_quoting_keeps_specifiers_and_variables_literal():
    assert units.systemd_quote("--x=%h") == "--x=%%h"
    assert units.systemd_quote("$HOME") == "$$HOME"
    assert units.systemd_quote('{"a": 1}') == '"{\\"a\\": 1}"'
    assert units.environment_lines({"A": 'x "y" 50%'}) == ['Environment="A=x \\"y\\" 50%%"']


def test_engine_dropin_runs_the_plan_verbatim():
    plan = typed_plan(gms_engine={"tensor_parallel_size": 16, "extra_args": ["--override", '{"k": "v w"}']})
    text = units.engine_dropin(plan, "node1", 1)
    argv = plan.cohort(1).rank_on("node1").process.argv
    assert units.exec_start(argv) in text
    assert 'Environment="ENGINE_ID=1"' in text and 'Environment="DYN_SYSTEM_PORT=8081"' in text
    assert text.splitlines()[-1].endswith('"{\\"k\\": \\"v w\\"}"')


def test_engine_template_never_restarts_and_kills_the_whole_group():
    text = units.engine_template(typed_plan())
    for line in ("Restart=no", "KillMode=control-group", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "PrivateTmp=yes", "User=root", "ReadWritePaths=/run/shadowline/llama/gms /var/lib/shadowline/llama/engines"):
        assert line in text.splitlines()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is part of systemd")
def test_every_rendered_unit_passes_systemd_analyze_verify(tmp_path: Path):
    plan = typed_plan()
    files = {
        plan.unit_name("gms"): units.gms_unit(plan, "node0"),
        plan.unit_name("frontend"): units.frontend_unit(plan),
        plan.unit_name("engine"): units.engine_template(plan),
    }
    for binary, kind, render in (("/usr/bin/etcd", "etcd", units.etcd_unit), ("/usr/sbin/nats-server", "nats", units.nats_unit)):
        assert os.path.exists(binary), f"{binary} missing: make setup installs it"
        files[plan.unit_name(kind)] = render(plan, "node0")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    for cohort in (0, 1):
        dropin = tmp_path / f"{plan.unit_name('engine', cohort)}.d"
        dropin.mkdir()
        (dropin / "plan.conf").write_text(units.engine_dropin(plan, "node1", cohort))
    names = [n for n in files if n != plan.unit_name("engine")] + [plan.unit_name("engine", c) for c in (0, 1)]
    result = subprocess.run(["systemd-analyze", "verify", *names], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"}, check=False)
    assert result.returncode == 0, result.stderr
    assert "ExecStart" not in result.stderr, result.stderr


def test_the_agent_is_restarted_however_often_it_fails():
    plan = typed_plan()
    lines = units.agent_unit(plan, "node0").splitlines()
    unit_section = lines[:lines.index("[Service]")]
    assert "StartLimitIntervalSec=0" in unit_section and "Restart=always" in lines
    assert "RestartPreventExitStatus=3" in lines  # a second agent on the node (the lock is held) stays down


def test_the_gms_server_makes_its_residencys_socket_directory_its_users():
    """Each model revision's GMS server makes its socket directory below gms_socket_dir, owned by the service user
    also in container mode, where the unit's commands run as root and the server as the service user."""
    plan = typed_plan()
    lines = units.gms_unit(plan, "node0").splitlines()
    assert f"ExecStartPre=/usr/bin/install -d -o root -g root -m 0750 {plan.gms_dir}" in lines
    assert f'Environment="GMS_SOCKET_DIR={plan.gms_dir}"' in lines
    assert plan.unit_name("gms") == f"shadowline-{plan.deployment}-gms@{plan.revision[:12]}.service"


# -- a failover lock outside the socket directory (issue #42) ------------------------------------------------- #

def read_write_paths(text: str) -> set[str]:
    return {word for line in text.splitlines() if line.startswith("ReadWritePaths=")
            for word in line.split("=", 1)[1].split()}


def test_the_units_that_open_the_lock_may_write_its_directory_and_the_base_role_makes_it():
    """gms_lock_path outside gms_socket_dir: under ProtectSystem=strict the engines (a leader takes the lock) and
    the agent (it bridges the lock) open it O_CREAT|O_RDWR, so its directory is in their ReadWritePaths (only where
    not writable already), and the base role makes it the service user's, marked, kept across reboots."""
    from shadowline.deployment.directories import deployment_directories, removable_directories, tmpfiles_text

    default = typed_plan()
    assert default.lock_dir == default.socket_dir  # nothing more by default
    assert read_write_paths(units.engine_template(default)) == {default.socket_dir, default.engines_dir}
    assert read_write_paths(units.agent_unit(default, "node0")) == {default.state_dir, default.socket_dir}
    assert [d["path"] for d in deployment_directories(default)].count(default.socket_dir) == 1

    plan = typed_plan(gms_lock_path="/srv/shadowline/llama/failover.lock")
    assert read_write_paths(units.engine_template(plan)) == {plan.socket_dir, plan.engines_dir, "/srv/shadowline/llama"}
    assert read_write_paths(units.agent_unit(plan, "node0")) == {plan.state_dir, plan.socket_dir,
                                                                 "/srv/shadowline/llama"}
    assert "/srv/shadowline/llama" not in read_write_paths(units.gms_unit(plan, "node0"))  # the GMS server: no lock
    made = deployment_directories(plan)
    assert made[-1] == {"path": "/srv/shadowline/llama", "owner": "root", "group": "root", "mode": "0750",
                        "mark": True}  # typed_plan's service user is root
    assert {"path": "/srv/shadowline/llama"} in removable_directories(plan)  # only if it carries the marker
    assert "d /srv/shadowline/llama 0750 root root -" in tmpfiles_text(plan, []).splitlines()

    # below the state directory: the agent may write it already, the engines may not
    nested = typed_plan(gms_lock_path="/var/lib/shadowline/llama/lock/failover.lock")
    assert read_write_paths(units.agent_unit(nested, "node0")) == {nested.state_dir, nested.socket_dir}
    assert "/var/lib/shadowline/llama/lock" in read_write_paths(units.engine_template(nested))
    assert deployment_directories(nested)[-1]["path"] == "/var/lib/shadowline/llama/lock"


def test_an_engine_container_sees_a_lock_outside_the_socket_directory():
    from .test_container import plan_of

    plan = plan_of(gms_container={"runtime": "runc"}, gms_lock_path="/srv/shadowline/llama/failover.lock")
    exec_line = next(line for line in units.engine_dropin(plan, "node1", 1).splitlines()
                     if line.startswith("ExecStart="))
    assert " --volume /srv/shadowline/llama:/srv/shadowline/llama:rw " in exec_line
    default = plan_of(gms_container={"runtime": "runc"})
    assert units.engine_dropin(default, "node1", 1).count(f"--volume {default.socket_dir}:") == 1


@pytest.mark.parametrize("lock_path", ["/run/failover.lock", "/var/lib/failover.lock", "/etc/systemd/failover.lock"])
def test_a_lock_directly_in_a_system_directory_is_refused(lock_path):
    """The base role would make that directory the service user's, and the units could write all of it."""
    hv, hosts = hostvars(2, gms_python="/usr/bin/python3", gms_engine={"tensor_parallel_size": 16},
                         gms_lock_path=lock_path)
    contract, problems = parse_contract(hv, hosts)
    assert contract is None and [p.field for p in problems] == ["gms_lock_path"], problems
    assert "a system directory" in problems[0].message and "/run/shadowline/" in problems[0].fix
