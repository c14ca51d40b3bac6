"""The `shadowline` command, run from an installed copy of the package (pip install --target), as a user has it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan_builder import build_plan
from shadowline.drill.report import compute_report

from .helpers import hostvars

ROOT = Path(__file__).resolve().parents[2]
SUBCOMMANDS = ["plan", "render-slurm", "drill-report", "status", "pause", "resume", "failover", "switchover", "history",
               "completion"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built from a copy of the checkout and installed into a directory of its own."""
    tmp = tmp_path_factory.mktemp("cli")
    source = tmp / "src"
    (source / "plugins").mkdir(parents=True)
    shutil.copytree(ROOT / "plugins" / "module_utils", source / "plugins" / "module_utils",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    target = tmp / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                           "--target", str(target), str(source)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (target / "bin" / "shadowline").exists()
    return target


def shadowline(installed: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(installed)}  # the installed copy only, not the checkout
    return subprocess.run([str(installed / "bin" / "shadowline"), *args], capture_output=True, text=True,
                          env=env, cwd=cwd or installed, timeout=120, check=False)


def test_help_of_the_command_and_of_every_subcommand(installed: Path):
    top = shadowline(installed, "--help")
    assert top.returncode == 0, top.stderr
    for name in SUBCOMMANDS:
        assert name in top.stdout
    for name in SUBCOMMANDS:
        sub = shadowline(installed, name, "--help")
        assert sub.returncode == 0, sub.stderr
        assert sub.stdout.startswith(f"usage: shadowline {name}"), sub.stdout
    located = shadowline(installed, "plan", "--help")
    assert "no host is contacted" in located.stdout
    assert shadowline(installed, "nonsense").returncode == 2


def test_the_installed_copy_is_the_one_that_runs(installed: Path):
    code = "import shadowline.cli, sys; print(shadowline.cli.__file__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(installed)}, cwd=installed, check=False)
    assert proc.stdout.startswith(str(installed)), proc.stdout


def test_bash_completion_is_valid_bash_and_knows_the_subcommands(installed: Path, tmp_path: Path):
    proc = shadowline(installed, "completion", "bash")
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "shadowline.bash"
    script.write_text(proc.stdout)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    probe = (f'source {script}; COMP_WORDS=(shadowline dr); COMP_CWORD=1; _shadowline; echo "${{COMPREPLY[@]}}"; '
             f'COMP_WORDS=(shadowline plan --j); COMP_CWORD=2; _shadowline; echo "${{COMPREPLY[@]}}"')
    lines = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=False).stdout.splitlines()
    assert lines == ["drill-report", "--json"], lines


def test_drill_report_prints_the_table_and_draws_the_timeline(installed: Path, tmp_path: Path):
    evidence = json.loads((ROOT / "tests" / "unit" / "data" / "drills" / "kill-leader.json").read_text())
    report = compute_report(evidence)
    report["evidence"] = evidence  # what playbooks/drill.yml writes with -e drill_report=PATH
    path = tmp_path / "kill-leader.json"
    path.write_text(json.dumps(report))
    proc = shadowline(installed, "drill-report", str(path))
    assert proc.returncode == (0 if report["passed"] else 1), proc.stderr
    assert "promot" in proc.stdout.lower()
    svg = tmp_path / "kill-leader.svg"
    assert svg.read_text().startswith("<svg") and f"timeline: {svg}" in proc.stdout
    assert shadowline(installed, "drill-report", str(tmp_path / "missing.json")).returncode != 0


