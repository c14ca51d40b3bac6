"""The Slurm batch job of a deployment: the cohort plan for the allocation's nodes, as shell the template lays out.

Nodes come from the allocation, not from ``gms_nodes``: the plan is built (by plan_builder.py, as for every other
backend) for ``nnodes`` placeholder nodes ``slurm-node-<i>`` whose address is the token ``@SL_ADDR_<i>@``. In
the script every token becomes ``${SL_ADDR_<i>}``; the supervisor sets ``SL_NODE_<i>``/``SL_ADDR_<i>`` from
``scontrol show hostnames "$SLURM_JOB_NODELIST"`` at run time (node 0, the first, is the master address and
the infra node). Each rank's command is the plan's argv and environment, word for word; the plan is built with
node-local directories under ``gms_slurm.node_dir`` (the hosts' state and config directories are root's on a
cluster; the socket directory too, unless ``gms_socket_dir`` is set).

``job_context`` returns what ``job.sbatch.j2`` (package data beside this module) needs, every shell word already
quoted; it takes the deployment's variables (one host's ``gms_*`` values) and never raises on bad input: it returns
problems.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from ..cluster.access import etcd_tls_files
from ..common.problems import Problem
from ..common.settings import FRONTEND_TLS_PLAIN
from ..common.values import as_int
from ..deployment.addresses import PLACEHOLDER_RE
from ..deployment.contract import parse_contract
from ..deployment.plan import CohortPlan, Plan, shell_quote
from ..deployment.plan_builder import PYTHON_PROXY, checked_plan, etcd_proxy_ports
from .job_secrets import BUNDLE
from .options import SlurmOptions, parse_slurm_options

SLURM_VARIABLES = ["gms_slurm"]  # the Slurm-only variables (listed in contract.KNOWN_VARIABLES too)
HOST_ONLY = ("gms_node_rank", "gms_node_address")
WATCHDOG_MODULE = "shadowline.slurm.watchdog"
NODE_TASKS_MODULE = "shadowline.slurm.node_tasks"
KEEPER_MODULE = "shadowline.slurm.keeper"


def placeholder(index: int) -> str:
    return f"@SL_ADDR_{index}@"


def node_name(index: int) -> str:
    return f"slurm-node-{index}"


# -- shell words ------------------------------------------------------------------------------------------ #

def sh(value: str) -> str:
    """One shell word: address tokens become "${SL_ADDR_<i>}" (in double quotes), the rest quoted as needed."""
    if not PLACEHOLDER_RE.search(value):
        return shell_quote(value)
    out = []
    pos = 0
    for match in PLACEHOLDER_RE.finditer(value):
        out.append(_dq(value[pos:match.start()]))
        out.append("${SL_ADDR_%s}" % match.group(1))
        pos = match.end()
    out.append(_dq(value[pos:]))
    return '"' + "".join(out) + '"'


def shown(text: str) -> str:
    """Text for a comment: address tokens as the variables the script uses."""
    return PLACEHOLDER_RE.sub(r"$SL_ADDR_\1", text)


def _dq(text: str) -> str:
    return "".join("\\" + c if c in '\\"$`' else c for c in text)


def command_lines(argv: list[str], env: dict[str, str], prefix: list[str] | None = None) -> list[str]:
    """``exec env K=V ... [prefix] argv`` as lines to join with `` \\``: one variable per line, one option per line."""
    lines = ["exec env"] if env else ["exec"]
    lines += [f"    {key}={sh(env[key])}" for key in sorted(env)]
    if prefix:
        lines.append("    " + " ".join(sh(word) for word in prefix))
    lines += ["    " + line for line in option_lines(argv)]
    return lines


def option_lines(argv: list[str]) -> list[str]:
    """argv grouped for reading: the program, then each --option with its values on its own line."""
    groups: list[list[str]] = [[]]
    for i, arg in enumerate(argv):
        if arg.startswith("--") and i > 0 and groups[-1]:
            groups.append([])
        groups[-1].append(sh(arg))
    return [" ".join(group) for group in groups if group]


# -- from the inventory to a plan for the allocation --------------------------------------------------------- #

def slurm_hostvars(shared: dict[str, Any], nnodes: int, node_dir: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Host variables of ``nnodes`` placeholder nodes carrying the deployment's shared values."""
    values = {k: v for k, v in shared.items()
              if k.startswith("gms_") and k not in HOST_ONLY and k not in SLURM_VARIABLES}
    if not values.get("gms_socket_dir"):
        values["gms_socket_dir"] = f"{node_dir}/gms"
    names = [node_name(i) for i in range(nnodes)]
    return {name: {**values, "gms_node_rank": i, "gms_node_address": placeholder(i)}
            for i, name in enumerate(names)}, names


