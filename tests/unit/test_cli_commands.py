"""`shadowline status --watch`, `failover`, `switchover` and `history` (issue #42: a command like patronictl).

The playbooks the command runs are faked here (``cli.run_playbook``) with the output ansible-playbook prints for
them, except where a test says it runs one on this machine (inventories/local, read-only)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shadowline import cli
from shadowline.cluster import history
from shadowline.cluster.status_table import render_status_table
from shadowline.drill.report import compute_report

from .test_cli import plan_file

ROOT = Path(__file__).resolve().parents[2]
DRILLS = ROOT / "tests" / "unit" / "data" / "drills"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "plugins" / "module_utils")}


def run_cli(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shadowline.cli", *argv], capture_output=True, text=True, cwd=cwd,
                          env=ENV, timeout=300, check=False)


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int | str, str]:
    """main's exit: (status, what it said on stderr); a message of SystemExit is its one line."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(list(argv))
    code = exit_.value.code
    said = capsys.readouterr().err
    return (1, str(code)) if isinstance(code, str) else (code, said)


class Playbooks:
    """A fake cli.run_playbook: what each playbook prints, and every call."""

    def __init__(self, **outputs: tuple[int, str]) -> None:
        self.outputs, self.calls = outputs, []

    def __call__(self, name: str, inventory: str, extra: dict | None = None, check: bool = False,
                 verbose: bool = False) -> subprocess.CompletedProcess[str]:
        self.calls.append({"name": name, "inventory": inventory, "extra": extra, "check": check, "verbose": verbose})
        rc, stdout = self.outputs[name]
        return subprocess.CompletedProcess([name], rc, stdout, "")


def said(task: str, msg: str, host: str = "node0") -> str:
    """A debug task's result as ansible-playbook prints it (default callback, results as JSON)."""
    return f"TASK [{task}] ***\nok: [{host}] => {{\n    \"msg\": {json.dumps(msg)}\n}}\n"


def shown(task: str, lines: list[str]) -> str:
    """shadowline.gms.show's lines as ansible-playbook prints them."""
    return f"PLAY [x] ***\n\nTASK [{task}] ***\n" + "\n".join(lines) + "\nok: [node0]\n\nPLAY RECAP ***\n"


PORTS = {"master": 29500, "system": 8080, "nixl": 8280}


def status_output(holder: str | None, shadow_state: str = "parked") -> str:
    ranks = [{"cohort": 0, "role": "primary", "host": "node0", "rank": 0, "leader": True, "pid": 7,
              "state": "active" if holder == "engine-0" else "parked", "ports": PORTS},
             {"cohort": 1, "role": "shadow", "host": "node0", "rank": 0, "leader": True, "pid": 8,
              "state": "active" if holder == "engine-1" else shadow_state, "ports": PORTS}]
    table = render_status_table(ranks, holder, "m@0123456789ab", "automatic")
    return shown("Print the status table", table.splitlines())


def fleet_status_output(holders: dict[int, str | None]) -> str:
    """A fleet of two replicas (one node each here): replica 0 serves engine-0, replica 1 whatever ``holders``
    says, the other cohort of each parked."""
    ranks = [{"replica": q, "cohort": c, "role": "primary" if c == 0 else "shadow", "host": f"node{q}", "rank": 0,
              "leader": True, "pid": 7 + 2 * q + c, "state": "active" if holders.get(q) == f"engine-{c}" else "parked",
              "ports": PORTS} for q in (0, 1) for c in (0, 1)]
    table = render_status_table(ranks, holders, "m@0123456789ab", "automatic")
    return shown("Print the status table", table.splitlines())


# -- status --watch ------------------------------------------------------------------------------------------ #

@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "-inf", "1e9", "3601", "two", ""])
def test_watch_refuses_what_is_not_a_sane_number_of_seconds(capsys: pytest.CaptureFixture[str], value: str):
    code, err = refused(capsys, "status", "--plan", "plan.json", f"--watch={value}")
    assert code == 2 and "argument -w/--watch" in err and "e.g. --watch 2" in err, err


