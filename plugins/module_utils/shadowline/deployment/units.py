"""systemd units for every process of a plan, rendered in one place for all roles.

Units run the plan's argv and environment verbatim, as the service user, hardened, with
KillMode=control-group so stopping a unit kills every process of it. Engines are a template unit
(one instance per cohort) whose per-cohort drop-in carries that cohort's command and environment;
they never restart themselves: relaunch belongs to the failover agent.
Functions take the typed plan; Ansible filters turn the `gms_plan` fact into one with ``Plan.from_dict``.
"""

from __future__ import annotations

import hashlib

from ..model.policy import MANIFEST_NAME
from .container import podman_run, stop_post
from .plan import Plan, Process, on_host

# The one home of the units' sandboxing (docs/security.md has each unit's `systemd-analyze security` figure).
# Every unit: the file system read-only but for its ReadWritePaths, no privilege gain, kernel and cgroups closed.
HARDENING = (
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictNamespaces", "yes"),
    ("LockPersonality", "yes"),
    ("SystemCallArchitectures", "native"),
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"),  # NETLINK: Dynamo looks up its address
)
# Services of the unprivileged service user (GMS server, engines, etcd, NATS, frontend): no capability at all,
# no privileged or debugging system calls. Kept open for the GPU processes: the devices (/dev/nvidia*) and
# W+X memory (CUDA and Triton JIT).
UNPRIVILEGED = (
    ("CapabilityBoundingSet", ""),
    ("AmbientCapabilities", ""),
    ("RemoveIPC", "yes"),
    ("UMask", "0027"),
    ("SystemCallFilter", "~@clock @cpu-emulation @debug @module @mount @obsolete @raw-io @reboot @swap"),
    ("SystemCallErrorNumber", "EPERM"),
)
# The infra services (etcd, NATS, the frontend) need no device, see no other process and make only the system
# calls of an ordinary service; etcd and NATS (Go, no JIT) never map memory writable and executable.
INFRA = (
    ("PrivateDevices", "yes"),
    ("DevicePolicy", "closed"),
    ("ProtectProc", "invisible"),
    ("ProcSubset", "pid"),
    ("SystemCallFilter", "@system-service"),
    ("SystemCallFilter", "~@privileged @resources"),
)
NO_JIT = (("MemoryDenyWriteExecute", "yes"),)
# The agent stays root (it starts and stops units through systemd, signals and reads the engines' processes,
# kills their cgroups) with only the capabilities that takes.
AGENT = (
    ("CapabilityBoundingSet", "CAP_KILL CAP_SYS_PTRACE CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER CAP_CHOWN"),
    ("SystemCallFilter", "~@clock @cpu-emulation @module @mount @obsolete @raw-io @reboot @swap"),
    ("SystemCallErrorNumber", "EPERM"),
)


def hardening(*tiers: tuple[tuple[str, str], ...]) -> list[str]:
    """The sandboxing lines of a unit: the common block, then each tier's."""
    return [f"{k}={v}" for k, v in HARDENING + tuple(item for tier in tiers for item in tier)]


LIMITS = (("LimitNOFILE", "1048576"), ("LimitMEMLOCK", "infinity"))


