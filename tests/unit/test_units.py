"""systemd units rendered from the plan: the plan's argv verbatim, hardening, and systemd-analyze verify."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from shadowline.deployment import units
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan import Plan, build_plan

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