def node_count(shared: dict[str, Any], inventory_hosts: int) -> int:
    engine = shared.get("gms_engine")
    value = engine.get("nnodes") if isinstance(engine, dict) else None
    number = as_int(value) if value is not None else None
    return number if number and number > 0 else max(1, inventory_hosts)


def build_job_plan(shared: dict[str, Any], inventory_hosts: int) -> tuple[Plan | None, SlurmOptions | None,
                                                                          list[Problem]]:
    """(plan with address placeholders and node-local directories, Slurm options, problems) from one host's
    gms_* values. The state and config directories (root's on a cluster) are ``<node_dir>/state`` and
    ``<node_dir>/config``."""
    problems: list[Problem] = []
    deployment = shared.get("gms_deployment") if isinstance(shared.get("gms_deployment"), str) else "deployment"
    engine = shared.get("gms_engine") if isinstance(shared.get("gms_engine"), dict) else {}
    options = parse_slurm_options(shared.get("gms_slurm"), deployment, engine.get("backend", "dynamo_vllm"),
                                  as_int(engine.get("gpus_per_node", 1)) or 1, problems)
    node_dir = options.node_dir if options else f"/tmp/shadowline-{deployment}"
    nnodes = node_count(shared, inventory_hosts)
    hostvars, names = slurm_hostvars(shared, nnodes, node_dir)
    contract, contract_problems = parse_contract(hostvars, names, [])
    problems += [p for p in contract_problems if p.field != "gms_slurm"]
    if contract is not None and contract.frontend_tls != FRONTEND_TLS_PLAIN:
        problems.append(Problem("gms_frontend_tls", f"is {contract.frontend_tls}, but a Slurm job's CA is made "
                                "for that job alone when it starts (slurm/job_secrets.py): no client outside the "
                                "job could trust its frontend's certificate.",
                                "set gms_frontend_tls: plain for the Slurm job (and gms_frontend_allow, or a "
                                "TLS-terminating proxy with a public certificate), or deploy with playbooks/site.yml."))
    if contract is None or options is None or problems:
        return None, None, problems
    # Unless gms_insecure: the job's etcd wants TLS with a client certificate and passwords, its NATS and request
    # plane TLS, with credentials the supervisor makes for the job at its start (slurm/job_secrets.py), under
    # <node_dir>/config/secrets; Dynamo's processes reach etcd through the job's own proxy (slurm/etcd_proxy.py).
    plan, refused = checked_plan(contract, state_dir=f"{node_dir}/state", config_dir=f"{node_dir}/config",
                                 model_view=False, etcd_proxy=PYTHON_PROXY)
    if plan is None:
        return None, None, refused
    return plan, options, problems


# -- the script's parts ------------------------------------------------------------------------------------- #

