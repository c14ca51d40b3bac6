"""The `shadowline` command: the library's tools for a person at a terminal.

  shadowline plan -i INVENTORY [--json]   the cohort plan of an inventory: every rank, its ports and command line
  shadowline render-slurm -i INVENTORY    a ready-to-submit sbatch script (what slurm/render does)
  shadowline drill-report FILE            the table and SVG timeline of a drill report (playbooks/drill.yml)
  shadowline status [-i INVENTORY]        the status table from live state (what playbooks/status.yml prints);
                  [-o table|json|yaml]    exit status 0 only when every rank is active, parked or running
                  [--watch [SECONDS]]     again every SECONDS (2) until Ctrl-C, or --count N times
  shadowline pause|resume -i INVENTORY    automatic failover paused for maintenance, or resumed (pause.yml)
  shadowline failover -i INVENTORY --cohort N [--mode M] | --unfence NODE   playbooks/failover.yml
  shadowline switchover -i INVENTORY      the serving cohort handed over to a parked shadow (failover.yml)
  shadowline history -i INVENTORY | --events PATH | --reports PATH   the agents' events, or drill reports
  shadowline completion bash|zsh          a completion script: eval "$(shadowline completion bash)"
  shadowline --version

Installed with the package (`pip install .`: the console script `shadowline`); scripts/show-plan and
slurm/render in a checkout call it. Subcommands that read an inventory run Ansible (ansible, ansible-playbook
beside this interpreter or on PATH) with the checkout's ansible.cfg when there is one.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path
from types import ModuleType
from typing import Callable

from .ansible_runner import CHECKOUT, PROG, ansible_env, ansible_tool, failure_of, in_checkout, messages, run_playbook
from .common import console
from .completion import bash_completion, zsh_completion
from .deployment.plan import Plan


def plan_of(inventory: str) -> dict:
    """The plan as shadowline.gms.cohort_plan computes it: Ansible templates the inventory, no host is contacted.
    The module's result is read from the file ansible-core's own tree callback writes for the host (not from
    ``ansible -o``'s one-line screen format)."""
    with tempfile.TemporaryDirectory(prefix="shadowline-plan-") as tree:
        env = {**ansible_env(), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.tree",
               "ANSIBLE_CALLBACK_TREE_DIR": tree}
        run = subprocess.run([ansible_tool("ansible"), "-i", inventory, "gms_nodes[0]", "-m",
                              "shadowline.gms.cohort_plan"], capture_output=True, text=True,
                             cwd=CHECKOUT if in_checkout() else None, env=env, check=False)
        results = [json.loads(path.read_text()) for path in Path(tree).iterdir()]
    if not results:
        from .deployment.contract import NODES_GROUP, missing_group_problem
        from .slurm.render import read_with_ansible
        groups = read_with_ansible(ansible_tool("ansible-inventory"), inventory)[1]
        if not groups.get(NODES_GROUP):  # preflight's refusal, word for word (filter group_problem)
            raise SystemExit(f"{PROG} plan: {missing_group_problem(NODES_GROUP, groups)}")
        raise SystemExit(f"{PROG} plan: no node in group gms_nodes of {inventory}, or ansible failed:\n"
                         f"{run.stdout[-2000:]}{run.stderr[-2000:]}")
    result = results[0]
    if result.get("failed") or "plan" not in result:
        raise SystemExit(f"{PROG} plan: {result.get('msg', 'the cohort plan failed')}")
    return result["plan"]


def version() -> str:
    """The installed package's version, else the checkout's galaxy.yml one."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed
    try:
        return installed(PROG)
    except PackageNotFoundError:
        galaxy = CHECKOUT / "galaxy.yml"
        lines = galaxy.read_text().splitlines() if galaxy.exists() else []
        return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("version:")), "unknown")


# -- subcommands ---------------------------------------------------------------------------------------------- #

def cmd_plan(args: argparse.Namespace) -> int:
    inventory = args.inventory or args.inventory_positional
    if not inventory:
        raise SystemExit(f"{PROG} plan: give -i INVENTORY")
    plan = plan_of(inventory)
    if args.json:
        console.out(json.dumps(plan, indent=2))
        return 0
    for line in plan_lines(plan):
        console.out(line)
    return 0


def plan_lines(data: dict) -> list[str]:
    plan = Plan.from_dict(data)
    lines = [f"deployment {plan.deployment}: backend {plan.backend}, "
             f"model {plan.model_id}@{plan.revision[:12]}, lock {plan.lock_path}"]
    if plan.fleet:
        lines.append(f"fleet: {len(plan.replicas)} replicas of {len(plan.replicas[0].members)} node(s), each driven "
                     "by its own leader node's agent, one frontend over all (docs/fleet.md)")
    infra = plan.infra
    lines.append(f"infra: etcd {infra.etcd_endpoints}  nats {infra.nats_server}  frontend {infra.frontend_url}")
    for replica in plan.replicas:  # one replica (today's deployment): its cohorts only, as before fleets
        indent = "  " if plan.fleet else ""
        if plan.fleet:
            lines.append(f"replica {replica.id}: {', '.join(replica.members)} (leader {replica.leader}, "
                         f"master address {replica.master_address})")
        for cohort in replica.cohorts:
            p = cohort.ports
            lines.append(f"{indent}cohort {cohort.cohort} ({cohort.role}, ENGINE_ID={cohort.engine_id}) "
                         f"master {p.master} system {p.system} nixl {p.nixl}")
            for rank in cohort.ranks:
                kind = "leader" if rank.leader else "headless"
                lines.append(f"{indent}  {rank.host} rank {rank.node_rank} ({kind}): {rank.process.command_line()}")
    lines += [f"spare {s.host} ({s.address}): GMS server and agent, no rank" for s in plan.spares]
    monitoring = plan.monitoring
    if monitoring and monitoring.mode != "none":
        lines.append(f"monitoring: {monitoring.mode} on {monitoring.host} "
                     f"(Prometheus http://{monitoring.address}:{monitoring.port})")
    return lines


def cmd_render_slurm(args: argparse.Namespace) -> int:
    from .slurm import render
    return render.run(args)


def cmd_drill_report(args: argparse.Namespace) -> int:
    return run_drill_tool("table", args.file, *(["--svg", args.svg] if args.svg is not None else []))


def run_drill_tool(*argv: str) -> int:
    """The drill report tooling, run as its own program (``python -m shadowline.drill.report_tool``, so that no
    production command imports drill/): its output is the command's, its refusal (exit status 1 and one line on
    stderr) the command's refusal, its exit status the command's."""
    package_root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    run = subprocess.run([sys.executable, "-m", "shadowline.drill.report_tool", *argv], capture_output=True,
                         text=True, env=env, check=False)
    for line in run.stdout.splitlines():
        console.out(line)
    if run.returncode != 0 and run.stderr.strip():
        raise SystemExit(run.stderr.rstrip("\n"))
    for line in run.stderr.splitlines():
        console.err(line)
    return run.returncode


def cmd_status(args: argparse.Namespace) -> int:
    dump = status_dumper(args.output)  # before anything runs: -o yaml without PyYAML is refused at once
    if args.watch is None:
        return status_once(args, dump)
    title = "shadowline status " + (f"--plan {args.plan}" if args.plan else f"-i {args.inventory}")
    return watch(lambda: status_once(args, dump), args.watch, args.count, title)


def status_once(args: argparse.Namespace, dump: Callable[[dict], str] | None) -> int:
    if args.plan:
        return local_status(args.plan, args.host, dump)
    run = run_playbook("status", args.inventory)
    lines = status_lines(run.stdout)
    if run.returncode != 0 or not lines:
        console.err(run.stdout + run.stderr)
    from .cluster.status_table import status_document, table_failover, table_rows, table_spares, table_states, whole
    if dump is not None:
        console.out(dump(status_document(*table_rows(lines), table_failover(lines), table_spares(lines))))
    else:
        for line in lines:
            console.out(line)
    return run.returncode or (0 if whole(table_states(lines)) else 1)


WATCH_MAX_S = 3600.0
CLEAR = "\033[H\033[2J"  # cursor home, clear the screen (a terminal only)


def watch(refresh: Callable[[], int], every: float, count: int | None, title: str,
          sleep: Callable[[float], None] | None = None) -> int:
    """``refresh`` every ``every`` seconds, ``count`` times or until Ctrl-C (exit status 0); each refresh is
    printed whole once done, under a header with the time (on a terminal the screen is cleared first). The exit
    status of the last refresh otherwise."""
    done, code = 0, 0
    try:
        while True:
            printed = io.StringIO()
            with redirect_stdout(printed):
                code = refresh()
            done += 1
            header = f"Every {every:g} s: {title}    {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}"
            sys.stdout.write((CLEAR if sys.stdout.isatty() else "\n" if done > 1 else "") + header + "\n\n"
                             + printed.getvalue())
            sys.stdout.flush()
            if count is not None and done >= count:
                return code
            (sleep or time.sleep)(every)
    except KeyboardInterrupt:
        return 0


def cmd_pause(args: argparse.Namespace) -> int:
    """pause / resume: playbooks/pause.yml, its last message printed (what failover is now)."""
    paused = args.command == "pause"
    extra = {"paused": paused, "reason": getattr(args, "reason", "") or ""}
    run = run_playbook("pause", args.inventory, extra, check=args.check)
    said = messages(run.stdout, "deployment ")
    if run.returncode != 0 or not said:
        console.err(run.stdout + run.stderr)
        return run.returncode or 1
    console.out(said[-1])
    return 0


def cmd_failover(args: argparse.Namespace) -> int:
    """failover: playbooks/failover.yml for one cohort (-e cohort, mode; a fleet's replica: -e replica), or a node's
    fence lifted (-e unfence)."""
    if args.unfence is not None:
        for option, value in (("--mode", args.mode), ("--replica", args.replica)):
            if value is not None:
                raise SystemExit(f"{PROG} failover: {option} is for --cohort; --unfence {args.unfence} takes none "
                                 "(a node is unfenced whatever its replica)")
        return run_failover("failover", args.inventory, {"unfence": args.unfence}, re.escape(args.unfence) + ": ",
                            args.check)
    extra = {"cohort": args.cohort, "mode": args.mode or "planned", **replica_extra(args.replica)}
    return run_failover("failover", args.inventory, extra, r"cohort [0-9]+: ", args.check)


def replica_extra(replica: int | None) -> dict[str, int]:
    """failover.yml's ``replica`` extra variable for --replica (none given: none passed, and failover.yml refuses a
    fleet naming the replicas there are)."""
    return {} if replica is None else {"replica": replica}


def cmd_switchover(args: argparse.Namespace) -> int:
    """switchover: the serving cohort (from playbooks/status.yml's lock holder) handed over to a parked shadow:
    playbooks/failover.yml with mode handover (the serving worker drained first, as upgrade.yml does)."""
    from .cluster.status_table import replica_holders, table_rows
    from .cluster.switchover import Refused, replica_rows, switchover_cohort
    run = run_playbook("status", args.inventory)
    lines = status_lines(run.stdout)
    rows, holder = table_rows(lines)
    if run.returncode != 0 or not rows:
        console.err(run.stdout + run.stderr)
        raise SystemExit(f"{PROG} switchover: cannot read the status of {args.inventory} (playbooks/status.yml, "
                         "above); nothing was changed")
    try:
        rows, holder = replica_rows(rows, holder, replica_holders(lines), args.replica)
        serving = switchover_cohort(rows, holder, args.cohort)
    except Refused as err:
        raise SystemExit(f"{PROG} switchover: {err}") from None
    where = "" if args.replica is None else f" of replica {args.replica}"
    console.out(f"cohort {serving}{where} serves: handing it over to a parked shadow (failover.yml mode=handover"
                + (", check mode)" if args.check else ")"))
    return run_failover("switchover", args.inventory, {"cohort": serving, "mode": "handover",
                                                       **replica_extra(args.replica)},
                        r"cohort [0-9]+: ", args.check)


def run_failover(command: str, inventory: str, extra: dict, said: str, check: bool) -> int:
    """playbooks/failover.yml with ``extra``; its last message that starts as ``said`` (a pattern) is printed. In
    check mode the module's own "would ..." (shown with -v) is what it says."""
    run = run_playbook("failover", inventory, extra, check=check, verbose=check)
    found = messages(run.stdout, said + ("|would " if check else ""))
    if run.returncode != 0 or not found:
        console.err(run.stdout + run.stderr)
        why = failure_of(run.stdout)
        if why:
            console.err(f"{PROG} {command}: {why}")
        return run.returncode or 1
    console.out(("check mode, nothing changed: " if check else "") + found[-1])
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    """history: the agents' events (every node's, through playbooks/history.yml, or files here) or drill reports,
    in time order."""
    from .cluster import history
    option = "-i" if args.inventory else "--events" if args.events else "--reports"
    try:
        if args.reports:
            return show_reports(Path(args.reports), args)
        events = history.read_events_at(Path(args.events)) if args.events else node_events(history, args)
    except history.HistoryError as err:
        raise SystemExit(f"{PROG} history {option}: {err}") from None
    chosen = history.select(events, args.since, args.limit)
    if args.output == "json":
        console.out(json.dumps(chosen, indent=2))
    elif chosen:
        for line in history.event_lines(chosen):
            console.out(line)
    else:
        console.err(f"{PROG} history: no events" + (" since then" if args.since is not None else ""))
    return 0


def node_events(history: ModuleType, args: argparse.Namespace) -> list[dict]:
    """Every node's last events (playbooks/history.yml); a node that has none says so on stderr."""
    run = run_playbook("history", args.inventory, {"history_lines": max(args.limit or 0, HISTORY_LINES)})
    lines = task_lines(run.stdout, HISTORY_TASK)
    if run.returncode != 0 or not lines:
        console.err(run.stdout + run.stderr)
        if not lines:
            raise SystemExit(f"{PROG} history -i: playbooks/history.yml printed no events of {args.inventory} "
                             f"(exit status {run.returncode}, its output above)")
    events, said = history.events_of_text("\n".join(lines), f"the events of {args.inventory}")
    for line in said:
        console.err(f"{PROG} history: {line}")
    return events


def show_reports(path: Path, args: argparse.Namespace) -> int:
    """The drill reports of ``path`` (a file or a directory), one line each (the drill report tooling's list)."""
    return run_drill_tool("list", str(path), *(["--since", repr(args.since)] if args.since is not None else []),
                          *(["--limit", str(args.limit)] if args.limit else []), "-o", args.output)


HISTORY_TASK = "TASK [Print the events of every node]"
HISTORY_LINES = 1000  # each node's last lines read by -i, at least


# -- values of options ------------------------------------------------------------------------------------------ #

def watch_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or value > WATCH_MAX_S:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds between refreshes: give one "
                                         f"above 0 and at most {WATCH_MAX_S:g} (e.g. --watch 2)")
    return value


