"""systemd units for every process of a plan, rendered in one place for all roles.

Units run the plan's argv and environment verbatim, as the service user, hardened, with
KillMode=control-group so stopping a unit kills every process of it. Engines are a template unit
(one instance per cohort) whose per-cohort drop-in carries that cohort's command and environment;
they never restart themselves: relaunch belongs to the failover agent.
Functions take the plan in its dict form (the `gms_plan` fact), so Ansible filters can call them.
"""

from __future__ import annotations

from typing import Any

Plan = dict[str, Any]

HARDENING = (
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectControlGroups", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"),
)
LIMITS = (("LimitNOFILE", "1048576"), ("LimitMEMLOCK", "infinity"))


def unit_name(plan: Plan, kind: str, cohort: int | None = None) -> str:
    """shadowline-<deployment>-<kind>.service, or the engine instance / template name."""
    base = f"shadowline-{plan['deployment']}-{kind}"
    if kind == "engine":
        return f"{base}@{cohort}.service" if cohort is not None else f"{base}@.service"
    return f"{base}.service"


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


def exec_start(argv: list[str]) -> str:
    return "ExecStart=" + " ".join(systemd_quote(a) for a in argv)


def _service(plan: Plan, description: str, process: dict[str, Any], read_write: list[str], *, user: str | None,
             after: list[str], requires: list[str], restart: str) -> str:
    unit = [
        "[Unit]",
        f"Description={description}",
        "After=network-online.target " + " ".join(after),
        "Wants=network-online.target",
    ]
    unit += [f"Requires={name}" for name in requires]
    unit += ["", "[Service]", "Type=exec"]
    if user:
        unit += [f"User={user}", f"Group={user}"]
    unit += environment_lines(process["env"])
    unit.append(exec_start(process["argv"]))
    unit += [f"Restart={restart}"] + (["RestartSec=1"] if restart != "no" else [])
    unit += ["KillMode=control-group", "TimeoutStopSec=10"]
    unit += [f"{k}={v}" for k, v in HARDENING + LIMITS]
    unit += [f"ReadWritePaths={' '.join(sorted(set(read_write)))}"] if read_write else []
    unit += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(unit).replace("After=network-online.target \n", "After=network-online.target\n")


def gms_unit(plan: Plan, host: str) -> str:
    process = _on_host(plan["gms_servers"], host)
    return _service(plan, f"shadowline {plan['deployment']}: GPU Memory Service server", process,
                    [plan["socket_dir"]], user=plan["service_user"], after=[], requires=[], restart="on-failure")


def etcd_unit(plan: Plan, host: str) -> str:
    process = _on_host(plan["infra"]["etcd"], host)
    return _service(plan, f"shadowline {plan['deployment']}: etcd member", process,
                    [f"{plan['state_dir']}/etcd"], user=plan["service_user"], after=[], requires=[],
                    restart="on-failure")


def nats_unit(plan: Plan, host: str) -> str:
    process = _on_host(plan["infra"]["nats"], host)
    return _service(plan, f"shadowline {plan['deployment']}: NATS with JetStream", process,
                    [f"{plan['state_dir']}/nats"], user=plan["service_user"], after=[], requires=[],
                    restart="on-failure")


def frontend_unit(plan: Plan) -> str:
    process = plan["infra"]["frontend"]
    infra = [unit_name(plan, "etcd"), unit_name(plan, "nats")]
    return _service(plan, f"shadowline {plan['deployment']}: Dynamo frontend (OpenAI API)", process,
                    [process["env"]["HOME"]], user=plan["service_user"], after=infra, requires=[],
                    restart="on-failure")


def engine_template(plan: Plan) -> str:
    """The engine template unit; each cohort's drop-in adds its environment and ExecStart."""
    unit = [
        "[Unit]",
        f"Description=shadowline {plan['deployment']}: engine cohort %i (one rank of it)",
        f"After=network-online.target {unit_name(plan, 'gms')}",
        f"Wants=network-online.target {unit_name(plan, 'gms')}",
        "",
        "[Service]",
        "Type=exec",
        f"User={plan['service_user']}",
        f"Group={plan['service_user']}",
        "Restart=no",
        "KillMode=control-group",
        "TimeoutStopSec=5",
    ]
    unit += [f"{k}={v}" for k, v in HARDENING + LIMITS]
    unit += [f"ReadWritePaths={plan['socket_dir']} {plan['state_dir']}/engines"]
    unit += [f"ReadOnlyPaths={plan['model_dir']}", ""]
    return "\n".join(unit)


def engine_dropin(plan: Plan, host: str, cohort: int) -> str:
    rank = _on_host([r["process"] for r in plan["cohorts"][cohort]["ranks"]], host)
    env = {**rank["env"], "HOME": f"{plan['state_dir']}/engines/{cohort}"}
    lines = ["[Service]"] + environment_lines(env) + [exec_start(rank["argv"]), ""]
    return "\n".join(lines)


def engine_model_dropin(digest: str) -> str:
    """A cohort's second drop-in (model.conf): the manifest digest of the model its ranks were started on.

    The engine role writes it after the readiness gate passed, so a restaged model with other content changes
    the unit and the cohort restarts on it; `systemctl show -p Environment` tells which model a rank runs.
    """
    return "\n".join(["[Service]"] + environment_lines({"SHADOWLINE_MODEL_DIGEST": digest}) + [""])


def agent_unit(plan: Plan, host: str) -> str:
    """The node agent: root (it stops and starts the engine units and kills their cgroups), never restarted
    into a second copy (it holds a lock), its state and event log under the deployment's state directory."""
    python = plan["gms_servers"][0]["argv"][0]
    process = {"argv": [python, "-m", "shadowline.control.agent", "--plan", f"{plan['config_dir']}/plan.json",
                        "--host", host], "env": {"SHADOWLINE_DEPLOYMENT": plan["deployment"]}}
    text = _service(plan, f"shadowline {plan['deployment']}: failover agent", process,
                    [plan["state_dir"], plan["socket_dir"]], user=None, after=[], requires=[],
                    restart="always")
    return text.replace("KillMode=control-group", "KillMode=control-group\nRestartPreventExitStatus=3")


def _on_host(processes: list[dict[str, Any]], host: str) -> dict[str, Any]:
    for process in processes:
        if process["host"] == host:
            return process
    raise KeyError(f"the plan has no such process on {host}")
