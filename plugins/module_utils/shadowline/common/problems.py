"""A problem found in the user's input: which variable, on which host, what is wrong, and the fix.

Every check in shadowline reports problems this way and collects all of them before failing, so a
user fixes an inventory in one pass instead of one error per run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    field: str  # the variable, dotted for nested keys: gms_engine.tensor_parallel_size
    message: str  # what is wrong, with the offending value
    fix: str  # what to do about it
    host: str | None = None  # None: the value is the same for (or concerns) the whole deployment

    def __str__(self) -> str:
        where = f" (host {self.host})" if self.host else ""
        return f"{self.field}{where}: {self.message} Fix: {self.fix}"

    def to_dict(self) -> dict[str, str | None]:
        return {"field": self.field, "host": self.host, "message": self.message, "fix": self.fix}


def format_problems(problems: list[Problem], what: str = "preflight") -> str:
    """One readable block listing every problem, numbered."""
    head = f"{what} found {len(problems)} problem{'s' if len(problems) != 1 else ''}; nothing was changed on any host:"
    lines = [head] + [f"  {i}. {p}" for i, p in enumerate(problems, 1)]
    return "\n".join(lines)