def test_watch_defaults_to_two_seconds_and_count_needs_it(capsys: pytest.CaptureFixture[str]):
    parser = cli.build_parser()
    assert parser.parse_args(["status", "--plan", "p", "-w"]).watch == 2.0
    assert parser.parse_args(["status", "-w", "-i", "inv"]).watch == 2.0
    assert parser.parse_args(["status", "--watch", "0.5", "--count", "3"]).count == 3
    assert parser.parse_args(["status"]).watch is None
    assert cli.main(["status", "--plan", "p", "--count", "2"]) == 2
    assert "give --watch [SECONDS] too" in capsys.readouterr().err
    code, err = refused(capsys, "status", "--plan", "p", "-w", "--count", "0")
    assert code == 2 and "argument --count: '0' is not a number of refreshes" in err


def test_watch_refreshes_count_times_and_ends_with_the_last_status(capsys: pytest.CaptureFixture[str]):
    codes, slept = iter([1, 0, 1]), []

    def refresh() -> int:
        cli.console.out("the table")
        return next(codes)

    assert cli.watch(refresh, 0.5, 3, "shadowline status -i inv", sleep=slept.append) == 1
    out = capsys.readouterr().out
    assert out.count("Every 0.5 s: shadowline status -i inv") == 3 and out.count("the table") == 3
    assert slept == [0.5, 0.5], "no sleep after the last refresh"
    assert "\033[" not in out, "no screen clearing where the output is not a terminal"


def test_ctrl_c_ends_the_watch_with_status_0_and_no_half_refresh(capsys: pytest.CaptureFixture[str]):
    calls = []

    def refresh() -> int:
        calls.append(1)
        cli.console.out(f"refresh {len(calls)}")
        if len(calls) == 2:
            raise KeyboardInterrupt
        return 1

    assert cli.watch(refresh, 1.0, None, "t", sleep=lambda _s: None) == 0
    out = capsys.readouterr().out
    assert "refresh 1" in out and "refresh 2" not in out


def test_watch_of_a_plan_file_for_real_counts_and_stops(tmp_path: Path):
    proc = run_cli("status", "--plan", str(plan_file(tmp_path)), "--host", "node0", "--watch", "0.1", "--count", "2")
    assert proc.returncode == 1, "every rank dead here: the last refresh's status\n" + proc.stderr
    assert proc.stdout.count("Every 0.1 s: shadowline status --plan") == 2 and proc.stdout.count("lock holder:") == 2


def test_ctrl_c_of_a_running_watch_exits_0_without_a_traceback(tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-m", "shadowline.cli", "status", "--plan", str(plan_file(tmp_path)),
                             "--host", "node0", "-w", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV, cwd=ROOT)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("Every 0.2 s"), "the first refresh's header"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err


def test_watch_with_an_inventory_runs_the_status_playbook_each_time(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]):
    playbooks = Playbooks(status=(0, status_output("engine-0")))
    monkeypatch.setattr(cli, "run_playbook", playbooks)
    monkeypatch.setattr(cli.time, "sleep", lambda _s: None)
    assert cli.main(["status", "-i", "inv", "-w", "1", "--count", "2", "-o", "json"]) == 0
    assert [c["name"] for c in playbooks.calls] == ["status", "status"]
    out = capsys.readouterr().out
    document = out.split("\n\n")[1]
    assert json.loads(document.split("\nEvery")[0])["lock_holder"] == "engine-0"


# -- failover and switchover ----------------------------------------------------------------------------------- #

TIMELINE = ("cohort 0: fail over (planned-failover), generation 2 -> 3; serving engine-0 -> engine-1; after the "
            "declaration: every rank gone 0.12 s; promoted 0.24 s; relaunched 2.1 s;")


