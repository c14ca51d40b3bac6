"""The collection as a user gets it (issue #42): built into a tarball, installed with ansible-galaxy into a scratch
path, and run by FQCN from a directory outside the checkout, with none of the checkout's configuration in effect
(ANSIBLE_CONFIG is an empty file, ANSIBLE_COLLECTIONS_PATH the scratch path alone). shadowline.gms.slurm_render
writes a batch script from the installed slurm-pyxis example; shadowline.gms.preflight passes the installed local
example (the local connection, as tests/preflight does) and refuses it broken, naming the field or the group."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
# What only development uses (galaxy.yml build_ignore); none of it may be installed.
DEV_ONLY = ("testbed", "scripts", "extensions", "monitoring", "inventories/testbed", ".ci", ".ansible-lint", "Makefile",
            "requirements/dev.in", "requirements/dev.lock", "requirements/bench-client.txt", "tests/unit",
            "tests/e2e", "tests/preflight", "tests/testbed", "tests/conftest.py", ".venv", ".runtime", "build",
            "collections", "changelogs/fragments", ".git")
# Ports of no default: the good inventory passes while a deployment with the default ports runs on this machine.
PORTS = {"frontend": 38000, "master_base": 38100, "master_stride": 100, "system_base": 38080, "nixl_base": 38280,
         "etcd_client": 38379, "etcd_peer": 38380, "etcd_proxy": 38390, "nats": 38422, "nats_monitor": 38822,
         "nats_cluster": 38622, "agent_metrics": 38480}


@dataclass
class Installed:
    scratch: Path  # outside the checkout: the cwd of every run
    collection: Path  # <scratch>/collections/ansible_collections/shadowline/gms
    env: dict[str, str]
    version: str


def run(installed: Installed, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=installed.scratch, env=installed.env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    scratch = tmp_path_factory.mktemp("installed").resolve()
    assert not scratch.is_relative_to(ROOT), scratch
    version = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
    build = subprocess.run([BIN / "ansible-galaxy", "collection", "build", "--force", "--output-path",
                            scratch / "build", "."], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    (scratch / "empty.cfg").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
    env.update(PATH=f"{BIN}:{env['PATH']}", ANSIBLE_CONFIG=str(scratch / "empty.cfg"),
               ANSIBLE_COLLECTIONS_PATH=str(scratch / "collections"), ANSIBLE_HOME=str(scratch / "ansible-home"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", PYTHONWARNINGS="ignore")
    collection = scratch / "collections" / "ansible_collections" / "shadowline" / "gms"
    result = Installed(scratch, collection, env, version)
    install = run(result, "ansible-galaxy", "collection", "install",
                  str(scratch / "build" / f"shadowline-gms-{version}.tar.gz"), "-p", str(scratch / "collections"))
    assert install.returncode == 0, install.stdout + install.stderr
    assert f"shadowline.gms:{version} was installed successfully" in install.stdout, install.stdout
    return result


def test_ansible_finds_the_installed_collection_and_it_has_no_dev_only_path(installed: Installed):
    listed = run(installed, "ansible-galaxy", "collection", "list", "shadowline.gms", "--format", "json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert json.loads(listed.stdout) == {
        str(installed.scratch / "collections" / "ansible_collections"): {"shadowline.gms": {"version": installed.version}}
    }, listed.stdout
    manifest = json.loads((installed.collection / "MANIFEST.json").read_text())
    assert manifest["collection_info"]["version"] == installed.version
    present = [p for p in DEV_ONLY if (installed.collection / p).exists()]
    assert not present, f"dev-only paths installed (galaxy.yml build_ignore): {present}"
    assert sorted(p.name for p in (installed.collection / "tests").iterdir()) == ["sanity"]
    for needed in ("playbooks/slurm_render.yml", "playbooks/preflight.yml", "slurm/render", "inventories/local",
                   "inventories/examples/slurm-pyxis", "CHANGELOG.md", "LICENSE"):
        assert (installed.collection / needed).exists(), f"{needed}: not installed"


def local_inventory(installed: Installed, where: Path, deployment: str) -> Path:
    """The installed local example (one node, local connection, the stand-in backend), a deployment name and
    ports of its own."""
    shutil.copytree(installed.collection / "inventories" / "local", where)
    group_vars = where / "group_vars" / "gms_nodes.yml"
    variables = yaml.safe_load(group_vars.read_text())
    assert variables["gms_engine"]["backend"] == "standin", "the local example is not the stand-in any more"
    variables.update(gms_deployment=deployment, gms_ports=PORTS)
    group_vars.write_text(yaml.safe_dump(variables))
    return where


def break_field(inventory: Path) -> list[str]:
    group_vars = inventory / "group_vars" / "gms_nodes.yml"
    variables = yaml.safe_load(group_vars.read_text())
    variables["gms_engine"]["tensor_parallel_size"] = "eight"
    group_vars.write_text(yaml.safe_dump(variables))
    return ["gms_engine.tensor_parallel_size: must be a whole number, got the string 'eight'. "
            "Fix: set gms_engine.tensor_parallel_size to a whole number such as 8.",
            "nothing was changed on any host"]


def break_group(inventory: Path) -> list[str]:
    hosts = inventory / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("gms_nodes:", "gms_node:"))
    (inventory / "group_vars" / "gms_nodes.yml").rename(inventory / "group_vars" / "gms_node.yml")
    return ["gms_nodes: the group is empty or missing from the inventory",
            "Fix: did you mean gms_node? Rename that group to gms_nodes"]


BREAKAGES = {"field": break_field, "group": break_group}


@dataclass
class Runs:
    slurm_inventory: Path
    slurm_out: Path
    outcomes: dict[str, tuple[int, str]]  # "slurm_render", "preflight-good", "preflight-<breakage>"
    expected: dict[str, list[str]]  # what each broken inventory's refusal says


@pytest.fixture(scope="module")
def runs(installed: Installed) -> Runs:
    """Every playbook run at once (each is a second or two of work and many of waiting on Ansible's start)."""
    cases = installed.scratch / "cases"
    slurm_inventory = cases / "slurm-pyxis"
    shutil.copytree(installed.collection / "inventories" / "examples" / "slurm-pyxis", slurm_inventory)
    slurm_out = cases / "out"
    slurm_out.mkdir()
    argvs = {"slurm_render": ["-v", "-i", str(slurm_inventory), "shadowline.gms.slurm_render",
                              "-e", f"slurm_render_dest={slurm_out}"],
             "preflight-good": ["-i", str(local_inventory(installed, cases / "good", "pkgcheck")),
                                "shadowline.gms.preflight"]}
    expected = {}
    for name, breakage in BREAKAGES.items():
        inventory = local_inventory(installed, cases / f"broken-{name}", "pkgcheck")
        expected[name] = breakage(inventory)
        argvs[f"preflight-{name}"] = ["-i", str(inventory), "shadowline.gms.preflight"]

    def play(argv: list[str]) -> tuple[int, str]:
        result = run(installed, "ansible-playbook", *argv)
        return result.returncode, result.stdout + result.stderr

    with ThreadPoolExecutor(max_workers=len(argvs)) as pool:
        outcomes = dict(zip(argvs, pool.map(play, argvs.values())))
    return Runs(slurm_inventory, slurm_out, outcomes, expected)


def test_slurm_render_by_fqcn_writes_the_batch_script(installed: Installed, runs: Runs):
    variables = yaml.safe_load((runs.slurm_inventory / "group_vars" / "all.yml").read_text())
    rc, output = runs.outcomes["slurm_render"]
    assert rc == 0, output
    # the installed collection's slurm/render ran, not the checkout's
    assert str(installed.collection / "playbooks" / ".." / "slurm" / "render") in output, output
    script = runs.slurm_out / f"shadowline-{variables['gms_deployment']}.sbatch"
    assert [p.name for p in runs.slurm_out.iterdir()] == [script.name]
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n")
    slurm = variables["gms_slurm"]
    sbatch = {line.split("=", 1)[0][len("#SBATCH "):]: line.split("=", 1)[1]
              for line in text.splitlines() if line.startswith("#SBATCH ") and "=" in line}
    assert sbatch["--job-name"] == f"shadowline-{variables['gms_deployment']}"
    assert sbatch["--nodes"] == str(variables["gms_engine"]["nnodes"])
    assert sbatch["--gpus-per-node"] == str(variables["gms_engine"]["gpus_per_node"])
    assert sbatch["--partition"] == slurm["partition"]
    assert sbatch["--account"] == slurm["account"]
    assert sbatch["--time"] == slurm["time"]
    assert sbatch["--output"] == f"{slurm['output_dir']}/%x-%j.out"
    assert "#SBATCH --exclusive" in text.splitlines()
    assert str(ROOT) not in text and str(installed.scratch) not in text, "the script names a build-time path"
    assert f"sbatch {script}" in output


def test_preflight_by_fqcn_passes_the_local_example(runs: Runs):
    rc, output = runs.outcomes["preflight-good"]
    assert rc == 0, output
    assert "preflight passed for deployment pkgcheck: 1 node(s), 2 cohort(s), backend standin" in output
    assert "changed=0" in output and "failed=0" in output


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_preflight_by_fqcn_refuses_the_local_example_broken(runs: Runs, breakage: str):
    rc, output = runs.outcomes[f"preflight-{breakage}"]
    assert rc != 0, output
    assert "Traceback" not in output, output
    for line in runs.expected[breakage]:
        assert line in output, f"expected {line!r} in:\n{output}"


def example_commands(example: Path) -> list[str]:
    """The commands the example's comments give: `shadowline ...` in backquotes, and comment lines that are a
    command of their own (``#   ansible-galaxy ...``)."""
    commands = []
    for path in sorted(example.rglob("*.yml")):
        for line in path.read_text().splitlines():
            comment = line.split("#", 1)[1] if "#" in line else ""
            commands += re.findall(r"`(shadowline [^`]+)`", comment)
            if comment.strip().startswith("ansible-galaxy "):
                commands.append(comment.strip())
    return commands


def test_the_slurm_examples_comment_commands_work(installed: Installed, tmp_path: Path):
    """issue #41: the slurm-pyxis example's own comment commands, run as written (the tarball's version and a
    scratch /shared filled in): the collection installed where gms_slurm.library_dir expects it, holding the
    shadowline package the job puts on PYTHONPATH; the batch script rendered from the example."""
    example = installed.collection / "inventories" / "examples" / "slurm-pyxis"
    commands = example_commands(example)
    assert [c.split()[:2] for c in commands] == [["ansible-galaxy", "collection"], ["shadowline", "render-slurm"]]
    shared = tmp_path / "shared"
    tarball = installed.scratch / "build" / f"shadowline-gms-{installed.version}.tar.gz"
    shutil.copytree(installed.collection / "inventories", tmp_path / "inventories")
    for command in commands:
        argv = command.replace("shadowline-gms-<version>.tar.gz", str(tarball)).replace("/shared", str(shared)).split()
        proc = subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=tmp_path, env=installed.env, capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode == 0, f"{command}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    library = yaml.safe_load((example / "group_vars" / "all.yml").read_text())["gms_slurm"]["library_dir"]
    assert library.startswith("/shared/")
    installed_library = Path(library.replace("/shared", str(shared), 1))
    assert (installed_library / "shadowline" / "slurm" / "watchdog.py").is_file(), installed_library
    script = (tmp_path / "shadowline-llama70b.sbatch").read_text()
    assert f"PYTHONPATH={library}\n" in script and f"{library}:{library}:ro" in script
    assert "/usr/local/bin/etcd/etcd" in script and "/usr/bin/nats-server -c" in script