def systemd_quote(arg: str) -> str:
    """One argv element for ExecStart=: quoted when needed, with % and $ kept literal."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if escaped and all(c.isalnum() or c in "@+=:,./-_%$" for c in escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def environment_lines(env: dict[str, str]) -> list[str]:
    lines = []
    for key in sorted(env):
        value = env[key].replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'Environment="{key}={value}"')
    return lines


def exec_start(argv: tuple[str, ...] | list[str]) -> str:
    return "ExecStart=" + " ".join(systemd_quote(a) for a in argv)


def service_unit(description: str, process: Process, read_write: list[str], *, user: str | None,  # noqa: PLR0913 (keyword-only settings of one unit)
                 after: list[str], restart: str, extra: tuple[str, ...] = (),
                 sandbox: tuple[tuple[tuple[str, str], ...], ...] | None = (UNPRIVILEGED,),
                 service_type: str = "exec", wants: tuple[str, ...] = ()) -> str:
    """A hardened service unit running ``process`` verbatim (every long-running process of a deployment but the
    engines, whose template unit is engine_template). ``sandbox`` None: no systemd sandbox (a container unit,
    whose podman needs root and namespaces; the container is the sandbox)."""
    unit = [
        "[Unit]",
        f"Description={description}",
        "After=network-online.target " + " ".join(after),
        "Wants=network-online.target",
        *wants,
    ]
    unit += ["StartLimitIntervalSec=0"] if restart == "always" else []  # restarted however often it fails
    unit += ["", "[Service]", f"Type={service_type}"]
    if user:
        unit += [f"User={user}", f"Group={user}"]
    unit += environment_lines(process.env)
    unit.append(exec_start(process.argv))
    unit += [f"Restart={restart}"] + (["RestartSec=1"] if restart != "no" else [])
    unit += ["KillMode=control-group", *extra, "TimeoutStopSec=10"]
    unit += hardening(*sandbox) if sandbox is not None else []
    unit += [f"{k}={v}" for k, v in LIMITS]
    unit += [f"ReadWritePaths={' '.join(sorted(set(read_write)))}"] if read_write and sandbox is not None else []
    unit += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(unit).replace("After=network-online.target \n", "After=network-online.target\n")


def container_process(plan: Plan, unit: str, process: Process,
                      mounts: list[tuple[str, bool] | tuple[str, bool, str]], extra_env: tuple[str, ...] = ()) -> Process:
    """``process`` run in the deployment's image (python_env_mode container): the same argv and environment, the
    ``mounts`` (path, writable[, target]) and the deployment's secrets (read-only) at the same paths."""
    if plan.container is None:
        raise ValueError("the plan has no container (python_env_mode is not container)")
    secrets = [(plan.security.dir, False)] if plan.security and not plan.security.insecure else []
    argv = podman_run(plan.container, unit, process.argv, [*process.env, *extra_env], mounts + secrets,
                      plan.service_user)
    return Process(host=process.host, argv=tuple(argv), env=process.env, files=process.files)


def container_unit_lines(unit: str) -> tuple[str, ...]:
    """What a container unit adds: its own cgroup subtree for podman (conmon and the container stay in the unit's
    cgroup, --cgroups split), and the container removed after every stop."""
    return ("Delegate=yes", stop_post(unit))


CREDENTIAL_NAMES = ("ETCD_AUTH_USERNAME", "ETCD_AUTH_PASSWORD")  # from dynamo_credentials' EnvironmentFile


def gms_unit(plan: Plan, host: str) -> str:
    description = f"shadowline {plan.deployment}: GPU Memory Service server (residency {plan.residency})"
    process = plan.gms_server_on(host)
    # its residency's socket directory, the service user's (in container mode this runs as root, the server as the
    # service user)
    user = plan.service_user
    residency = (f"ExecStartPre=/usr/bin/install -d -o {user} -g {user} -m 0750 {plan.gms_dir}",)
    if plan.container:
        unit = plan.unit_name("gms")
        return service_unit(description, container_process(plan, unit, process, [(plan.socket_dir, True)]), [],
                            user=None, after=[], restart="on-failure", extra=residency + container_unit_lines(unit),
                            sandbox=None)
    return service_unit(description, process, [plan.socket_dir], user=plan.service_user, after=[],
                        restart="on-failure", extra=residency)


def etcd_unit(plan: Plan, host: str) -> str:
    return service_unit(f"shadowline {plan.deployment}: etcd member", on_host(plan.infra.etcd, host),
                        [f"{plan.state_dir}/etcd"], user=plan.service_user, after=[], restart="on-failure",
                        sandbox=(UNPRIVILEGED, INFRA, NO_JIT))


def etcd_proxy_unit(plan: Plan, host: str) -> str:
    """The host's etcd proxy (HAProxy, deployment/plan_builder.py _etcd_proxy): loopback in, TLS out, as the service user
    in the infra services' sandbox; it writes nothing."""
    return service_unit(f"shadowline {plan.deployment}: etcd proxy (TLS) for Dynamo's processes",
                        on_host(plan.infra.etcd_proxies, host), [], user=plan.service_user, after=[],
                        restart="always", sandbox=(UNPRIVILEGED, INFRA, NO_JIT))


def etcd_proxy_needed(plan: Plan) -> list[str]:
    """The unit Dynamo's processes need to reach etcd (its proxy), none when they reach etcd themselves."""
    return [plan.unit_name("etcd-proxy")] if plan.infra.etcd_proxies else []


def nats_unit(plan: Plan, host: str) -> str:
    return service_unit(f"shadowline {plan.deployment}: NATS with JetStream", on_host(plan.infra.nats, host),
                        [f"{plan.state_dir}/nats"], user=plan.service_user, after=[], restart="on-failure",
                        sandbox=(UNPRIVILEGED, INFRA, NO_JIT))