def job_context(shared: dict[str, Any], inventory_hosts: int = 1,
                source: str = "") -> tuple[dict[str, Any] | None, list[Problem]]:
    """Everything job.sbatch.j2 renders, or (None, problems)."""
    plan, options, problems = build_job_plan(shared, inventory_hosts)
    if plan is None or options is None:
        return None, problems
    nnodes = len(plan.nodes)
    supervisor_python = options.python or plan.python
    node_dir = options.node_dir
    ctx: dict[str, Any] = {
        "deployment": plan.deployment, "backend": plan.backend, "model_id": plan.model_id,
        "revision": plan.revision, "model_dir": plan.model_dir, "nnodes": nnodes, "source": source,
        "lock_path": plan.lock_path, "socket_dir": plan.socket_dir, "node_dir": node_dir,
        "secure": plan.secure, "secrets_dir": plan.security.dir if plan.security else "",
        "frontend": shown(plan.infra.frontend_url),
        "sbatch": sbatch_options(options, nnodes),
        "settings": [("SL_PYTHON", sh(supervisor_python)), ("SL_NODE_DIR", sh(node_dir)),
                     ("SL_OUTPUT_DIR", sh(options.output_dir) if options.output_dir else '"$SLURM_SUBMIT_DIR"')],
        "modules": [sh(m) for m in options.modules],
        "library_dir": sh(options.library_dir) if options.library_dir else "",
        "node_dir_function": node_dir_function(plan.deployment),
        "cohorts": [{"cohort": c.cohort, "engine_id": c.engine_id, "role": c.role, **asdict(c.ports)}
                    for c in plan.cohorts],
    }
    ctx["tasks"] = tasks(plan, options)
    ctx["steps"] = steps(plan, options)
    ctx["spec_json"] = spec_text(plan.to_dict(), asdict(options))
    return ctx, []


def spec_text(plan: dict[str, Any], options: dict[str, Any]) -> str:
    """The spec as compact JSON, one line per plan entry (and per cohort, per GMS server): short enough to read
    past, exact for the supervisor."""
    def dump(value: Any) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))

    lines = ['{"slurm": ' + dump(options) + ",", ' "plan": {']
    keys = sorted(plan)
    for i, key in enumerate(keys):
        end = "," if i < len(keys) - 1 else ""
        value = plan[key]
        if isinstance(value, list) and key in ("cohorts", "gms_servers"):
            items = [f"   {dump(item)}" + ("," if j < len(value) - 1 else "") for j, item in enumerate(value)]
            lines += [f'  "{key}": ['] + items + [f"  ]{end}"]
        else:
            lines.append(f'  "{key}": {dump(value)}{end}')
    lines.append(" }}")
    return "\n".join(lines)


def sbatch_options(options: SlurmOptions, nnodes: int) -> list[str]:
    lines = [f"--job-name={options.job_name}", f"--nodes={nnodes}", "--ntasks-per-node=1",
             f"--output={(options.output_dir + '/') if options.output_dir else ''}{options.output}",
             f"--signal=B:TERM@{options.signal_lead_s}"]
    for flag, value in (("partition", options.partition), ("account", options.account), ("qos", options.qos),
                        ("time", options.time)):
        if value:
            lines.append(f"--{flag}={value}")
    if options.exclusive:
        lines.append("--exclusive")
    if options.gpus_per_node:
        lines.append(f"--gpus-per-node={options.gpus_per_node}")
    lines += list(options.extra_sbatch)
    return lines


def container_mounts(plan: Plan, options: SlurmOptions) -> list[str]:
    """What every container of the job sees of its node: the user's mounts, the node directory, the GMS socket
    and lock directories (the GMS server and the engines run in separate steps: they meet there), and read-only
    the staged model and gms_slurm.library_dir (the shadowline package the watchdog and the node tasks import, at
    the same path as outside, which the script's PYTHONPATH names), each unless a mount of the user's holds it."""
    mounts = list(options.container_mounts)
    targets = [m.split(":")[1] if ":" in m else m for m in mounts]

    def covered(path: str) -> bool:
        return any(path == t or path.startswith(t.rstrip("/") + "/") for t in targets)

    for path in dict.fromkeys([options.node_dir, plan.socket_dir, plan.lock_dir]):
        if not covered(path):
            mounts.append(f"{path}:{path}")
            targets.append(path)
    for path in dict.fromkeys(p for p in (plan.model_dir, options.library_dir) if p):
        if not covered(path):
            mounts.append(f"{path}:{path}:ro")
            targets.append(path)
    return mounts