def test_status_of_this_node_from_a_plan_file(installed: Path, tmp_path: Path):
    """Nothing of the deployment runs on this machine: every rank is reported dead, none holds the lock."""
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16}, gms_deployment="clitest")
    contract, problems = parse_contract(hv, hosts)
    assert contract is not None, problems
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(build_plan(contract).to_dict()))
    proc = shadowline(installed, "status", "--plan", str(plan), "--host", "node0")
    assert proc.returncode == 1, "every rank dead: the exit status says the deployment is not whole"
    rows = [line for line in proc.stdout.splitlines() if "node0" in line]
    assert len(rows) == 2 and all("dead" in row for row in rows), proc.stdout
    wrong = shadowline(installed, "status", "--plan", str(plan), "--host", "node9")
    assert wrong.returncode == 1 and "--host node9 is not a node of deployment clitest" in wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_bad_inputs_get_a_message_naming_them_never_a_traceback(installed: Path, tmp_path: Path):
    not_a_report = tmp_path / "not-a-report.json"
    not_a_report.write_text('{"fault": "kill-leader"}')
    not_json = tmp_path / "plan.json"
    not_json.write_text("nonsense")
    cases = {
        ("drill-report", str(not_a_report)): "is not a drill report",
        ("drill-report", str(tmp_path / "missing.json")): "cannot read",
        ("status", "--plan", str(tmp_path / "missing.json")): "cannot read the plan",
        ("status", "--plan", str(not_json)): "is not a shadowline plan.json",
    }
    for argv, said in cases.items():
        proc = shadowline(installed, *argv)
        assert proc.returncode == 1 and said in proc.stderr and "Traceback" not in proc.stderr, (argv, proc.stderr)


def test_version(installed: Path):
    proc = shadowline(installed, "--version")
    version = next(line.split('"')[1] for line in (ROOT / "pyproject.toml").read_text().splitlines()
                   if line.startswith("version ="))
    assert proc.returncode == 0 and proc.stdout.strip() == f"shadowline {version}", proc.stdout


def test_plan_and_render_slurm_from_the_checkout_scripts():
    """scripts/show-plan and slurm/render are the same command (they call shadowline.cli)."""
    for inventory in (["inventories/local"], ["-i", "inventories/local"]):  # -i as every other command takes it
        show = subprocess.run([sys.executable, str(ROOT / "scripts" / "show-plan"), *inventory],
                              capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
        assert show.returncode == 0, show.stderr
        assert show.stdout.startswith("deployment local: backend standin")
    assert "monitoring: server on local0 (Prometheus http://127.0.0.1:9090)" in show.stdout
    render = subprocess.run([sys.executable, str(ROOT / "slurm" / "render"), "--help"], capture_output=True,
                            text=True, timeout=60, check=False)
    assert render.returncode == 0 and "--vars-json" in render.stdout


def test_status_through_ansible_prints_a_plain_table():
    """`shadowline status -i` (what `make status` runs): playbooks/status.yml on this machine (inventories/local,
    nothing deployed here), its table printed as a person reads it, without JSON quoting."""
    proc = subprocess.run([sys.executable, "-m", "shadowline.cli", "status", "-i", "inventories/local"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "plugins" / "module_utils")}, check=False)
    assert proc.returncode == 1, "nothing runs here: not whole\n" + proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["cohort", "role", "node"] and set(lines[1]) <= {"-", " "}
    assert [line.split()[:6] for line in lines[2:4]] == [["0", "primary", "local0", "0", "-", "dead"],
                                                         ["1", "shadow", "local0", "0", "-", "dead"]]
    assert lines[-2] == "lock holder: none (no cohort is serving)" and '"' not in proc.stdout
    assert lines[-1].startswith("failover: unknown (etcd does not answer"), "no etcd here: what failover is, unknown"


# -- status as data, zsh completion, render-slurm installed, bad input (issue #42) ------------------------------ #

def plan_file(tmp_path: Path) -> Path:
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16}, gms_deployment="clitest")
    contract, problems = parse_contract(hv, hosts)
    assert contract is not None, problems
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(build_plan(contract).to_dict()))
    return plan


