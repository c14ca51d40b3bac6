"""slurm/render and the job library: scripts that pass bash -n and shellcheck for every option, literal commands
from the plan, gms_slurm validation naming the field and the fix, and the spec the supervisor reads back."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shadowline.common.policy import RelaunchPolicy
from shadowline.deployment.plan import Plan
from shadowline.slurm.allocation import Node, concrete, read_spec
from shadowline.slurm.job import job_context, sh
from shadowline.slurm.options import SlurmOptions

REPO = Path(__file__).resolve().parents[2]
RENDER = REPO / "slurm" / "render"
REVISION = "0123456789abcdef0123456789abcdef01234567"

BASE = {
    "gms_deployment": "llama",
    "gms_model": {"id": "meta-llama/Llama-3.3-70B-Instruct", "revision": REVISION,
                  "local_dir": "/scratch/models/llama-3.3-70b"},
    "gms_engine": {"backend": "dynamo_vllm", "tensor_parallel_size": 16, "gpus_per_node": 8, "nnodes": 2},
    "gms_cohorts": 3,
    "gms_python": "/opt/dynamo/venv/bin/python",
}
VARIANTS = {
    "defaults": {},
    "cluster": {"gms_slurm": {"partition": "gpu", "account": "proj-42", "qos": "high", "time": "2-00:00:00",
                              "exclusive": True, "gpus_per_node": 8, "cpus_per_task": 32,
                              "modules": ["cuda/12.4", "nccl/2.21"], "job_name": "llama-serve",
                              "output": "%x-%j.log", "output_dir": "/shared/jobs",
                              "extra_sbatch": ["--constraint=h100"]}},
    "pyxis": {"gms_slurm": {"container_image": "nvcr.io#nvidia/ai-dynamo/vllm-runtime:0.6.1",
                            "container_mounts": ["/scratch/models:/scratch/models:ro"]}},
    "apptainer": {"gms_slurm": {"container_image": "/shared/images/dynamo.sif", "container_runtime": "apptainer",
                                "container_mounts": ["/scratch:/scratch"], "exclusive": False}},
    "library": {"gms_slurm": {"container_image": "nvcr.io#nvidia/ai-dynamo/vllm-runtime:1.6.1",
                              "library_dir": "/shared/ansible/ansible_collections/shadowline/gms/plugins/module_utils"}},
    "standin": {"gms_engine": {"backend": "standin", "tensor_parallel_size": 2, "nnodes": 2},
                "gms_cohorts": 2, "gms_slurm": {"model_check": False}},
}


def values(**override) -> dict:
    shared = copy.deepcopy(BASE)
    shared.update(copy.deepcopy(override))
    return shared


def render(tmp_path: Path, shared: dict, name: str = "job.sbatch") -> Path:
    vars_file = tmp_path / f"{name}.json"
    vars_file.write_text(json.dumps(shared))
    out = tmp_path / name
    proc = subprocess.run([sys.executable, str(RENDER), "--vars-json", str(vars_file), "--out", str(out)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_script_passes_bash_n_and_shellcheck(tmp_path, variant):
    script = render(tmp_path, values(**VARIANTS[variant]))
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert shutil.which("shellcheck"), "shellcheck is in the project's Debian packages"
    proc = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout


def test_every_command_stands_in_the_script_literally(tmp_path):
    script = render(tmp_path, values(**VARIANTS["cluster"])).read_text()
    spec = read_spec(script)
    plan = spec["plan"]
    for cohort in plan["cohorts"]:
        ports = cohort["ports"]
        body = script.split(f"task_cohort_{cohort['cohort']}() {{", 1)[1].split("\n}\n", 1)[0]
        assert f"--master-port {ports['master']}" in body and f"DYN_SYSTEM_PORT={ports['system']}" in body
        assert f"VLLM_NIXL_SIDE_CHANNEL_PORT={ports['nixl']}" in body and f"ENGINE_ID={cohort['engine_id']}" in body
        for rank in cohort["ranks"]:
            argv = rank["process"]["argv"]
            assert " ".join(sh(a) for a in argv[:3]) in body  # /opt/dynamo/venv/bin/python -m dynamo.vllm
            assert f'--node-rank {rank["node_rank"]}' in body
        assert '--master-addr "${SL_ADDR_0}"' in body and "--headless" in body
        assert "-m shadowline.slurm.watchdog" in body
    assert "--kill-on-bad-exit=1" in script.split("step_cohort_0() {", 1)[1].split("}", 1)[0]
    # etcd over TLS: Dynamo's processes reach it through each node's etcd proxy on loopback
    assert plan["infra"]["etcd_endpoints"] == "https://@SL_ADDR_0@:2379"
    assert "ETCD_ENDPOINTS=http://127.0.0.1:23790" in script.split("task_cohort_0() {", 1)[1].split("\n}\n", 1)[0]
    proxy = script.split("task_etcd_proxy() {", 1)[1].split("\n}\n", 1)[0]
    assert proxy.count("-m shadowline.slurm.etcd_proxy") == 2  # a branch per node
    assert '--route "23790=slurm-node-0@${SL_ADDR_0}:2379"' in proxy
    assert "--cert /tmp/shadowline-llama/config/secrets/client.pem" in proxy
    assert "node_tasks wait-listening \\\n        --port 23790 \\\n" in script and "step_etcd_proxy_wait() {" in script
    for option in ("--partition=gpu", "--account=proj-42", "--qos=high", "--time=2-00:00:00", "--exclusive",
                   "--gpus-per-node=8", "--job-name=llama-serve", "--output=/shared/jobs/%x-%j.log",
                   "--signal=B:TERM@120", "--nodes=2", "--constraint=h100"):
        assert f"#SBATCH {option}\n" in script, option
    assert "module load cuda/12.4\n" in script and "--cpus-per-task=32" in script
    assert "@SL_ADDR_" not in script.split("SHADOWLINE_SPEC", 1)[0], "every address token is a shell variable"


def test_no_secret_in_the_script(tmp_path):
    shared = values(gms_model_hf_token_file="/etc/shadowline/hf-token")
    script = render(tmp_path, shared).read_text()
    assert "hf_" not in script.lower().replace("hf_hub_offline", "") and "TOKEN" not in script


def test_containers(tmp_path):
    pyxis = render(tmp_path, values(**VARIANTS["pyxis"]), "pyxis.sbatch").read_text()
    assert "--container-image='nvcr.io#nvidia/ai-dynamo/vllm-runtime:0.6.1'" in pyxis
    # the node directory holds the GMS sockets and the lock in a job; the model is under the user's mount
    assert "--container-mounts=/scratch/models:/scratch/models:ro,/tmp/shadowline-llama:/tmp/shadowline-llama" in pyxis
    # one container per job, imported once per node and reused by every step and relaunch
    assert "--container-name=shadowline-llama" in pyxis
    assert "--no-container-mount-home" in pyxis and "--no-container-entrypoint" in pyxis
    assert pyxis.count("--container-name=") == pyxis.count("--container-image=")
    apptainer = render(tmp_path, values(**VARIANTS["apptainer"]), "apptainer.sbatch").read_text()
    assert ("apptainer exec --nv --no-home --bind /scratch:/scratch --bind /tmp/shadowline-llama:/tmp/shadowline-llama "
            "/shared/images/dynamo.sif \\\n") in apptainer
    assert "#SBATCH --exclusive" not in apptainer


def test_spec_round_trip_and_addresses(tmp_path):
    script = render(tmp_path, values()).read_text()
    spec = read_spec(script)  # what the supervisor reads: the typed options and plan
    options = SlurmOptions.from_dict(spec["slurm"])
    assert options.stop_grace_s == 30 and options.modules == () and options.node_dir == "/tmp/shadowline-llama"
    plan = Plan.from_dict(concrete(spec["plan"], [Node("gpu-a", "10.0.0.1"), Node("gpu-b", "10.0.0.2")]))
    assert plan.failover.relaunch_backoff_s == 0.2 and plan.python == "/opt/dynamo/venv/bin/python"
    assert plan.infra.etcd_endpoints == "https://10.0.0.1:2379" and plan.etcd_tls
    ranks = plan.cohort(1).ranks
    assert ranks[1].process.env["DYN_SYSTEM_HOST"] == "10.0.0.2"
    assert "10.0.0.1" in ranks[1].process.argv  # --master-addr: the first node
    assert plan.state_dir == "/tmp/shadowline-llama/state" and plan.socket_dir == "/tmp/shadowline-llama/gms"
    assert plan.nats_store_dir == "/tmp/shadowline-llama/state/nats"
    assert not re.search(r"/var/lib/shadowline|/etc/shadowline|/run/shadowline", json.dumps(plan.to_dict()))


def test_yaml_and_ansible_inventories_render_the_same(tmp_path):
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"vars": {"root": "/opt/dynamo"}, "children": {
        "gms_nodes": {"hosts": {"a": {"gms_node_rank": 0}, "b": {"gms_node_rank": 1}}}}}}))
    group = values()
    group["gms_python"] = "{{ root }}/venv/bin/python"
    group["gms_engine"] = {"backend": "dynamo_vllm", "gpus_per_node": 8,
                           "tensor_parallel_size": "{{ 8 * groups['gms_nodes'] | length }}"}
    (inv / "group_vars" / "gms_nodes.yml").write_text(yaml.safe_dump(group))
    texts = []
    for extra in ([], ["--no-ansible"]):
        out = tmp_path / f"job{len(texts)}.sbatch"
        proc = subprocess.run([sys.executable, str(RENDER), "-i", str(inv), "--out", str(out), *extra],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        texts.append(out.read_text())
        assert json.loads(proc.stdout)["inventory"].startswith("PyYAML" if extra else "ansible-inventory")
    assert texts[0] == texts[1]
    assert "/opt/dynamo/venv/bin/python -m dynamo.vllm" in texts[0] and "--tensor-parallel-size 16" in texts[0]
    assert "#SBATCH --nodes=2" in texts[0]


@pytest.mark.parametrize("slurm, field, fix", [
    ({"time": "forever"}, "gms_slurm.time", "D-HH:MM:SS"),
    ({"container_mounts": ["/a:/b"]}, "gms_slurm.container_mounts", "container_image"),
    ({"extra_sbatch": ["--nodes=4"]}, "gms_slurm.extra_sbatch", "gms_engine.nnodes"),
    ({"partiton": "gpu"}, "gms_slurm.partiton", "did you mean 'partition'"),
    ({"output_dir": "relative/dir"}, "gms_slurm.output_dir", "absolute path"),
    ({"node_dir": "/tmp"}, "gms_slurm.node_dir", "a system directory"),  # the job removes node_dir (issue #42)
    ({"node_dir": "/scratch/../home"}, "gms_slurm.node_dir", "it means /home"),
    ({"gpus_per_node": "eight"}, "gms_slurm.gpus_per_node", "whole number"),
    ({"container_runtime": "docker"}, "gms_slurm.container_runtime", "pyxis, apptainer"),
    ({"stop_grace_s": 0}, "gms_slurm.stop_grace_s", "1..3600"),
    ({"output": "logs/%j.out"}, "gms_slurm.output", "gms_slurm.output_dir"),
    ({"extra_sbatch": ["--constraint=h100 --uid=0"]}, "gms_slurm.extra_sbatch", "no spaces"),
    ({"extra_sbatch": ["--comment=a\n#SBATCH --uid=0"]}, "gms_slurm.extra_sbatch", "no spaces"),
    ({"extra_sbatch": ["--comment=a\tb"]}, "gms_slurm.extra_sbatch", "no spaces"),
    ({"library_dir": "lib"}, "gms_slurm.library_dir", "absolute path"),
    ({"library_dir": "/shared/lib:/other"}, "gms_slurm.library_dir", "without them"),
    ({"library_dir": "/shared/lib,x"}, "gms_slurm.library_dir", "without them"),
    ({"library_dir": "/shared/lib/shadowline"}, "gms_slurm.library_dir", "set it to /shared/lib"),
])
def test_bad_options_name_the_field_and_the_fix(slurm, field, fix):
    context, problems = job_context(values(gms_slurm=slurm))
    assert context is None
    assert [p.field for p in problems] == [field], problems
    assert fix in problems[0].fix or fix in problems[0].message


def test_contract_problems_come_through(tmp_path):
    context, problems = job_context(values(gms_engine={"backend": "dynamo_vllm", "tensor_parallel_size": 3,
                                                       "nnodes": 2}, gms_cohort=2))
    assert context is None
    fields = {p.field for p in problems}
    assert {"gms_cohort", "gms_engine.tensor_parallel_size"} <= fields
    vars_file = tmp_path / "bad.json"
    vars_file.write_text(json.dumps(values(gms_slurm={"time": "x"})))
    proc = subprocess.run([sys.executable, str(RENDER), "--vars-json", str(vars_file), "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "gms_slurm.time" in proc.stderr and not (tmp_path / "x").exists()


def test_relaunch_policy_is_gms_failover(tmp_path):
    shared = values(gms_failover={"relaunch_backoff_s": 0.2, "relaunch_backoff_max_s": 30,
                                  "max_relaunch_attempts": 5, "stable_after_s": 30})
    spec = read_spec(render(tmp_path, shared).read_text())
    policy = RelaunchPolicy.of(Plan.from_dict(spec["plan"]).failover)  # what the supervisor reads
    assert [policy.delay(n) for n in range(1, 10)] == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30]
    assert not policy.gives_up(5) and policy.gives_up(6)


def test_watchdog_timeouts_come_from_gms_failover(tmp_path):
    shared = values(gms_failover={"health_timeout_s": 4, "progress_stall_s": 5, "term_grace_s": 0.5})
    script = render(tmp_path, shared).read_text()
    assert "--health-timeout 4 \\\n" in script and "--progress-stall 5 \\\n" in script
    assert "--term-grace 0.5 \\\n" in script and "--stop-grace 30 \\\n" in script


@pytest.mark.parametrize("expression", [
    "{{ cycler.__init__.__globals__.os.system('touch PWNED') }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ lipsum.__globals__['os'].popen('touch PWNED').read() }}",
])
def test_inventory_jinja_runs_in_a_sandbox(tmp_path, expression):
    """An inventory is data: render refuses an expression that reaches Python internals, and nothing runs."""
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {
        "gms_nodes": {"hosts": {"a": {"gms_node_rank": 0}}}}}}))
    group = values(gms_engine={"backend": "dynamo_vllm", "nnodes": 1})
    group["gms_python"] = expression
    (inv / "group_vars" / "gms_nodes.yml").write_text(yaml.safe_dump(group))
    for extra in ([], ["--no-ansible"]):
        out = tmp_path / "job.sbatch"
        proc = subprocess.run([sys.executable, str(RENDER), "-i", str(inv), "--out", str(out), *extra],
                              capture_output=True, text=True, check=False, cwd=tmp_path)
        assert proc.returncode != 0 and "gms_python" in proc.stderr and "unsafe" in proc.stderr, proc.stderr
        assert not out.exists() and not (tmp_path / "PWNED").exists()


def test_containers_see_the_sockets_lock_and_model_outside_the_node_directory(tmp_path):
    """GMS and the engines run in separate steps (separate containers): the socket and lock directories and the
    staged model must be bind-mounted into each, or the engines never find the GMS server."""
    shared = values(gms_socket_dir="/run/gms-llama", gms_lock_path="/run/gms-llama-lock/failover.lock",
                    gms_slurm={"container_image": "nvcr.io#nvidia/ai-dynamo/vllm-runtime:1.6.1"})
    script = render(tmp_path, shared).read_text()
    assert ("--container-mounts=/tmp/shadowline-llama:/tmp/shadowline-llama,/run/gms-llama:/run/gms-llama,"
            "/run/gms-llama-lock:/run/gms-llama-lock,/scratch/models/llama-3.3-70b:/scratch/models/llama-3.3-70b:ro"
            ) in script
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in script and "CUDA_VISIBLE_DEVICES=" not in script  # Slurm sets it


# -- the node directory: the job removes only what it made (issue #42) ------------------------------------------ #

def run_step(script: Path, step: str, bin_dir: Path, job_id: str) -> subprocess.CompletedProcess[str]:
    """``bash SCRIPT step <step>`` as the supervisor runs it, with an srun that runs the step's command here."""
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": job_id, "SLURM_NODEID": "0",
           "SLURMD_NODENAME": "node0", "SLURM_SUBMIT_DIR": str(bin_dir), "HOME": str(bin_dir)}
    return subprocess.run(["bash", str(script), "step", step], capture_output=True, text=True, env=env,
                          timeout=30, check=False)