def at_least(least: int, what: str) -> Callable[[str], int]:
    def number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}: give a whole number, {least} or more")
        return value
    return number


def since_time(text: str) -> float:
    from .cluster.history import parse_since
    try:
        return parse_since(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time: give a duration back from now (90s, 10m, 2h, 1d), "
                                         "a UTC time (2026-11-22T09:15:44Z, 2026-11-22) or unix seconds") from None


def status_dumper(output: str) -> Callable[[dict], str] | None:
    """How -o prints the status as data (None: the table)."""
    if output == "json":
        return lambda data: json.dumps(data, indent=2)
    if output == "yaml":
        try:
            import yaml
        except ImportError:
            raise SystemExit(f"{PROG} status: -o yaml needs PyYAML, which this Python ({sys.executable}) does "
                             "not have: pip install pyyaml, or use -o json") from None
        return lambda data: yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip("\n")
    return None


STATUS_TASK = "TASK [Print the status table]"


def status_lines(output: str) -> list[str]:
    """The table lines of playbooks/status.yml (printed by shadowline.gms.show between its task banner and the
    task's result line)."""
    return task_lines(output, STATUS_TASK)


def task_lines(output: str, banner: str) -> list[str]:
    """The lines shadowline.gms.show printed in the last task named by ``banner`` (between the banner and the
    task's result line)."""
    start = output.rfind(banner)
    if start < 0:
        return []
    lines = []
    for line in output[start:].splitlines()[1:]:
        if line.startswith(("ok: [", "changed: [", "fatal: [", "skipping: [")):
            return lines
        lines.append(line)
    return []