def _container_prefix(plan: Plan, options: SlurmOptions) -> list[str] | None:
    """``apptainer exec --nv --no-home --bind ... IMAGE`` before a command (pyxis works through srun options
    instead); no home directory, so a user's ~/.local packages cannot shadow the image's."""
    if not options.container_image or options.container_runtime != "apptainer":
        return None
    words = ["apptainer", "exec", "--nv", "--no-home"]
    for mount in container_mounts(plan, options):
        words += ["--bind", mount]
    if options.library_dir:  # the host's PYTHONPATH, whatever the image's environment says
        words += ["--env", f"PYTHONPATH={options.library_dir}"]
    return words + [options.container_image]


def pyxis_options(plan: Plan, options: SlurmOptions) -> list[str]:
    """srun's pyxis options for a step in the job's container: one named container per job, so the image is
    imported once per node (by the first step that runs in it, the model check or the GMS server, before steps
    run side by side) and every later step and relaunch reuses it; no home directory (a user's ~/.local packages
    would shadow the image's) and not the image's entrypoint (NVIDIA's prints a banner and may run scripts)."""
    if not options.container_image or options.container_runtime != "pyxis":
        return []
    # --container-env: the job's PYTHONPATH (gms_slurm.library_dir) wins over an image's own (pyxis gives an image's
    # values precedence over the host's otherwise)
    return [f"--container-image={sh(options.container_image)}", f"--container-name={sh(options.job_name)}",
            f"--container-mounts={sh(','.join(container_mounts(plan, options)))}",
            "--no-container-mount-home", "--no-container-entrypoint",
            *(["--container-env=PYTHONPATH"] if options.library_dir else [])]


def step_env(env: dict[str, str]) -> dict[str, str]:
    """A process's environment in a Slurm step: the plan's, but Slurm sets CUDA_VISIBLE_DEVICES itself to the GPUs
    the job was given (not always the node's first ones); the plan's CUDA_DEVICE_ORDER stays."""
    return {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}


def _rank_task(plan: Plan, options: SlurmOptions, cohort: CohortPlan) -> dict[str, Any]:
    failover = plan.failover  # gms_failover: the same timeouts as the node agent's
    watchdog = [plan.python, "-m", WATCHDOG_MODULE, "--health-timeout", f"{failover.health_timeout_s:g}",
                "--progress-stall", f"{failover.progress_stall_s:g}",
                "--term-grace", f"{failover.term_grace_s:g}", "--stop-grace", f"{options.stop_grace_s:g}"]
    tls = etcd_tls_files(plan)
    if tls:  # the rank's ETCD_ENDPOINTS is the node's etcd proxy (gRPC only): the watchdog goes to etcd itself
        watchdog += ["--etcd-endpoints", plan.infra.etcd_endpoints, "--etcd-ca", tls["ca"], "--etcd-cert", tls["cert"],
                     "--etcd-key", tls["key"]]
    watchdog.append("--")
    prefix = _container_prefix(plan, options)
    branches = []
    for rank in cohort.ranks:
        process = rank.process
        kind = "leader: Dynamo runtime, takes the failover lock" if rank.leader else "headless"
        branches.append({"case": str(rank.node_rank), "comment": f"rank {rank.node_rank} ({kind})",
                         "pre": credentials_pre(plan), "lines": command_lines(watchdog + list(process.argv), step_env(process.env), prefix)})
    ports = cohort.ports
    return {"name": f"cohort_{cohort.cohort}", "by_node": True,
            "comment": f"cohort {cohort.cohort} ({cohort.role}, ENGINE_ID={cohort.engine_id}): "
                       f"master port {ports.master}, system port {ports.system}, NIXL {ports.nixl}; "
                       "each rank under the watchdog",
            "branches": branches}