def test_failover_runs_the_playbook_with_the_cohort_and_mode_and_prints_its_timeline(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    playbooks = Playbooks(failover=(0, said("Show the timeline", TIMELINE)))
    monkeypatch.setattr(cli, "run_playbook", playbooks)
    assert cli.main(["failover", "-i", "inv", "--cohort", "0"]) == 0
    assert capsys.readouterr().out.strip() == TIMELINE
    assert cli.main(["failover", "-i", "inv", "--cohort", "1", "--mode", "forced"]) == 0
    assert [(c["name"], c["inventory"], c["extra"], c["check"]) for c in playbooks.calls] == [
        ("failover", "inv", {"cohort": 0, "mode": "planned"}, False),
        ("failover", "inv", {"cohort": 1, "mode": "forced"}, False)]


def test_failover_in_check_mode_says_what_it_would_do(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]):
    would = 'changed: [node0 -> node0] => {\n    "changed": true,\n    "msg": "would fail over cohort 0 (generation 2, running)"\n}\n'
    playbooks = Playbooks(failover=(0, would))
    monkeypatch.setattr(cli, "run_playbook", playbooks)
    assert cli.main(["failover", "-i", "inv", "--cohort", "0", "--check"]) == 0
    assert capsys.readouterr().out.strip() == "check mode, nothing changed: would fail over cohort 0 (generation 2, running)"
    assert playbooks.calls[0]["check"] and playbooks.calls[0]["verbose"]


def test_a_refused_failover_prints_the_playbook_and_its_reason_and_fails(monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]):
    refusal = ("cohort 0 serves and no shadow is parked to take over: a planned failover would stop serving until "
               "the relaunch. Fix: wait for a parked shadow (playbooks/status.yml), or use mode=forced")
    output = f'TASK [Fail over the cohort 0] ***\nfatal: [node0 -> node0]: FAILED! => {{\n    "changed": false,\n    "msg": "{refusal}"\n}}\n'
    monkeypatch.setattr(cli, "run_playbook", Playbooks(failover=(2, output)))
    assert cli.main(["failover", "-i", "inv", "--cohort", "0"]) == 2
    err = capsys.readouterr().err
    assert "PLAY" not in err or "FAILED!" in err
    assert err.rstrip().endswith(f"shadowline failover: {refusal}")


def test_failover_of_a_fleets_replica_passes_it_to_the_playbook(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]):
    # a blank in front, as a folded template leaves one: still the timeline
    playbooks = Playbooks(failover=(0, said("Show the timeline", " " + TIMELINE)))
    monkeypatch.setattr(cli, "run_playbook", playbooks)
    assert cli.main(["failover", "-i", "inv", "--replica", "1", "--cohort", "0", "--mode", "handover"]) == 0
    assert capsys.readouterr().out.strip() == TIMELINE
    assert playbooks.calls[0]["extra"] == {"cohort": 0, "mode": "handover", "replica": 1}
    code, err = refused(capsys, "failover", "-i", "inv", "--unfence", "node1", "--replica", "1")
    assert code == 1 and "--replica is for --cohort" in err and len(playbooks.calls) == 1


def test_switchover_of_a_fleet_reads_the_replicas_own_holder(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]):
    playbooks = Playbooks(status=(0, fleet_status_output({0: "engine-0", 1: "engine-1"})),
                          failover=(0, said("Show the timeline", TIMELINE.replace("cohort 0", "cohort 1"))))
    monkeypatch.setattr(cli, "run_playbook", playbooks)
    assert cli.main(["switchover", "-i", "inv", "--replica", "1"]) == 0
    assert [(c["name"], c["extra"]) for c in playbooks.calls] == [
        ("status", None), ("failover", {"cohort": 1, "mode": "handover", "replica": 1})]
    assert capsys.readouterr().out.splitlines()[0].startswith("cohort 1 of replica 1 serves: handing it over")


