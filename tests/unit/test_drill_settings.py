"""The drill's numbers are checked before anything happens (playbooks/drill.yml -> drill_probe mode=steady)."""

from __future__ import annotations

import pytest

from shadowline.drill.settings import check


def test_sensible_numbers_pass():
    assert check({"drill_rate": "20", "drill_max_s": 30, "drill_warmup_s": 0, "drill_tail_s": 2, "drill_cut_s": "5",
                  "drill_steady_timeout_s": 60, "drill_request_timeout_s": 5}) == []


@pytest.mark.parametrize(("name", "value", "says"), [
    ("drill_cut_s", "nan", "must be a number"),
    ("drill_cut_s", "inf", "must be a number"),
    ("drill_cut_s", 0, "above 0"),
    ("drill_cut_s", -5, "above 0"),
    ("drill_rate", True, "must be a number"),
    ("drill_max_s", 86400, "at most 3600"),
    ("drill_warmup_s", -1, "at least 0"),
])
def test_numbers_that_make_no_sense_are_refused_by_name(name, value, says):
    (problem,) = check({name: value})
    assert problem.startswith(f"{name}: ") and says in problem and "Fix:" in problem


def test_the_warmup_must_fit_in_the_load():
    (problem,) = check({"drill_warmup_s": 40, "drill_max_s": 30})
    assert problem.startswith("drill_warmup_s:") and "drill_max_s" in problem