def tasks(plan: Plan, options: SlurmOptions) -> list[dict[str, Any]]:
    """The task functions: what one task of a step runs on its node (every process with the plan's runtime
    interpreter, ``plan.python``)."""
    prefix = _container_prefix(plan, options)
    infra = plan.infra
    python = plan.python
    out: list[dict[str, Any]] = []
    if plan.secure and plan.security is not None:
        secrets, bundle = sh(plan.security.dir), f'"$SL_NODE_DIR/{BUNDLE}"'
        out.append({"name": "secrets", "by_node": False,
                    "comment": "keep this node's share of the job's credentials (the supervisor's bundle, "
                               "slurm/job_secrets.py), readable by the job's user only, and delete the bundle",
                    "pre": ["umask 077", f"mkdir -p {secrets}",
                            f'tar -xf {bundle} -C {secrets} --strip-components=1 "node-$SLURM_NODEID"',
                            f"rm -f {bundle}"], "lines": []})
    if options.model_check:
        argv = [python, "-m", NODE_TASKS_MODULE, "model-status", "--local-dir", plan.model_dir,
                "--model-id", plan.model_id, "--revision", plan.revision]
        out.append({"name": "model_check", "by_node": False, "comment": "report this node's staged model "
                    "(status file + fast verify) for the readiness gate", "pre": [],
                    "lines": command_lines(argv, {}, prefix)})
    gms_branches = []
    failover = plan.failover  # a server that dies is started again by the keeper, by the agents' relaunch policy
    keeper = [python, "-m", KEEPER_MODULE, "--backoff", f"{failover.relaunch_backoff_s:g}",
              "--backoff-max", f"{failover.relaunch_backoff_max_s:g}",
              "--max-attempts", str(failover.max_relaunch_attempts), "--stable-after", f"{failover.stable_after_s:g}",
              "--"]
    for index, process in enumerate(plan.gms_servers):
        gms_branches.append({"case": str(index), "comment": f"node {index}",
                             "pre": [f"mkdir -p {sh(plan.gms_dir)}"],
                             "lines": command_lines(keeper + list(process.argv), step_env(process.env), prefix)})
    out.append({"name": "gms", "by_node": True, "comment": f"GPU Memory Service server ({plan.engine.gms_module}), "
                "started again by the keeper when it ends (the supervisor then has the writer republish)",
                "branches": gms_branches})
    pattern = f"{plan.gms_dir}/gms_*_weights.sock"
    argv = [python, "-m", NODE_TASKS_MODULE, "wait-files", "--pattern", pattern,
            "--count", str(plan.gpus_per_node), "--timeout", str(options.ready_timeout_s)]
    out.append({"name": "gms_wait", "by_node": False, "comment": "wait until this node's GMS server listens",
                "pre": [], "lines": command_lines(argv, {}, prefix)})
    out += _etcd_proxy_tasks(plan, options)
    etcd, nats, frontend = infra.etcd[0], infra.nats[0], infra.frontend
    out.append({"name": "etcd", "by_node": False,
                "comment": f"etcd (discovery), on the first node: {infra.etcd_endpoints}",
                "pre": [], "lines": command_lines(list(etcd.argv), etcd.env, prefix)})
    nats_pre = []
    for path, text in nats.files.items():
        nats_pre.append(f"mkdir -p {sh(path.rsplit('/', 1)[0])} {sh(plan.nats_store_dir)}")
        nats_pre.append("# shellcheck disable=SC2016  # $DYNAMO: a variable of NATS's configuration, not the shell's")
        nats_pre += _continued(["printf '%s\\n'"] + [f"    {sh(line)}" for line in text.rstrip(chr(10)).split(chr(10))]
                               + [f"    > {sh(path)}"])
    out.append({"name": "nats", "by_node": False,
                "comment": f"NATS with JetStream, on the first node: {infra.nats_server}",
                "pre": nats_pre, "lines": command_lines(list(nats.argv), nats.env, prefix)})
    out.append({"name": "frontend", "by_node": False,
                "comment": "Dynamo frontend (OpenAI API), on the first node: " + infra.frontend_url,
                "pre": [f"mkdir -p {sh(frontend.env['HOME'])}", *credentials_pre(plan)],
                "lines": command_lines(list(frontend.argv), frontend.env, prefix)})
    out += [_rank_task(plan, options, cohort) for cohort in plan.cohorts]
    for task in out:
        task["comment"] = shown(task["comment"])
        task["lines"] = task.get("lines", [])
        for branch in task.get("branches", []):
            branch["lines"] = _continued(branch["lines"])
        task["lines"] = _continued(task["lines"])
    return out