@pytest.mark.parametrize(("holders", "argv", "said_"), [
    ({0: "engine-0", 1: "engine-1"}, [], "a fleet of 2 replicas (0, 1), each with its own serving cohort. Fix: "
                                         "--replica N"),
    ({0: "engine-0", 1: "engine-1"}, ["--replica", "2"], "--replica 2: the deployment has no replica 2 "
                                                         "(replicas: 0, 1)"),
    ({0: "engine-0", 1: None}, ["--replica", "1"], "no cohort serves (nobody holds the failover lock)"),
    ({0: "engine-0", 1: "engine-1"}, ["--replica", "0", "--cohort", "1"], "--cohort 1 does not serve (engine-0 "
                                                                          "holds the lock)"),
    (None, ["--replica", "1"], "--replica 1: the deployment is one replica (replica 0)"),
])
def test_switchover_of_a_fleet_refuses_and_changes_nothing(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str],
                                                           holders: dict | None, argv: list[str], said_: str):
    status = fleet_status_output(holders) if holders else status_output("engine-0")
    playbooks = Playbooks(status=(0, status), failover=(0, ""))
    monkeypatch.setattr(cli, "run_playbook", playbooks)
    code, err = refused(capsys, "switchover", "-i", "inv", *argv)
    assert code == 1 and said_ in err, err
    assert [c["name"] for c in playbooks.calls] == ["status"], "failover.yml never ran"


def test_unfence_runs_the_playbook_with_the_node(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    playbooks = Playbooks(failover=(0, said("Say what the unfence did", "node1: was not fenced")))
    monkeypatch.setattr(cli, "run_playbook", playbooks)
    assert cli.main(["failover", "-i", "inv", "--unfence", "node1"]) == 0
    assert capsys.readouterr().out.strip() == "node1: was not fenced"
    assert playbooks.calls[0]["extra"] == {"unfence": "node1"}
    code, err = refused(capsys, "failover", "-i", "inv", "--unfence", "node1", "--mode", "forced")
    assert code == 1 and "--mode is for --cohort" in err


@pytest.mark.parametrize(("argv", "said_"), [
    (["failover", "-i", "inv"], "one of the arguments --cohort --unfence is required"),
    (["failover", "-i", "inv", "--cohort", "x"], "argument --cohort: 'x' is not a cohort number"),
    (["failover", "-i", "inv", "--cohort", "0", "--unfence", "n"], "not allowed with argument"),
    (["failover", "-i", "inv", "--cohort", "0", "--mode", "soft"], "invalid choice: 'soft'"),
    (["failover", "--cohort", "0"], "the following arguments are required: -i/--inventory"),
    (["switchover"], "the following arguments are required: -i/--inventory"),
    (["switchover", "-i", "inv", "--cohort", "-2"], "argument --cohort: '-2' is not a cohort number"),
    (["switchover", "-i", "inv", "--replica", "x"], "argument --replica: 'x' is not a replica number"),
    (["failover", "-i", "inv", "--cohort", "0", "--replica", "-1"], "argument --replica: '-1' is not a replica number"),
])
def test_failover_and_switchover_refuse_wrong_options(capsys: pytest.CaptureFixture[str], argv: list[str], said_: str):
    code, err = refused(capsys, *argv)
    assert code == 2 and said_ in err, err


def test_switchover_hands_the_serving_cohort_over_with_mode_handover(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]):
    playbooks = Playbooks(status=(0, status_output("engine-1")),
                          failover=(0, said("Show the timeline", TIMELINE.replace("cohort 0", "cohort 1"))))
    monkeypatch.setattr(cli, "run_playbook", playbooks)
    assert cli.main(["switchover", "-i", "inv"]) == 0
    assert [(c["name"], c["extra"]) for c in playbooks.calls] == [
        ("status", None), ("failover", {"cohort": 1, "mode": "handover"})]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("cohort 1 serves: handing it over") and out[-1].startswith("cohort 1: fail over")
    assert cli.main(["switchover", "-i", "inv", "--cohort", "1", "--check"]) == 0
    assert playbooks.calls[-1]["check"] and playbooks.calls[-1]["extra"]["cohort"] == 1


@pytest.mark.parametrize(("status", "argv", "said_"), [
    (status_output(None), [], "no cohort serves (nobody holds the failover lock)"),
    (status_output("engine-0"), ["--cohort", "1"], "--cohort 1 does not serve (engine-0 holds the lock)"),
    (status_output("engine-0", shadow_state="dead"), [], "cohort 0 serves and no shadow is parked"),
    (status_output("engine-0", shadow_state="waking"), ["--cohort", "0"], "--mode forced"),
])
def test_switchover_refuses_and_changes_nothing(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                status: str, argv: list[str], said_: str):
    playbooks = Playbooks(status=(0, status), failover=(0, ""))
    monkeypatch.setattr(cli, "run_playbook", playbooks)
    code, err = refused(capsys, "switchover", "-i", "inv", *argv)
    assert code == 1 and said_ in err, err
    assert [c["name"] for c in playbooks.calls] == ["status"], "failover.yml never ran"