def local_status(plan_path: str, host: str | None, dump: Callable[[dict], str] | None = None) -> int:
    """This node's rows, read here without Ansible (on a node: the plan.json the agent role writes)."""
    from .cluster.cohort_state import lock_holder, rank_states
    from .cluster.status_table import render_status_table, status_document, status_rows, whole
    from .deployment.plan import Plan
    try:
        plan = Plan.load(plan_path)
    except OSError as err:
        raise SystemExit(f"{PROG} status: cannot read the plan {plan_path}: {err.strerror}") from None
    except (ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"{PROG} status: {plan_path} is not a shadowline plan.json ({type(err).__name__}: {err})"
                         ) from None
    if host is not None and host not in plan.hosts:
        raise SystemExit(f"{PROG} status: --host {host} is not a node of deployment {plan.deployment} "
                         f"(nodes: {', '.join(plan.hosts)})")
    host = host or next((n.host for n in plan.nodes if n.host == os.uname().nodename), plan.leader_node.host)
    ranks = rank_states(plan, host, plan.failover.health_timeout_s)
    holder = lock_holder(plan.lock_path) if any(r["leader"] for r in ranks) else None
    model = f"{plan.model_id}@{plan.revision[:12]}"
    if dump is not None:
        console.out(dump(status_document(status_rows(ranks, holder, model), holder)))
    else:
        console.out(render_status_table(ranks, holder, model))
    return 0 if whole([r["state"] for r in ranks]) else 1