def _etcd_proxy_tasks(plan: Plan, options: SlurmOptions) -> list[dict[str, Any]]:
    """Every node's etcd proxy (slurm/etcd_proxy.py: Dynamo's etcd client on loopback, TLS to etcd) and the wait
    until it listens; none when etcd's clients are plain (gms_insecure)."""
    proxies = {process.host: process for process in plan.infra.etcd_proxies}
    if not proxies:
        return []
    prefix = _container_prefix(plan, options)
    branches = [{"case": str(index), "comment": f"node {index}", "pre": [],
                 "lines": command_lines(list(proxies[node.host].argv), {}, prefix)}
                for index, node in enumerate(plan.nodes)]
    ports = etcd_proxy_ports(plan.ports, len(plan.infra.etcd))
    argv = [plan.python, "-m", NODE_TASKS_MODULE, "wait-listening", *(w for p in ports for w in ("--port", str(p))),
            "--timeout", str(options.ready_timeout_s)]
    return [{"name": "etcd_proxy", "by_node": True, "branches": branches,
             "comment": "etcd proxy: Dynamo's etcd client on 127.0.0.1, TLS with this node's certificate to etcd"},
            {"name": "etcd_proxy_wait", "by_node": False, "comment": "wait until this node's etcd proxy listens",
             "pre": [], "lines": command_lines(argv, {}, prefix)}]


def credentials_pre(plan: Plan) -> list[str]:
    """What a Dynamo process's task runs before its command: its etcd identity (ETCD_AUTH_USERNAME/PASSWORD)
    from the job's secrets, exported, so that no password is ever in this script; nothing when insecure."""
    if not plan.secure or plan.security is None:
        return []
    return ["# shellcheck source=/dev/null", f"set -a && . {sh(plan.security.dynamo_env)} && set +a"]


def _continued(lines: list[str]) -> list[str]:
    return [line + (" \\" if i < len(lines) - 1 else "") for i, line in enumerate(lines)]


def steps(plan: Plan, options: SlurmOptions) -> list[dict[str, Any]]:
    """The step functions: one ``srun`` each, which the supervisor runs (and relaunches) as a job step."""
    nnodes = len(plan.nodes)
    container = pyxis_options(plan, options)
    cpus = [f"--cpus-per-task={options.cpus_per_task}"] if options.cpus_per_task else []
    every = [f"--nodes={nnodes}", "--ntasks-per-node=1"]
    first = ["--nodes=1", "--ntasks=1", '--nodelist="$SL_NODE_0"']
    run = 'bash "$SL_NODE_DIR/job.sh" task'

    def srun(name: str, where: list[str], extra: list[str], comment: str, task: str | None = None,
             command: str | None = None, in_container: bool = True) -> dict[str, Any]:
        words = ["exec srun", "--overlap", "--export=ALL", f"--job-name={name}", "--label", "--unbuffered",
                 *where, *extra, *(container if in_container else []), *cpus]
        body = command or f"{run} {task or name.replace('-', '_')}"
        return {"name": name.replace("-", "_"), "comment": comment, "lines": _continued(_wrap(words) + ["    " + body])}

    out = [srun("prepare", every, [], "every node: a fresh node directory, the job's own (the task prints its node "
                "id); a directory there without the job's marker stops the job, untouched",
                command=node_dir_command("prepare"), in_container=False)]
    if plan.secure:
        out.append(srun("secrets", every, [], "every node: its share of the job's credentials (the supervisor made "
                        "them for this job and copied them with sbcast)", in_container=False))
    if options.model_check:
        out.append(srun("model-check", every, [], "every node: the staged model's status, for the readiness gate"))
    out += [
        srun("gms", every, [], "every node: the GMS server (runs for the whole job)"),
        srun("gms-wait", every, [], "every node: until the GMS server listens"),
        *([srun("etcd-proxy", every, [], "every node: the etcd proxy of Dynamo's processes (runs for the whole job)"),
           srun("etcd-proxy-wait", every, [], "every node: until the etcd proxy listens")]
          if plan.infra.etcd_proxies else []),
        srun("etcd", first, [], "first node: etcd"),
        srun("nats", first, [], "first node: NATS"),
        srun("frontend", first, [], "first node: the frontend"),
    ]
    for cohort in plan.cohorts:
        out.append(srun(f"cohort-{cohort.cohort}", every, ["--kill-on-bad-exit=1"],
                        f"cohort {cohort.cohort}: one rank per node (rank = SLURM_NODEID); any rank that exits "
                        "non-zero (or hangs: the watchdog) ends the whole step"))
    out.append(srun("cleanup", every, [], "every node: remove the node directory (at the end of the job), if it "
                    "still carries this job's marker", command=node_dir_command("cleanup"), in_container=False))
    return out


