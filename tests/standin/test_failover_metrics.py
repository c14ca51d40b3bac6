"""shadowline.standin.failover_metrics (the writer) and shadowline.common.failover_metrics (names, parsing): exact
names and labels, persisted counters, parsing."""

from __future__ import annotations

import json
import logging

from shadowline.common import failover_metrics as fm
from shadowline.standin.failover_metrics import FailoverMetrics, load_counters


def test_render_names_labels_and_parse(tmp_path):
    m = FailoverMetrics("1", "tiny", "backend", str(tmp_path))
    for s in ("init", "standby", "waking"):
        m.set_state(s)
    m.record_switch_attempt()
    m.set_state("active")
    m.record_switch_success()
    text = m.render()
    for name in (fm.STATE, fm.STATE_ENTERED, fm.LAST_STATE_DURATION, fm.TRANSITIONS, fm.SWITCH_ATTEMPTS,
                 fm.SWITCH_SUCCESS):
        assert f"# TYPE {name} " in text
    assert ('dynamo_component_engine_failover_state{engine_id="1",model="tiny",dynamo_component="backend",'
            'state="active"} 1.0') in text
    assert ('dynamo_component_engine_failover_transitions_total{engine_id="1",model="tiny",dynamo_component="backend",'
            'from_state="standby",to_state="waking"} 1.0') in text
    view = fm.engine_failover_view(text)["1"]
    assert (view.state, view.attempts, view.success, view.model, view.component) == ("active", 1, 1, "tiny", "backend")
    assert set(view.last_state_duration) == {"init", "standby", "waking"}
    assert view.transitions[("waking", "active")] == 1
    for sample in fm.parse_samples(text, fm.PREFIX):
        assert {"engine_id", "model", "dynamo_component"} <= set(sample.labels)
    assert json.loads((tmp_path / "failover_metrics_engine-1.json").read_text()) == {"attempts": 1, "success": 1}


def test_counters_restored_after_restart(tmp_path, caplog):
    (tmp_path / "failover_metrics_engine-2.json").write_text('{"attempts":3,"success":2}')
    with caplog.at_level(logging.INFO):
        m = FailoverMetrics("2", "tiny", "backend", str(tmp_path))
        m.set_state("init")
    assert "[Shadow] restored failover counters engine=2 attempts=3 success=2" in caplog.text
    assert "[Shadow] failover_state engine=2 -> init" in caplog.text
    view = fm.engine_failover_view(m.render())["2"]
    assert (view.state, view.attempts, view.success) == ("init", 3, 2)


def test_missing_or_corrupt_counters_start_at_zero(tmp_path):
    (tmp_path / "failover_metrics_engine-5.json").write_text("{not json")
    assert load_counters(str(tmp_path / "failover_metrics_engine-5.json")) == (0, 0)
    assert load_counters(str(tmp_path / "absent.json")) == (0, 0)