def frontend_unit(plan: Plan) -> str:
    process = plan.infra.frontend
    proxy = etcd_proxy_needed(plan)
    infra = [plan.unit_name("etcd"), plan.unit_name("nats"), *proxy]
    wants = tuple(f"Wants={unit}" for unit in proxy)
    description = f"shadowline {plan.deployment}: Dynamo frontend (OpenAI API)"
    # always: Dynamo's runtime ends the frontend with status 0 when its etcd lease is lost (a long etcd outage)
    if plan.container:
        unit = plan.unit_name("frontend")
        wrapped = container_process(plan, unit, process, [(process.env["HOME"], True)],
                                    CREDENTIAL_NAMES if plan.secure else ())
        return service_unit(description, wrapped, [], user=None, after=infra, restart="always",
                            extra=dynamo_credentials(plan) + container_unit_lines(unit), sandbox=None, wants=wants)
    return service_unit(description, process, [process.env["HOME"]], user=plan.service_user, after=infra,
                        restart="always", extra=dynamo_credentials(plan), sandbox=(UNPRIVILEGED, INFRA), wants=wants)


def dynamo_credentials(plan: Plan) -> tuple[str, ...]:
    """The EnvironmentFile= line that gives Dynamo's processes their etcd user (ETCD_AUTH_USERNAME/PASSWORD):
    a root-only file systemd reads before it drops privileges, so the password is in no unit file."""
    return (f"EnvironmentFile={plan.security.dynamo_env}",) if plan.secure and plan.security else ()


def engine_template(plan: Plan) -> str:
    """The engine template unit; each cohort's drop-in adds its environment and ExecStart."""
    needs = " ".join([plan.unit_name("gms"), *etcd_proxy_needed(plan)])
    unit = [
        "[Unit]",
        f"Description=shadowline {plan.deployment}: engine cohort %i (one rank of it)",
        f"After=network-online.target {needs}",
        f"Wants=network-online.target {needs}",
        "",
        "[Service]",
        "Type=exec",
        *([] if plan.container else [f"User={plan.service_user}", f"Group={plan.service_user}"]),
        "Restart=no",
        "KillMode=control-group",
        "TimeoutStopSec=5",
        *dynamo_credentials(plan),
    ]
    if plan.container:  # podman as root; the container is the sandbox (deployment/container.py)
        unit += ["Delegate=yes"] + [f"{k}={v}" for k, v in LIMITS] + [""]
        return "\n".join(unit)
    unit += hardening(UNPRIVILEGED) + [f"{k}={v}" for k, v in LIMITS]
    writable = [plan.socket_dir, plan.engines_dir]
    unit += [f"ReadWritePaths={' '.join(writable + lock_dir_writable(plan, writable))}", ""]
    return "\n".join(unit)


def lock_dir_writable(plan: Plan, writable: list[str]) -> list[str]:
    """The failover lock's directory, for a unit that opens the lock (an engine's leader takes it; the agent bridges
    it; both open it O_CREAT|O_RDWR), when ``writable`` (the unit's ReadWritePaths or mounts) does not hold it
    already: a gms_lock_path outside gms_socket_dir, whose flock ProtectSystem=strict would refuse (issue #42).
    The base role makes that directory (deployment/directories.py)."""
    held = any(plan.lock_dir == path or plan.lock_dir.startswith(path.rstrip("/") + "/") for path in writable)
    return [] if held else [plan.lock_dir]


UNIT_DIR = "/etc/systemd/system"


def engine_dropin_dir(plan: Plan, cohort: int) -> str:
    """The directory of a cohort's drop-ins (plan.conf: its command and environment; model.conf)."""
    return f"{UNIT_DIR}/{plan.unit_name('engine', cohort)}.d"


def installed_config(dropin: str) -> str:
    """The cohort configuration digest in an engine drop-in's text ("" when it has none)."""
    prefix = f'Environment="{CONFIG_ENV}='
    return next((line[len(prefix):].rstrip('"') for line in dropin.splitlines() if line.startswith(prefix)), "")


CONFIG_ENV = "SHADOWLINE_COHORT_CONFIG"  # a rank's cohort configuration digest, in its environment (cohort_config)