def test_status_as_json_and_yaml_holds_what_the_table_shows(installed: Path, tmp_path: Path):
    import yaml

    from shadowline.cluster.status_table import status_document, table_rows
    plan = plan_file(tmp_path)
    table = shadowline(installed, "status", "--plan", str(plan), "--host", "node0")
    as_json = shadowline(installed, "status", "--plan", str(plan), "--host", "node0", "-o", "json")
    as_yaml = shadowline(installed, "status", "--plan", str(plan), "--host", "node0", "--output", "yaml")
    assert table.returncode == as_json.returncode == as_yaml.returncode == 1, "not whole, whatever the format"
    data = json.loads(as_json.stdout)
    assert yaml.safe_load(as_yaml.stdout) == data
    assert data == status_document(*table_rows(table.stdout.splitlines()))
    assert data["lock_holder"] is None and data["whole"] is False and len(data["ranks"]) == 2
    first = data["ranks"][0]
    assert set(first) == {"cohort", "role", "node", "rank", "pid", "state", "holder", "ports", "model"}
    assert (first["node"], first["state"], first["pid"], first["holder"]) == ("node0", "dead", None, False)
    assert all(isinstance(port, int) for port in first["ports"].values()), first["ports"]


def test_status_yaml_without_pyyaml_is_a_clear_error(installed: Path, tmp_path: Path):
    no_yaml = tmp_path / "no-yaml"
    (no_yaml / "yaml").mkdir(parents=True)
    (no_yaml / "yaml" / "__init__.py").write_text("raise ImportError('no PyYAML here')\n")
    env = {**os.environ, "PYTHONPATH": f"{no_yaml}:{installed}"}
    proc = subprocess.run([str(installed / "bin" / "shadowline"), "status", "--plan", str(plan_file(tmp_path)),
                           "-o", "yaml"], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout
    assert "-o yaml needs PyYAML" in proc.stderr and "-o json" in proc.stderr and "Traceback" not in proc.stderr


def test_the_table_reads_back_as_the_rows_it_printed():
    from shadowline.cluster.status_table import render_status_table, status_document, status_rows, table_rows
    ports = {"master": 29500, "system": 9345, "nixl": 5600}
    ranks = [{"cohort": 0, "role": "primary", "host": "n0", "rank": 0, "pid": 4242, "state": "active", "leader": True,
              "ports": ports},
             {"cohort": 0, "role": "primary", "host": "n1", "rank": 1, "pid": None, "state": "running",
              "leader": False, "ports": ports},
             {"cohort": 1, "role": "shadow", "host": "n0", "rank": 0, "pid": 77, "state": "parked", "leader": True,
              "ports": ports}]
    rows = status_rows(ranks, "engine-0", "m@0123456789ab")
    assert table_rows(render_status_table(ranks, "engine-0", "m@0123456789ab").splitlines()) == (rows, "engine-0")
    data = status_document(rows, "engine-0")
    assert [r["holder"] for r in data["ranks"]] == [True, False, False]
    assert [r["pid"] for r in data["ranks"]] == [4242, None, 77]
    assert data["whole"] is True and data["lock_holder"] == "engine-0"
    assert table_rows(["PLAY [x]", "ok: [n0]"]) == ([], None)


def test_a_fleets_table_has_a_replica_column_and_a_line_per_replica_and_reads_back():
    from shadowline.cluster.status_table import (
        render_status_table,
        status_document,
        status_rows,
        table_rows,
        table_states,
    )
    ports = {"master": 29500, "system": 8080, "nixl": 8280}

    def rank(replica: int, cohort: int, host: str, node_rank: int, state: str) -> dict:
        return {"replica": replica, "cohort": cohort, "role": "primary" if cohort == 0 else "shadow", "host": host,
                "rank": node_rank, "pid": 10 + node_rank, "state": state, "leader": node_rank == 0, "ports": ports}

    ranks = [rank(1, 0, "node2", 0, "parked"), rank(0, 0, "node0", 0, "active"), rank(0, 1, "node0", 0, "parked"),
             rank(1, 1, "node2", 0, "active"), rank(0, 0, "node1", 1, "running"), rank(1, 0, "node3", 1, "dead")]
    holders = {0: "engine-0", 1: "engine-1"}
    lines = render_status_table(ranks, holders, "m@0123456789ab").splitlines()
    assert lines[0].split()[:3] == ["replica", "cohort", "role"]
    assert [line.split()[:3] for line in lines[2:8]] == [
        ["0", "0", "primary"], ["0", "0", "primary"], ["0", "1", "shadow"], ["1", "0", "primary"],
        ["1", "0", "primary"], ["1", "1", "shadow"]]
    assert lines[8:] == ["replica 0: lock holder engine-0; 3 of 3 ranks healthy",
                         "replica 1: lock holder engine-1; 2 of 3 ranks healthy"]
    rows, _holder = table_rows(lines)
    assert rows == status_rows(ranks, holders, "m@0123456789ab")
    assert table_states(lines) == ["active", "running", "parked", "parked", "dead", "active"]
    data = status_document(rows, None)
    assert [(r["replica"], r["cohort"], r["node"], r["holder"]) for r in data["ranks"]] == [
        (0, 0, "node0", True), (0, 0, "node1", False), (0, 1, "node0", False), (1, 0, "node2", False),
        (1, 0, "node3", False), (1, 1, "node2", True)]
    assert data["whole"] is False
    one = [dict(r, replica=0) for r in ranks if r["replica"] == 0]
    assert render_status_table(one, "engine-0", "m").splitlines()[0].startswith("cohort")  # one replica: as before


def test_zsh_completion_knows_the_subcommands_options_and_choices(installed: Path, tmp_path: Path):
    proc = shadowline(installed, "completion", "zsh")
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    assert script.startswith("#compdef shadowline\n")
    for name in SUBCOMMANDS:
        assert f"'{name}:" in script and f"({name}) opts=(" in script, name
    assert "--json" in script.split("(plan) opts=(")[1].split(")")[0]
    assert "compadd -- table json yaml" in script and "words_of=(bash zsh)" in script
    assert "compdef _shadowline shadowline" in script
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.skip("zsh is not installed here: the script's text is checked, not run")
    path = tmp_path / "_shadowline"
    path.write_text(script)
    assert subprocess.run([zsh, "-n", str(path)], check=False).returncode == 0
    probe = (f"source {path}; compadd() {{ shift; print -r -- \"$*\" }}; _describe() {{ print -r -- described }}; "
             "_files() { print -r -- files }; "
             "words=(shadowline status -o ''); CURRENT=4; PREFIX=''; _shadowline; "
             "words=(shadowline plan --j); CURRENT=3; PREFIX=--j; _shadowline")
    lines = subprocess.run([zsh, "-f", "-c", probe], capture_output=True, text=True, check=False).stdout.splitlines()
    assert lines[0] == "table json yaml" and "--json" in lines[1], lines


def test_bash_completion_offers_the_values_of_choices(installed: Path, tmp_path: Path):
    script = tmp_path / "shadowline.bash"
    script.write_text(shadowline(installed, "completion", "bash").stdout)
    probe = (f'source {script}; COMP_WORDS=(shadowline status -o y); COMP_CWORD=3; _shadowline; '
             'echo "${COMPREPLY[@]}"; COMP_WORDS=(shadowline completion ""); COMP_CWORD=2; _shadowline; '
             'echo "${COMPREPLY[@]}"')
    lines = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=False).stdout.splitlines()
    assert lines == ["yaml", "bash zsh"], lines


