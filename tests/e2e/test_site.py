"""site.yml, status, shadow changes and teardown.yml on a 3-host testbed, through Ansible as a user runs them.

Testbed instance 4 (198.18.4.0/24; tests/e2e/site_helpers.py), inventory ``.testbed-4/inventory`` (deployment
``demo``: the CPU stand-in backend, TP 3, one rank per host per cohort), with ``-e gms_cohorts=3``: a primary and
two shadows. The tests run in file order and build on each other (one deployment, converged once):

1. site.yml converges from nothing, serves a completion through the frontend, prints a right status table;
2. every installed unit passes ``systemd-analyze verify`` inside the hosts;
3. a second run changes nothing on any host and restarts nothing;
4. a change of the shadows alone (``gms_ports.master_stride``, the master port of every cohort but the primary's,
   and ``gms_cohorts`` 3 -> 2) restarts the changed shadow and removes the other on every node, and restarts
   nothing else that need not (only the agents, which follow the plan): never the serving primary;
5. teardown.yml leaves no unit, process, listening port or directory of the deployment on any host.

Only real outcomes are asserted: the PLAY RECAP, HTTP answers from the frontend, and, inside the hosts,
``systemctl``, ``ss -ltnp``, ``ps`` and ``/proc``. The durations of the first converge and of the second run are
printed (docs/roles.md quotes them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from .site_helpers import (
    PlaybookRun,
    chat_completion,
    cohort_info,
    cohort_plan,
    deployment_processes,
    host_rc,
    host_sh,
    listeners,
    main_pid,
    marked_processes,
    proc_environ,
    run_playbook,
    say,
    status_table_rows,
    unit_states,
)

DEPLOYMENT = "demo"
COHORTS = 3
HOSTS = ["node0", "node1", "node2"]
ENGINE = "shadowline-demo-engine@{}.service"

pytestmark = pytest.mark.timeout(900)


# Shadows only: cohort 1's master port (29500 + stride * cohort) changes, cohort 2 goes; cohort 0 stays the same.
SHADOW_CHANGE = '{"gms_cohorts": 2, "gms_ports": {"master_stride": 1000}}'


class Site:
    """What the tests learn along the way (one deployment, shared by the tests of this file, in order)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.steps: dict[str, bool] = {}
        self.timings: dict[str, float] = {}
        self.baseline_listeners: dict[str, list[tuple[str, str]]] = {}
        self.first: PlaybookRun | None = None
        self.plans: dict[tuple[str, ...], dict[str, Any]] = {}

    def plan(self, *extra_vars: str) -> dict[str, Any]:
        """The cohort plan of the inventory with ``-e gms_cohorts=3`` and these extra variables."""
        key = (f"gms_cohorts={COHORTS}", *extra_vars)
        if key not in self.plans:
            self.plans[key] = cohort_plan(key)
        return self.plans[key]

    def need(self, *steps: str) -> None:
        missing = [s for s in steps if not self.steps.get(s)]
        if missing:
            pytest.fail(f"needs the earlier step(s) {missing} of this file, which did not pass")

    def site(self, name: str, *extra_vars: str, flags: tuple[str, ...] = ()) -> PlaybookRun:
        args = [a for v in (f"gms_cohorts={COHORTS}", *extra_vars) for a in ("-e", v)]
        return run_playbook("site.yml", *args, *flags, log_name=name)


@pytest.fixture(scope="module")
def site(site_testbed: Any, site_runtime: Path, tmp_path_factory: pytest.TempPathFactory,
         request: pytest.FixtureRequest) -> Iterator[Site]:
    state = Site(tmp_path_factory.mktemp("site"))
    yield state
    if state.timings:
        say(request, "site.yml timings on the 3-host testbed: "
                     + ", ".join(f"{k} {v} s" for k, v in state.timings.items()))


def all_unit_pids() -> dict[str, dict[str, str]]:
    return {h: {u: p["MainPID"] for u, p in unit_states(h, DEPLOYMENT).items()} for h in HOSTS}