def test_the_job_removes_only_a_node_directory_it_made(tmp_path):
    """prepare and cleanup, executed: a directory without the job's marker (or with another deployment's, or a
    link) at gms_slurm.node_dir stops prepare untouched, with the path and the fix, and cleanup leaves it; the
    job's own (an earlier job's leftover at prepare, this job's at cleanup) is removed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ "${1:-}" == -* ]]; do shift; done\nexec "$@"\n')
    (bin_dir / "srun").chmod(0o755)
    node_dir = tmp_path / "nodes" / "llama"
    script = render(tmp_path, values(gms_slurm={"node_dir": str(node_dir)}))
    marker = node_dir / ".shadowline-slurm-node-dir"

    # nothing there: made, 0700, marked with the deployment and the job
    proc = run_step(script, "prepare", bin_dir, "101")
    assert proc.returncode == 0 and proc.stdout == "0 node0\n", proc.stderr
    assert marker.read_text() == "deployment=llama job=101\n" and (node_dir.stat().st_mode & 0o777) == 0o700
    # an earlier job's leftover of this deployment: removed and made afresh by the next job
    (node_dir / "stale.sock").write_text("")
    proc = run_step(script, "prepare", bin_dir, "102")
    assert proc.returncode == 0, proc.stderr
    assert marker.read_text() == "deployment=llama job=102\n" and not (node_dir / "stale.sock").exists()
    # cleanup of another job (102 made it): left; of this job: removed
    proc = run_step(script, "cleanup", bin_dir, "101")
    assert proc.returncode == 0 and node_dir.is_dir() and "left " + str(node_dir) in proc.stderr
    proc = run_step(script, "cleanup", bin_dir, "102")
    assert proc.returncode == 0 and not node_dir.exists(), proc.stderr
    assert run_step(script, "cleanup", bin_dir, "102").returncode == 0  # nothing there: nothing to do

    others = {"unmarked": "", "another deployment's": "deployment=other job=7\n"}
    for what, text in others.items():
        node_dir.mkdir()
        (node_dir / "sentinel").write_text("the user's")
        if text:
            marker.write_text(text)
        proc = run_step(script, "prepare", bin_dir, "103")
        assert proc.returncode != 0 and proc.stdout == "", what
        assert str(node_dir) in proc.stderr and "gms_slurm.node_dir" in proc.stderr and "nothing removed" in proc.stderr
        assert (node_dir / "sentinel").read_text() == "the user's", what
        proc = run_step(script, "cleanup", bin_dir, "103")
        assert proc.returncode == 0 and (node_dir / "sentinel").read_text() == "the user's", what
        shutil.rmtree(node_dir)

    # a link at the path, to a directory that carries the marker: neither followed nor removed
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "sentinel").write_text("kept")
    (target / ".shadowline-slurm-node-dir").write_text("deployment=llama job=104\n")
    node_dir.symlink_to(target)
    assert run_step(script, "prepare", bin_dir, "104").returncode != 0
    assert run_step(script, "cleanup", bin_dir, "104").returncode == 0
    assert node_dir.is_symlink() and (target / "sentinel").read_text() == "kept"


@pytest.mark.parametrize("node_dir, said", [
    ("/", "the root directory"), ("relative/dir", "absolute path"), ("/var/lib", "a system directory"),
    ("/scratch/a/../b", "it means /scratch/b"), ("/scratch", "two levels deep"),
])
def test_the_node_directory_is_never_the_root_a_system_directory_relative_or_dotted(node_dir, said):
    context, problems = job_context(values(gms_slurm={"node_dir": node_dir}))
    assert context is None and [p.field for p in problems] == ["gms_slurm.node_dir"], problems
    assert said in problems[0].message + problems[0].fix, problems[0]


def test_the_library_dir_is_the_jobs_pythonpath_and_mounted_read_only(tmp_path):
    """gms_slurm.library_dir (issue #41: NVIDIA's image has no shadowline): exported as PYTHONPATH for the
    supervisor and, through srun --export=ALL, every step; mounted read-only at the same path into each
    container. Without it the script sets no PYTHONPATH."""
    library = "/shared/ansible/ansible_collections/shadowline/gms/plugins/module_utils"
    text = render(tmp_path, values(**VARIANTS["library"]), "library.sbatch").read_text()
    assert f"\nPYTHONPATH={library}\nexport PYTHONPATH\n" in text
    assert text.index("export PYTHONPATH") < text.index('exec "$SL_PYTHON" -m shadowline.slurm.supervisor')
    mounts = re.findall(r"--container-mounts=(\S+)", text)
    assert mounts and all(m.split(",")[-1] == f"{library}:{library}:ro" for m in mounts)
    assert text.count("--container-env=PYTHONPATH") == text.count("--container-image=")  # over an image's own
    plain = render(tmp_path, values(**VARIANTS["pyxis"]), "pyxis.sbatch").read_text()
    assert "PYTHONPATH" not in plain
    apptainer = values(gms_slurm={"container_image": "/shared/images/dynamo.sif", "container_runtime": "apptainer",
                                  "library_dir": library})
    text = render(tmp_path, apptainer, "apptainer.sbatch").read_text()
    assert text.count(f"--bind {library}:{library}:ro --env PYTHONPATH={library} /shared/images/dynamo.sif") >= 3
    covered = values(gms_slurm={"container_image": "x#y:1", "container_mounts": ["/shared:/shared:ro"],
                                "library_dir": "/shared/lib"})
    assert "/shared/lib:" not in render(tmp_path, covered, "covered.sbatch").read_text()


def test_what_runs_in_the_image_needs_only_the_standard_library(tmp_path):
    """The watchdog, the keeper, the node tasks and the etcd proxy run in NVIDIA's image with the library on PYTHONPATH
    (gms_slurm.library_dir): they must import with nothing but Python's standard library. A bare virtual
    environment (no packages) with the checkout's library on PYTHONPATH runs each one's --help."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = str(bare / "bin" / "python")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "plugins" / "module_utils")}
    assert subprocess.run([python, "-c", "import yaml"], env=env, capture_output=True, check=False).returncode != 0
    for module in ("shadowline.slurm.watchdog", "shadowline.slurm.keeper", "shadowline.slurm.node_tasks",
                   "shadowline.slurm.etcd_proxy"):
        proc = subprocess.run([python, "-m", module, "--help"], env=env, capture_output=True, text=True,
                              check=False, timeout=60)
        assert proc.returncode == 0 and "usage" in proc.stdout, f"{module}: {proc.stderr[-1500:]}"
