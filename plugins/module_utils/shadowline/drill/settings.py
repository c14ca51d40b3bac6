"""The drill's numbers (playbooks/drill.yml's extra variables), checked for sense before anything happens: finite,
positive where they must be, bounded, and ordered (the warm-up fits in the load). A ``drill_cut_s`` of nan would
take a node's network down and never bring it back."""

from __future__ import annotations

from typing import Any

from ..common.problems import Problem
from ..common.values import Reader

# name -> (0 allowed, most, an example)
NUMBERS: dict[str, tuple[bool, float, float]] = {
    "drill_rate": (False, 1000.0, 20.0),  # requests per second
    "drill_max_s": (False, 3600.0, 30.0),
    "drill_warmup_s": (True, 600.0, 2.0),
    "drill_tail_s": (True, 600.0, 2.0),
    "drill_cut_s": (False, 600.0, 5.0),
    "drill_steady_timeout_s": (False, 3600.0, 60.0),
    "drill_request_timeout_s": (False, 600.0, 5.0),
}


def check(values: dict[str, Any]) -> list[str]:
    """Problems with the drill's numbers (those given), each naming the variable and the fix; [] when all make sense."""
    problems: list[Problem] = []
    read = Reader(problems)
    parsed = {}
    for name, value in values.items():
        if name not in NUMBERS:
            problems.append(Problem(name, "is not a drill setting.", f"use one of {', '.join(NUMBERS)}."))
            continue
        zero_ok, most, example = NUMBERS[name]
        parsed[name] = read.number(name, value, maximum=most, positive=not zero_ok, example=example)
    warmup, longest = parsed.get("drill_warmup_s"), parsed.get("drill_max_s")
    if warmup is not None and longest is not None and warmup >= longest:
        read.problem("drill_warmup_s", f"is {warmup:g} s, not below drill_max_s ({longest:g} s): the fault would "
                                       "come after the load ended.", "set drill_warmup_s below drill_max_s.")
    return [str(p) for p in problems]