def check_cohorts(site: Site, plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """cohort_info on every node: cohort 0 active and the lock holder on node0, every shadow parked, every
    headless rank running; each pid is the unit's MainPID (read independently inside the host), alive, and runs
    that cohort's engine with the plan's command line. Returns the cohort_info results."""
    cohorts = len(plan["cohorts"])
    info = cohort_info(plan, site.tmp)
    assert sorted(info) == HOSTS
    assert info["node0"]["lock_holder"] == "engine-0", f"lock holder: {info['node0']['lock_holder']}"
    assert host_sh("node0", f"cat {plan['lock_path']}") == "engine-0"
    for host in HOSTS:
        ranks = sorted(info[host]["ranks"], key=lambda r: r["cohort"])
        assert [r["cohort"] for r in ranks] == list(range(cohorts)), f"{host}: {ranks}"
        states = [r["state"] for r in ranks]
        if host == "node0":
            assert states == ["active"] + ["parked"] * (cohorts - 1), f"node0 leaders: {states}"
        else:
            assert states == ["running"] * cohorts, f"{host} headless ranks: {states}"
        for rank in ranks:
            pid = rank["pid"]
            assert pid > 0 and pid == main_pid(host, ENGINE.format(rank["cohort"])), f"{host}: {rank}"
            env = proc_environ(host, pid)
            assert env.get("ENGINE_ID") == str(rank["cohort"]) and env.get("SHADOWLINE_DEPLOYMENT") == DEPLOYMENT
            argv = host_sh(host, f"cat /proc/{pid}/cmdline").split("\0")[:-1]
            planned = next(r for r in plan["cohorts"][rank["cohort"]]["ranks"] if r["host"] == host)
            assert argv == planned["process"]["argv"], f"{host} cohort {rank['cohort']}: runs {argv}"
    return info


# -- 1. converge from nothing ---------------------------------------------------------------------------------- #

def test_site_converges_from_nothing(site: Site, request: pytest.FixtureRequest) -> None:
    for host in HOSTS:
        assert unit_states(host, DEPLOYMENT) == {}, f"{host} is not fresh"
        assert deployment_processes(host, DEPLOYMENT) == [], f"{host} is not fresh"
        site.baseline_listeners[host] = listeners(host)
    run = site.site("site-1-first-converge")
    site.first = run
    site.timings["first converge"] = run.seconds
    say(request, f"site.yml first converge (3 hosts, 3 cohorts, from nothing): {run.seconds} s; "
                 f"slowest tasks: {run.slowest()}")
    assert run.ok(), f"site.yml failed (rc {run.returncode}):\n{run.tail()}"
    assert sorted(run.recap) == HOSTS, run.recap
    assert all(r["changed"] > 0 for r in run.recap.values()), run.recap
    for host in HOSTS:
        units = unit_states(host, DEPLOYMENT)
        expected = {"shadowline-demo-gms.service"} | {ENGINE.format(c) for c in range(COHORTS)}
        if host == "node0":
            expected |= {f"shadowline-demo-{k}.service" for k in ("etcd", "nats", "frontend")}
        assert expected <= set(units), f"{host}: units {sorted(units)}"
        assert all(units[u]["ActiveState"] == "active" for u in expected), f"{host}: {units}"
    site.steps["converged"] = True


def test_completion_through_the_frontend(site: Site) -> None:
    site.need("converged")
    plan = site.plan()
    answer = chat_completion(plan["infra"]["frontend_url"], plan["model_id"])
    assert answer["model"] == plan["model_id"]
    assert answer["usage"]["completion_tokens"] > 0 and answer["usage"]["prompt_tokens"] > 0, answer


def test_status_table(site: Site) -> None:
    site.need("converged")
    info = check_cohorts(site, site.plan())
    # the table site.yml printed (playbooks/status.yml) says the same as the live state
    assert site.first is not None
    rows = status_table_rows(site.first.output)
    assert len(rows) == COHORTS * len(HOSTS), f"status table rows: {rows}"
    live = {(r["host"], r["cohort"]): r for h in HOSTS for r in info[h]["ranks"]}
    for row in rows:
        rank = live[(row["node"], int(row["cohort"]))]
        assert row["state"] == rank["state"] and row["pid"] == str(rank["pid"]), f"{row} vs live {rank}"
        assert row["role"] == ("primary" if row["cohort"] == "0" else "shadow")
        assert (row["lock"] == "holder") == (row["node"] == "node0" and row["cohort"] == "0"), row
        ports = rank["ports"]
        assert row["ports"] == f"{ports['master']}/{ports['system']}/{ports['nixl']}"
    site.steps["status"] = True


# -- 2. every unit passes systemd-analyze verify ------------------------------------------------------------- #

def test_units_pass_systemd_analyze_verify(site: Site) -> None:
    """Every unit file of the deployment, and every engine instance (the template with that cohort's drop-in:
    the template alone has no ExecStart= by design, each cohort's drop-in adds it)."""
    site.need("converged")
    engines = " ".join(ENGINE.format(c) for c in range(COHORTS))
    for host in HOSTS:
        files = host_sh(host, "cd /etc/systemd/system && ls -d shadowline-demo-*").split()
        expected = {"shadowline-demo-gms.service", "shadowline-demo-engine@.service"}
        expected |= {f"{ENGINE.format(c)}.d" for c in range(COHORTS)}
        assert expected <= set(files), f"{host}: unit files {files}"
        rc, output = host_rc(host, "cd /etc/systemd/system && systemd-analyze verify "
                                   f"$(ls shadowline-demo-*.service | grep -v '@[.]service$') {engines}")
        assert rc == 0 and output.strip() == "", f"{host}: systemd-analyze verify exited {rc}:\n{output}"


# -- 3. a second run changes nothing ---------------------------------------------------------------------------- #

def test_second_run_changes_nothing(site: Site, request: pytest.FixtureRequest) -> None:
    site.need("converged")
    before = all_unit_pids()
    run = site.site("site-2-second-run")
    site.timings["second run"] = run.seconds
    say(request, f"site.yml second run (nothing to do): {run.seconds} s; slowest tasks: {run.slowest()}")
    assert run.ok(), f"second site.yml failed (rc {run.returncode}):\n{run.tail()}"
    assert sorted(run.recap) == HOSTS, run.recap
    changed = {h: r["changed"] for h, r in run.recap.items() if r["changed"]}
    assert not changed, f"the second run changed {changed}: {run.changed_tasks()}"
    after = all_unit_pids()
    assert after == before, f"the second run restarted units: before {before}, after {after}"
    site.steps["idempotent"] = True


def test_check_mode_on_a_converged_deployment_reports_nothing_to_change(site: Site,
                                                                        request: pytest.FixtureRequest) -> None:
    """``site.yml --check --diff``, what an operator runs before a change: every task runs in check mode on the
    converged testbed, nothing fails, nothing would change, and no unit was touched."""
    site.need("idempotent")
    before = all_unit_pids()
    run = site.site("site-2b-check", flags=("--check", "--diff"))
    say(request, f"site.yml --check --diff on the converged deployment: {run.seconds} s")
    assert run.ok(), f"site.yml --check failed (rc {run.returncode}):\n{run.tail()}"
    assert sorted(run.recap) == HOSTS, run.recap
    changed = {h: r["changed"] for h, r in run.recap.items() if r["changed"]}
    assert not changed, f"check mode would change {changed}: {run.changed_tasks()}"
    assert all_unit_pids() == before, "check mode restarted units"


# -- 4. changing only the shadows never restarts the serving primary --------------------------------------------- #

SHADOW_CHANGE_TASKS = {  # what may change when only shadows change
    "shadowline.gms.engine : Install the engine template unit and each cohort's home and drop-ins",
    "shadowline.gms.engine : Stop the failover agent before stopping cohorts the plan no longer has",
    "shadowline.gms.engine : Stop cohorts the plan no longer has",
    "shadowline.gms.engine : Remove the units of cohorts the plan no longer has",
    "shadowline.gms.engine : Reload systemd after unit changes",
    "shadowline.gms.engine : Stop the failover agent (see main.yml) before restarting the running cohort 1",
    "shadowline.gms.engine : Restart on every node the changed cohort 1",
    # the agents follow the plan: a new plan.json, so they restart (and adopt the running ranks)
    "shadowline.gms.agent : Install the cohort plan the agent follows and the agent unit",
    "shadowline.gms.agent : Start the agent",
    "shadowline.gms.agent : Restart agent",
}


def test_a_shadow_only_change_keeps_the_primary(site: Site) -> None:
    """``gms_ports.master_stride`` 100 -> 1000 changes cohort 1's command line (``--master-port``) and not the
    primary's, and ``gms_cohorts`` 3 -> 2 removes cohort 2: cohort 1 restarts on every node and parks again,
    cohort 2 is stopped and its drop-in removed everywhere, nothing of it runs or listens; the primary's ranks,
    the GMS servers, etcd, NATS and the frontend keep their pids on every host; only the agents restart besides."""
    site.need("converged")
    old, new = site.plan(), site.plan(SHADOW_CHANGE)
    assert old["cohorts"][0] == new["cohorts"][0] and old["cohorts"][1] != new["cohorts"][1] and len(new["cohorts"]) == 2
    removed = ENGINE.format(2)
    before = all_unit_pids()
    run = site.site("site-3-shadow-change", SHADOW_CHANGE)
    site.timings["shadow change"] = run.seconds
    assert run.ok(), f"site.yml with {SHADOW_CHANGE} failed (rc {run.returncode}):\n{run.tail()}"
    changed = {task.split("] ", 1)[1] for task in run.changed_tasks()}
    assert changed <= SHADOW_CHANGE_TASKS, f"changed besides the shadows and agents: {changed - SHADOW_CHANGE_TASKS}"
    after = all_unit_pids()
    gone_ports = {str(p) for p in old["cohorts"][2]["ports"].values()}
    for host in HOSTS:
        assert set(after[host]) | {removed} == set(before[host]) and main_pid(host, removed) == 0, \
            f"{host}: units {sorted(before[host])} -> {sorted(after[host])}"
        restarted = {u for u in after[host] if u != removed and before[host][u] != after[host][u]}
        expected = {ENGINE.format(1), "shadowline-demo-agent.service"}
        assert restarted == expected, f"{host}: restarted {sorted(restarted)}, expected {sorted(expected)}"
        assert host_sh(host, f"ls -d /etc/systemd/system/{removed}.d 2>/dev/null; true").strip() == "", \
            f"{host}: the drop-in of the removed cohort is still installed"
        left = [pid for pid, cohort in marked_processes(host, DEPLOYMENT).items() if cohort == "2"]
        assert not left, f"{host}: processes of the removed cohort 2 are left: {left}"
        bound = [addr for addr, _process in listeners(host) if addr.rsplit(":", 1)[1] in gone_ports]
        assert not bound, f"{host}: ports of the removed cohort still listen: {bound}"
    check_cohorts(site, new)
    rows = status_table_rows(run.output)
    assert len(rows) == 2 * len(HOSTS) and all(
        row["ports"].startswith(f"{new['cohorts'][int(row['cohort'])]['ports']['master']}/") for row in rows), \
        f"the status table does not show the new plan: {rows}"
    chat_completion(new["infra"]["frontend_url"], new["model_id"])
    site.steps["shadow change"] = True


# -- 5. teardown leaves nothing ----------------------------------------------------------------------------------- #

def test_teardown_leaves_nothing(site: Site) -> None:
    site.need("converged")
    plan = site.plan()
    run = run_playbook("teardown.yml", log_name="site-5-teardown")
    site.timings["teardown"] = run.seconds
    assert run.ok(), f"teardown.yml failed (rc {run.returncode}):\n{run.tail()}"
    for host in HOSTS:
        # unit files, drop-ins and enablement links (multi-user.target.wants/...) included
        files = host_sh(host, "find /etc/systemd/system /etc/tmpfiles.d -name 'shadowline-demo*'; "
                              f"ls -d {plan['config_dir']} {plan['state_dir']} {plan['socket_dir']} 2>/dev/null; true")
        assert files.strip() == "", f"{host}: left files {files.split()}"
        assert unit_states(host, DEPLOYMENT) == {}, f"{host}: units still loaded: {unit_states(host, DEPLOYMENT)}"
        assert deployment_processes(host, DEPLOYMENT) == [], f"{host}: processes left"
        now = listeners(host)
        assert now == site.baseline_listeners[host], \
            f"{host}: listening after teardown {now}, before the deployment {site.baseline_listeners[host]}"
    site.steps["torn down"] = True