def test_switchover_without_a_status_changes_nothing(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]):
    playbooks = Playbooks(status=(4, "fatal: [node1]: UNREACHABLE! => {}\n"), failover=(0, ""))
    monkeypatch.setattr(cli, "run_playbook", playbooks)
    code, err = refused(capsys, "switchover", "-i", "inv")
    assert code == 1 and "cannot read the status of inv" in err and "nothing was changed" in err
    assert len(playbooks.calls) == 1


# -- history: events ------------------------------------------------------------------------------------------- #

def event(t: float, node: str, name: str, cohort: int | None = None, generation: int | None = None,
          **detail: Any) -> dict[str, Any]:
    return {"time": t, "node": node, "cohort": cohort, "generation": generation, "event": name, "detail": detail}


def write_events(path: Path, *events: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in events))
    return path


T0 = 1795344139.0  # 2026-11-22 10:42:19 UTC


def two_nodes(tmp_path: Path) -> Path:
    """Two nodes' copied state: node0's file and its rotation, node1's file (an event of node0's copied twice)."""
    root = tmp_path / "copied"
    write_events(root / "node0" / "events.jsonl.1", event(T0, "node0", "agent-started", adopted=2))
    write_events(root / "node0" / "events.jsonl", event(T0 + 2, "node0", "failure-declared", 0, 3,
                                                        reason="rank-exited", rank=1),
                 event(T0 + 5, "node0", "promoted", 1, 1))
    write_events(root / "node1" / "events.jsonl", event(T0 + 1, "node1", "rank-exited", 0, 3, pid=42),
                 event(T0 + 5, "node0", "promoted", 1, 1))
    (root / "node0" / "gpu-events.jsonl").write_text("not an event of the agents'\n")
    return root