def cmd_completion(args: argparse.Namespace) -> int:
    script = zsh_completion if args.shell == "zsh" else bash_completion
    console.out(script(build_parser()))
    return 0


# -- the parser ----------------------------------------------------------------------------------------------- #

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="shadowline: shadow-engine failover for GPU clusters (NVIDIA Dynamo GMS), without Kubernetes.",
        epilog="Each subcommand has its own --help. Deploying, drills and failovers are playbooks "
               "(ansible-playbook -i INVENTORY playbooks/site.yml ...): see README.md.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, func: Callable[[argparse.Namespace], int], summary: str, description: str
            ) -> argparse.ArgumentParser:
        sub = subs.add_parser(name, help=summary, description=description,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.set_defaults(func=func)
        return sub

    plan = add("plan", cmd_plan, "print the cohort plan of an inventory",
               "Print the cohort plan of an inventory: the deployment, its infra endpoints, and one line per rank of "
               "every cohort with its ports and exact command line.\nAnsible reads and templates the inventory and "
               "shadowline.gms.cohort_plan builds the plan; no host is contacted.")
    plan.add_argument("-i", "--inventory", help="inventory file or directory (as for ansible-playbook -i)")
    plan.add_argument("inventory_positional", nargs="?", metavar="INVENTORY", help="the same, as an argument")
    plan.add_argument("--json", action="store_true", help="print the whole plan as JSON (the gms_plan fact)")

    slurm = add("render-slurm", cmd_render_slurm, "render a ready-to-submit sbatch script",
                "Render a ready-to-submit Slurm batch script of a deployment from its inventory (slurm/render does "
                "the same).\nThe inventory is read with `ansible-inventory --list` when it is installed, else with "
                "PyYAML (YAML inventories with group_vars/ and host_vars/); \"{{ ... }}\" values are templated "
                "with Jinja2 as Ansible would for simple expressions. No host is contacted: the nodes come from the "
                "Slurm allocation; only the number of hosts in the group (or gms_engine.nnodes) and the "
                "deployment's variables are used. Exit status 1 lists every problem.")
    source = slurm.add_mutually_exclusive_group(required=True)
    source.add_argument("--inventory", "-i", help="inventory file or directory (as for ansible-playbook -i)")
    source.add_argument("--vars-json", help="the deployment's gms_* values as JSON (templated by Ansible)")
    slurm.add_argument("--hosts", type=int, default=1, help="with --vars-json: hosts in the group (the node count "
                       "unless gms_engine.nnodes is set)")
    slurm.add_argument("--group", default="gms_nodes", help="the inventory group of the deployment "
                       "(default gms_nodes)")
    out = slurm.add_mutually_exclusive_group()
    out.add_argument("--out", "-o", help="the script to write (default: <job name>.sbatch in the current directory)")
    out.add_argument("--out-dir", help="write <job name>.sbatch into this directory")
    slurm.add_argument("--no-ansible", action="store_true",
                       help="read the inventory with PyYAML even if Ansible is installed")

    drill = add("drill-report", cmd_drill_report, "table and SVG timeline of a drill report",
                "Print the timeline table of a drill report (the JSON playbooks/drill.yml writes with "
                "-e drill_report=PATH) and draw its SVG timeline beside it. Exit status 1 when the drill failed.")
    drill.add_argument("file", metavar="FILE", help="the drill report (JSON)")
    drill.add_argument("--svg", help="where to write the SVG (default: FILE with .svg; - for none)")

    status = add("status", cmd_status, "the status table from live state",
                 "One table from live state: cohort, role, node, rank, pid, state (parked / waking / active / wedged "
                 "/ dead), lock holder, ports, model.\nWith -i: every node, through Ansible (playbooks/status.yml). "
                 "With --plan: this node only, read here (on a node: /etc/shadowline/<deployment>/plan.json).\n"
                 "Exit status 0 when every rank shown is active, parked or running; 1 otherwise (a rank dead, "
                 "wedged, starting or waking, or no answer).")
    where = status.add_mutually_exclusive_group()
    where.add_argument("-i", "--inventory", default="inventories/testbed" if in_checkout() else None,
                       help="inventory (default in a checkout: inventories/testbed, the testbed deployment)")
    where.add_argument("--plan", help="a plan.json: read this node's ranks without Ansible")
    status.add_argument("--host", help="with --plan: the node's inventory name (default: this host's name)")
    status.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table",
                        help="table (default), or the same rows and lock holder as JSON or YAML (YAML needs PyYAML)")
    status.add_argument("-w", "--watch", nargs="?", const=2.0, type=watch_seconds, metavar="SECONDS",
                        help="again every SECONDS (default 2) until Ctrl-C, each under a header with the time")
    status.add_argument("--count", type=at_least(1, "a number of refreshes"), metavar="N",
                        help="with --watch: stop after N refreshes (the exit status is the last one's)")

    for name, summary in (("pause", "pause automatic failover for maintenance"),
                          ("resume", "resume automatic failover")):
        sub = add(name, cmd_pause, summary,
                  f"{summary[0].upper() + summary[1:]} (playbooks/pause.yml on the leader node), as patronictl's "
                  "pause and resume.\nWhile paused the agents watch and report but declare no cohort failed and "
                  "relaunch nothing (each held decision is a failover-held event); a failover.yml run still fails "
                  "a cohort over. On resume every agent restarts and reconciles what it finds.")
        sub.add_argument("-i", "--inventory", required=True, help="inventory (as for ansible-playbook -i)")
        if name == "pause":
            sub.add_argument("--reason", default="", help="why (kept in the pause record and the agents' events)")
        sub.add_argument("--check", action="store_true", help="say what would change, change nothing")

    failover = add("failover", cmd_failover, "fail a cohort over on every node at once, or unfence a node",
                   "Fail one cohort over on every node at once (playbooks/failover.yml), as an agent does when it "
                   "detects a failure: its generation is declared failed, every node tears its rank down, a parked "
                   "shadow takes the lock (when it served) and the cohort is relaunched as a fresh shadow; the "
                   "timeline is printed. A cohort the agents gave up on (dead) is revived.\nModes: planned (default: "
                   "refused while the cohort serves and no shadow is parked; SIGTERM, the engines drain), handover "
                   "(the same refusal; the serving worker taken out of routing first, then ended at once), forced "
                   "(anyway).\n--unfence NODE returns a node fenced for a GPU fault to service instead.")
    failover.add_argument("-i", "--inventory", required=True, help="inventory (as for ansible-playbook -i)")
    target = failover.add_mutually_exclusive_group(required=True)
    target.add_argument("--cohort", type=at_least(0, "a cohort number"), metavar="N",
                        help="the cohort to fail over (0 is the primary; `shadowline plan` lists them)")
    target.add_argument("--unfence", metavar="NODE", help="the inventory name of a fenced node to return to service")
    failover.add_argument("--replica", type=at_least(0, "a replica number"), metavar="N",
                          help="a fleet (docs/fleet.md): the replica whose cohort fails over (required there)")
    failover.add_argument("--mode", choices=["planned", "handover", "forced"],
                          help="planned (default), handover or forced (see above)")
    failover.add_argument("--check", action="store_true", help="say what would be done, change nothing")

    switchover = add("switchover", cmd_switchover, "hand the serving cohort over to a parked shadow",
                     "Hand the serving cohort over to a parked shadow, as patronictl switchover: the lock holder is "
                     "read first (playbooks/status.yml), then playbooks/failover.yml fails it over with mode "
                     "handover (its worker taken out of the frontend's routing and its streams let end, then a "
                     "parked shadow takes the lock; the old cohort is relaunched as a shadow).\nRefused, changing "
                     "nothing, when no cohort serves, when --cohort names one that does not, or when no shadow "
                     "is parked to take over.")
    switchover.add_argument("-i", "--inventory", required=True, help="inventory (as for ansible-playbook -i)")
    switchover.add_argument("--cohort", type=at_least(0, "a cohort number"), metavar="N",
                            help="the cohort you expect to serve: refused if another one does")
    switchover.add_argument("--replica", type=at_least(0, "a replica number"), metavar="N",
                            help="a fleet (docs/fleet.md): the replica whose serving cohort is handed over "
                                 "(required there)")
    switchover.add_argument("--check", action="store_true", help="say what would be done, change nothing")

    history = add("history", cmd_history, "the agents' events, or drill reports, in time order",
                  "The agents' decisions (the events of events.jsonl: failures declared, promotions, relaunches, "
                  "pauses...) in time order, one line each: time (UTC), node, cohort/generation, event, reason.\n"
                  "-i: every node's, through playbooks/history.yml (read-only: the last lines of each node's "
                  "<state_dir>/events.jsonl, at least 1000; the rotated files are not read). --events: files here "
                  "(an events.jsonl with its rotations beside it, or every *events.jsonl under a directory; a Slurm "
                  "job directory too). --reports: drill reports (the JSON playbooks/drill.yml writes with "
                  "-e drill_report=PATH), one line each with their key figures.")
    source = history.add_mutually_exclusive_group(required=True)
    source.add_argument("-i", "--inventory", help="inventory (as for ansible-playbook -i)")
    source.add_argument("--events", metavar="FILE|DIR", help="events files here (events.jsonl, JSON lines)")
    source.add_argument("--reports", metavar="FILE|DIR", help="a drill report, or a directory of them")
    history.add_argument("--since", type=since_time, metavar="WHEN",
                         help="only from then: 10m, 2h, 1d back, a UTC time (2026-11-22T09:15Z) or unix seconds")
    history.add_argument("--limit", type=at_least(1, "a number of events"), metavar="N", help="only the last N")
    history.add_argument("-o", "--output", choices=["table", "json"], default="table",
                         help="table (default), or the records as JSON")

    completion = add("completion", cmd_completion, "print a shell completion script",
                     'Print a completion script for the shell.\nbash: eval "$(shadowline completion bash)" in ~/.bashrc, '
                     "or save it as /etc/bash_completion.d/shadowline.\nzsh: after compinit, "
                     'eval "$(shadowline completion zsh)" in ~/.zshrc, or save it as _shadowline in a directory of '
                     "$fpath.")
    completion.add_argument("shell", choices=["bash", "zsh"], help="the shell (bash or zsh)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "status" and not args.plan and not args.inventory:
        raise SystemExit(f"{PROG} status: give -i INVENTORY or --plan PLAN.json")
    if args.command == "status" and args.count is not None and args.watch is None:
        console.err(f"{PROG} status: --count {args.count} counts refreshes: give --watch [SECONDS] too")
        return 2  # a wrong combination of options, as argparse's own refusals
    try:
        return int(args.func(args))
    except BrokenPipeError:  # the reader went away (| head): nothing more to say
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