def test_render_slurm_from_the_installed_copy(installed: Path, tmp_path: Path):
    """The job template is package data: an installed shadowline renders without a checkout."""
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16}, gms_deployment="clitest")
    shared = {k: v for k, v in hv[hosts[0]].items() if k.startswith("gms_") and k != "gms_node_rank"}
    (tmp_path / "vars.json").write_text(json.dumps(shared))
    assert (installed / "shadowline" / "slurm" / "job.sbatch.j2").is_file()
    proc = shadowline(installed, "render-slurm", "--vars-json", str(tmp_path / "vars.json"), "--hosts", "2",
                      "--out-dir", str(tmp_path / "jobs"))
    assert proc.returncode == 0, proc.stderr
    written = Path(json.loads(proc.stdout.splitlines()[-1])["path"])
    assert written.read_text().startswith("#!/bin/bash") and "#SBATCH" in written.read_text()


def test_more_bad_inputs_get_a_message_never_a_traceback(installed: Path, tmp_path: Path):
    not_json = tmp_path / "broken.json"
    not_json.write_text('{"gms_deployment": ')
    a_list = tmp_path / "list.json"
    a_list.write_text("[]")
    not_yaml = tmp_path / "inventory.yml"
    not_yaml.write_text("all: [unclosed\n")
    cases = {
        ("render-slurm", "--vars-json", str(tmp_path / "missing.json")): (1, "cannot read the variables"),
        ("render-slurm", "--vars-json", str(not_json)): (1, "cannot read the variables"),
        ("render-slurm", "--vars-json", str(a_list)): (1, "is not a JSON object"),
        ("render-slurm", "-i", str(tmp_path / "missing"), "--no-ansible"): (1, "cannot read the inventory"),
        ("render-slurm", "-i", str(not_yaml), "--no-ansible"): (1, "cannot read the inventory"),
        ("status",): (1, "give -i INVENTORY or --plan"),
        ("status", "--plan", str(not_json), "-o", "json"): (1, "is not a shadowline plan.json"),
        ("status", "-o", "xml"): (2, "invalid choice: 'xml'"),
        ("completion", "fish"): (2, "invalid choice: 'fish'"),
        ("completion",): (2, "the following arguments are required"),
        ("plan",): (1, "give -i INVENTORY"),
    }
    evidence = json.loads((ROOT / "tests" / "unit" / "data" / "drills" / "kill-leader.json").read_text())
    report = tmp_path / "report.json"
    report.write_text(json.dumps({**compute_report(evidence), "evidence": evidence}))
    cases[("drill-report", str(report), "--svg", str(tmp_path / "no" / "such" / "x.svg"))] = (
        1, "cannot write the timeline")
    for argv, (code, said) in cases.items():
        proc = shadowline(installed, *argv, cwd=tmp_path)
        assert proc.returncode == code and said in proc.stderr and "Traceback" not in proc.stderr, (argv, proc.stderr)


def test_plan_of_an_inventory_without_nodes_says_what_preflight_says(installed: Path, tmp_path: Path):
    """`shadowline plan -i` of an inventory whose gms_nodes group is misnamed or empty: preflight's own refusal
    (contract.missing_group_problem, which the group_problem filter prints), one line, status 1, no traceback."""
    from shadowline.deployment.contract import missing_group_problem

    inventories = {
        "misnamed.yml": ("all:\n  children:\n    gms_node:\n      hosts:\n        a: {gms_node_rank: 0}\n",
                         {"gms_node": ["a"]}, "Fix: did you mean gms_node?"),
        "empty.yml": ("all:\n  hosts:\n    b: {}\n  children:\n    gms_nodes: {}\n", {"ungrouped": ["b"]},
                      "Hosts in no group: b."),
    }
    for name, (text, groups, said) in inventories.items():
        (tmp_path / name).write_text(text)
        proc = shadowline(installed, "plan", "-i", str(tmp_path / name), cwd=tmp_path)
        expected = f"shadowline plan: {missing_group_problem('gms_nodes', groups)}"
        assert proc.returncode == 1 and proc.stdout == "" and proc.stderr == expected + "\n", (name, proc.stderr)
        assert said in proc.stderr