def test_history_of_copied_event_files_in_time_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    root = two_nodes(tmp_path)
    assert cli.main(["history", "--events", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["time", "(UTC)", "node", "c/gen"]
    assert [line.split()[2:5] for line in lines[1:]] == [
        ["node0", "-", "agent-started"], ["node1", "0/3", "rank-exited"], ["node0", "0/3", "failure-declared"],
        ["node0", "1/1", "promoted"]], "in time order, the copied event once, the GPU feed left out"
    assert lines[1].startswith("2026-11-22 10:42:19.000") and lines[1].endswith("adopted=2")
    assert lines[3].endswith("rank-exited (rank=1)"), "the reason first, then the rest of the detail"


def test_history_of_one_file_reads_its_rotations_since_and_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    current = two_nodes(tmp_path) / "node0" / "events.jsonl"
    assert cli.main(["history", "--events", str(current), "-o", "json"]) == 0
    assert [e["event"] for e in json.loads(capsys.readouterr().out)] == ["agent-started", "failure-declared",
                                                                         "promoted"]
    assert cli.main(["history", "--events", str(current), "-o", "json", "--since", str(T0 + 1)]) == 0
    assert [e["event"] for e in json.loads(capsys.readouterr().out)] == ["failure-declared", "promoted"]
    assert cli.main(["history", "--events", str(current), "-o", "json", "--limit", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == [event(T0 + 5, "node0", "promoted", 1, 1)]
    assert cli.main(["history", "--events", str(current), "--since", "1h"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "no events since then" in captured.err


def test_since_reads_durations_utc_times_and_unix_seconds():
    now = 2_000_000_000.0
    assert history.parse_since("90s", now) == now - 90 and history.parse_since("2h", now) == now - 7200
    assert history.parse_since("1.5d", now) == now - 1.5 * 86400
    assert history.parse_since("2026-11-22T10:42:19Z") == T0 == history.parse_since("2026-11-22 10:42:19")
    assert history.parse_since("2026-11-22T10:42") == T0 - 19
    assert history.parse_since("2026-11-22") == T0 - (10 * 3600 + 42 * 60 + 19)
    assert history.parse_since(str(T0)) == T0
    for text in ("yesterday", "10x", "3600", "2026-13-01", ""):
        with pytest.raises(ValueError):
            history.parse_since(text)


def test_history_bad_inputs_name_the_option_and_never_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    not_json = tmp_path / "not-json.jsonl"
    not_json.write_text('{"time": 1, "event": "x"}\nnonsense\n')
    wrong_type = write_events(tmp_path / "list" / "events.jsonl", event(T0, "n", "ok"))
    wrong_type.write_text(wrong_type.read_text() + "[1, 2]\n")
    no_time = tmp_path / "no-time.jsonl"
    no_time.write_text('{"event": "promoted", "time": "soon"}\n')
    (tmp_path / "empty").mkdir()
    unreadable = tmp_path / "binary.jsonl"
    unreadable.write_bytes(b"\xff\xfe\x00")
    cases = {
        ("--events", str(tmp_path / "missing")): "history --events: " + str(tmp_path / "missing") + ": no such file",
        ("--events", str(not_json)): f"{not_json} line 2 is not JSON",
        ("--events", str(wrong_type.parent)): f"{wrong_type} line 2 is not an event",
        ("--events", str(no_time)): f"{no_time} line 1 is not an event (an object with a numeric time",
        ("--events", str(tmp_path / "empty")): "holds no events file",
        ("--events", str(unreadable)): f"cannot read {unreadable}",
        ("--reports", str(tmp_path / "missing")): "history --reports: " + str(tmp_path / "missing") + ": no such",
        ("--reports", str(tmp_path / "empty")): "holds no drill report",
        ("--reports", str(not_json)): f"{not_json} is not JSON: not a drill report",
    }
    for argv, message in cases.items():
        code, err = refused(capsys, "history", *argv)
        assert code == 1 and message in err, (argv, err)
    for argv, message in {("--events", "x", "--since", "later"): "argument --since: 'later' is not a time",
                          ("--events", "x", "--limit", "0"): "argument --limit: '0' is not a number of events",
                          ("--events", "x", "--reports", "y"): "not allowed with argument",
                          (): "one of the arguments -i/--inventory --events --reports is required",
                          ("--events", "x", "-o", "xml"): "invalid choice: 'xml'"}.items():
        code, err = refused(capsys, "history", *argv)
        assert code == 2 and message in err, (argv, err)


def test_history_bad_inputs_from_the_command_line_end_in_one_line(tmp_path: Path):
    not_json = tmp_path / "events.jsonl"
    not_json.write_text("nonsense\n")
    proc = run_cli("history", "--events", str(not_json))
    assert proc.returncode == 1 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"shadowline history --events: {not_json} line 1 is not JSON: not an events file " \
                                  "(the JSON lines of events.jsonl)"


def test_history_of_every_node_merges_what_the_playbook_printed(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]):
    lines = [json.dumps(event(T0 + 2, "node0", "promoted", 1, 4)), json.dumps(event(T0, "node0", "agent-started")),
             "node1: no events read (tail: cannot open '/var/lib/shadowline/d/events.jsonl': No such file)",
             json.dumps(event(T0 + 1, "node2", "rank-exited", 0, 3, pid=9))]
    playbooks = Playbooks(history=(0, shown("Print the events of every node", lines)))
    monkeypatch.setattr(cli, "run_playbook", playbooks)
    assert cli.main(["history", "-i", "inv", "-o", "json", "--limit", "2"]) == 0
    captured = capsys.readouterr()
    assert [(e["node"], e["event"]) for e in json.loads(captured.out)] == [("node2", "rank-exited"),
                                                                           ("node0", "promoted")]
    assert "shadowline history: node1: no events read" in captured.err
    assert playbooks.calls[0]["extra"] == {"history_lines": 1000}
    assert cli.main(["history", "-i", "inv", "--limit", "5000"]) == 0
    assert playbooks.calls[1]["extra"] == {"history_lines": 5000}, "each node reads at least --limit lines"


def test_history_of_every_node_when_the_playbook_fails(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]):
    monkeypatch.setattr(cli, "run_playbook", Playbooks(history=(4, "fatal: [node0]: UNREACHABLE! => {}\n")))
    code, err = refused(capsys, "history", "-i", "inv")
    assert code == 1 and "history -i: playbooks/history.yml printed no events of inv (exit status 4" in err


def test_history_playbook_on_this_machine_reads_and_says_there_are_none():
    """playbooks/history.yml for real on inventories/local (nothing deployed here: the node has no events file)."""
    proc = run_cli("history", "-i", "inventories/local")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "shadowline history: local0: no events read (tail: cannot open" in proc.stderr
    assert "no events" in proc.stderr.splitlines()[-1] and "Traceback" not in proc.stderr


# -- history: drill reports ------------------------------------------------------------------------------------ #

def write_reports(directory: Path, *faults: str) -> dict[str, dict[str, Any]]:
    directory.mkdir(parents=True, exist_ok=True)
    reports = {}
    for fault in faults:
        evidence = json.loads((DRILLS / f"{fault}.json").read_text())
        reports[fault] = {**compute_report(evidence), "evidence": evidence}
        (directory / f"drill-{fault}.json").write_text(json.dumps(reports[fault]))
    return reports


def test_history_lists_drill_reports_with_their_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    reports = write_reports(tmp_path / "drills", "hang-leader", "kill-leader")
    (tmp_path / "drills" / "evidence.json").write_text((DRILLS / "kill-worker.json").read_text())
    (tmp_path / "drills" / "drill-kill-leader.svg").write_text("<svg/>")
    assert cli.main(["history", "--reports", str(tmp_path / "drills")]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].split()[:6] == ["when", "(UTC)", "drill", "result", "detect", "promote"]
    assert [line.split()[2] for line in lines[1:]] == ["kill-leader", "hang-leader"], "oldest drill first"
    leader = reports["kill-leader"]
    assert f"{leader['detect_s']:.3f} s" in lines[1] and ("PASS" if leader["passed"] else "FAIL") in lines[1]
    assert "evidence.json is not a drill report, left out" in captured.err
    assert cli.main(["history", "--reports", str(tmp_path / "drills" / "drill-kill-leader.json"), "-o", "json"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    assert (record["drill"], record["passed"], record["promote_s"]) == ("kill-leader", leader["passed"],
                                                                        leader["promote_s"])
    assert record["failed_requests"] == leader["failed_before_promotion"] + leader["failed_after_promotion"]
    assert cli.main(["history", "--reports", str(tmp_path / "drills"), "--limit", "1", "-o", "json"]) == 0
    assert [r["drill"] for r in json.loads(capsys.readouterr().out)] == ["hang-leader"]


# -- completion and help --------------------------------------------------------------------------------------- #

def test_completion_knows_the_new_subcommands_their_options_and_choices(tmp_path: Path):
    parser = cli.build_parser()
    script = tmp_path / "shadowline.bash"
    script.write_text(cli.bash_completion(parser))
    probe = (f'source {script}; c() {{ COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _shadowline; '
             'echo "${COMPREPLY[@]}"; }; c shadowline sw; c shadowline failover --mode ""; c shadowline history --e; '
             'c shadowline status --w; c shadowline history -o ""; c shadowline failover --un')
    lines = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=False).stdout.splitlines()
    assert lines == ["switchover", "planned handover forced", "--events", "--watch", "table json", "--unfence"], lines
    zsh = cli.zsh_completion(parser)
    for name in ("failover", "switchover", "history"):
        assert f"'{name}:" in zsh and f"({name}) opts=(" in zsh
    assert "compadd -- planned handover forced" in zsh


def test_help_of_the_new_subcommands():
    for name, words in {"failover": "--unfence", "switchover": "patronictl switchover", "history": "--reports",
                        "status": "--watch"}.items():
        proc = run_cli(name, "--help")
        assert proc.returncode == 0 and proc.stdout.startswith(f"usage: shadowline {name}") and words in proc.stdout