def cohort_config(plan: Plan, cohort: int) -> str:
    """The digest of one cohort's configuration on every node together: each node's drop-in (command,
    environment, paths, container) and the template unit, as rendered for this plan. Every rank of the cohort
    carries it in its environment (``SHADOWLINE_COHORT_CONFIG``): ranks of one generation started from files of
    two configurations (an upgrade's files installed on one node and not yet on another) differ in it, which the
    agents refuse at start and declare failed when they find it running (control/node_duties.start_refusal,
    control/driver_duties.mixed_generations). The model digest (model.conf) is not part of it: the readiness
    gate holds every node to the same one."""
    digest = hashlib.sha256(engine_template(plan).encode())
    for node in sorted(plan.nodes, key=lambda n: n.rank):
        digest.update(f"\0{node.host}\0".encode() + _engine_dropin(plan, node.host, cohort, {}).encode())
    return digest.hexdigest()[:16]


def engine_dropin(plan: Plan, host: str, cohort: int) -> str:
    return _engine_dropin(plan, host, cohort, {CONFIG_ENV: cohort_config(plan, cohort)})


def _engine_dropin(plan: Plan, host: str, cohort: int, config: dict[str, str]) -> str:
    process = plan.cohort(cohort).rank_on(host).process
    env = {**process.env, "HOME": f"{plan.engines_dir}/{cohort}", **config}
    lines = ["[Service]"] + environment_lines(env)
    if plan.container:
        unit = plan.unit_name("engine", cohort)
        mounts = [(plan.socket_dir, True), (f"{plan.engines_dir}/{cohort}", True), (plan.model_dir, False, plan.model_view),
                  ("/dev/null", False, f"{plan.model_view}/{MANIFEST_NAME}")]
        mounts += [(path, True) for path in lock_dir_writable(plan, [plan.socket_dir])]
        wrapped = container_process(plan, unit, Process(host=host, argv=process.argv, env=env), mounts,
                                    CREDENTIAL_NAMES if plan.secure else ())
        return "\n".join(lines + [exec_start(wrapped.argv), stop_post(unit), ""])
    # the cohort's revision at the one path every revision's engines name (Plan.model_view), read-only, without
    # shadowline's manifest (it names the revision, and Dynamo's model card checksums every file of the directory
    # but the weights and hidden files: a manifest that differs would change the card)
    view = [f"BindReadOnlyPaths={plan.model_dir}:{plan.model_view}",
            f"BindReadOnlyPaths=/dev/null:{plan.model_view}/{MANIFEST_NAME}"]
    return "\n".join(lines + view + [exec_start(process.argv), ""])


def engine_model_dropin(digest: str) -> str:
    """A cohort's second drop-in (model.conf): the manifest digest of the model its ranks were started on.

    The engine role writes it after the readiness gate passed, so a restaged model with other content changes
    the unit and the cohort restarts on it; `systemctl show -p Environment` tells which model a rank runs.
    """
    return "\n".join(["[Service]"] + environment_lines({"SHADOWLINE_MODEL_DIGEST": digest}) + [""])


AGENT_WATCHDOG_S = 20  # longer than any one step of the loop may block (a systemctl call, an etcd deadline)


def agent_process(plan: Plan, host: str) -> Process:
    """The node agent's command: the runtime's interpreter, the plan the agent role writes, this node."""
    return Process(host=host, argv=(plan.python, "-m", "shadowline.control.agent", "--plan", plan.plan_path,
                                    "--host", host), env={"SHADOWLINE_DEPLOYMENT": plan.deployment})


def agent_unit(plan: Plan, host: str) -> str:
    """The node agent: root (it stops and starts the engine units and kills their cgroups), never restarted
    into a second copy (it holds a lock), its state and event log under the deployment's state directory.
    Restarted however often it fails (no start limit: a node without its agent has no failover at all), and when
    its loop stops ticking: it tells systemd it is ready and alive (common/systemd_notify.py), and systemd kills
    and restarts an agent silent for AGENT_WATCHDOG_S."""
    return service_unit(f"shadowline {plan.deployment}: failover agent", agent_process(plan, host),
                        [plan.state_dir, plan.socket_dir, *lock_dir_writable(plan, [plan.state_dir, plan.socket_dir])],
                        user=None, after=[], restart="always",
                        extra=("RestartPreventExitStatus=3", "NotifyAccess=main", f"WatchdogSec={AGENT_WATCHDOG_S}",
                               "WatchdogSignal=SIGABRT"), sandbox=(AGENT,), service_type="notify")