NODE_DIR_MARKER = ".shadowline-slurm-node-dir"  # in the node directory: "deployment=<name> job=<Slurm job id>"


def node_dir_function(deployment: str) -> list[str]:
    """``sl_node_dir prepare|cleanup``, the one shell function that makes and removes the node directory (issue
    #42: the job removed whatever was at gms_slurm.node_dir). The job makes the directory itself (mkdir fails if
    anything is there) and writes NODE_DIR_MARKER into it; it removes a directory only when it is a real directory
    (not a link) of the job's user that carries the marker: prepare, one of this deployment (an earlier job's
    leftover); cleanup, this job's own. Anything else at that path stops prepare with the path and the fix, and
    is left by cleanup with a message. Both steps run it on every node as ``bash -c "$(declare -f sl_node_dir);
    sl_node_dir <what>"`` (the script itself is copied there only after prepare)."""
    owner = sh(f"deployment={deployment}")
    return [
        "sl_node_dir() {  # prepare | cleanup (step_prepare and step_cleanup run it on every node)",
        f'    local dir="$SL_NODE_DIR" owner={owner} found="" mine=""',
        f'    local marker="$dir/{NODE_DIR_MARKER}" here="${{SLURMD_NODENAME:-$(hostname)}}"',
        '    if [ -d "$dir" ] && [ ! -L "$dir" ] && [ -O "$dir" ] && [ -f "$marker" ] && [ ! -L "$marker" ]; then',
        '        IFS= read -r found <"$marker" || true',
        '    fi',
        '    case "$found" in "$owner job="*) mine=deployment ;; esac',
        '    [ "$found" = "$owner job=$SLURM_JOB_ID" ] && mine=job',
        '    if [ "$1" = cleanup ]; then',
        '        if [ "$mine" = job ]; then',
        '            rm -rf -- "$dir"',
        '        elif [ -e "$dir" ] || [ -L "$dir" ]; then',
        '            echo "shadowline: left $dir on $here as it is: it does not carry the marker of this job'
        f' ({NODE_DIR_MARKER}: $owner job=$SLURM_JOB_ID)" >&2',
        '        fi',
        '        return 0',
        '    fi',
        '    if [ -n "$mine" ]; then',
        '        rm -rf -- "$dir" || return 1',
        '    elif [ -e "$dir" ] || [ -L "$dir" ]; then',
        '        echo "shadowline: $dir on $here is not a node directory of this deployment (no'
        f' {NODE_DIR_MARKER} naming $owner): nothing removed, the job stops. Fix: set gms_slurm.node_dir to a path'
        ' of its own, or remove $dir yourself if nothing in it is needed." >&2',
        '        return 1',
        '    fi',
        '    mkdir -p -- "$(dirname -- "$dir")" || return 1',
        '    mkdir -m 0700 -- "$dir" || return 1  # fails if anything came there meanwhile',
        '    printf \'%s\\n\' "$owner job=$SLURM_JOB_ID" >"$marker" || return 1',
        '    echo "$SLURM_NODEID $SLURMD_NODENAME"',
        "}",
    ]


def node_dir_command(what: str) -> str:
    """A step's command that runs ``sl_node_dir <what>`` on its node (bash; the function's text goes with it)."""
    return f'bash -c "$(declare -f sl_node_dir); sl_node_dir {what}"'


def _wrap(words: list[str], width: int = 100) -> list[str]:
    lines: list[str] = []
    current = ""
    for word in words:
        candidate = f"{current} {word}" if current else word
        if len(candidate) > width and current:
            lines.append(current)
            current = "    " + word
        else:
            current = candidate
    if current:
        lines.append(current)
    return lines
