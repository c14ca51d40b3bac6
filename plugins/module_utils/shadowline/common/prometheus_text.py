"""The one reader of the Prometheus text exposition format (version 0.0.4) in shadowline: what an engine's, a
stand-in's or an agent's ``/metrics`` says, as (name, labels, value) samples.

Standard library only: it runs in the node agent and in Ansible's module_utils, where ``prometheus_client`` may be
missing. It reads what the format allows and a scraper meets: ``# HELP``/``# TYPE`` and other comments (skipped),
label values with escaped quotes, backslashes and newlines (``\\"``, ``\\\\``, ``\\n``) and with ``{``, ``}``,
``,`` or ``=`` inside the quotes, a trailing comma after the last label, ``NaN``, ``+Inf`` and ``-Inf`` values,
an optional timestamp after the value, and each line of a histogram or summary (``_bucket`` with its ``le`` label,
``_sum``, ``_count``) as a sample of its own. A line it cannot read is left out and the rest is read, so that one
broken line of a large scrape does not hide the samples a caller looks for.
"""

from __future__ import annotations

import re
from typing import Iterator, NamedTuple

_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*\"")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class Sample(NamedTuple):
    """One sample line: ``name{labels} value``. A tuple, so ``for name, labels, value in samples(text)`` works."""

    name: str
    labels: dict[str, str]
    value: float


def samples(text: str, prefix: str = "") -> list[Sample]:
    """Every sample of ``text`` in order, optionally only those whose name starts with ``prefix``."""
    return [s for s in iter_samples(text) if s.name.startswith(prefix)]


def iter_samples(text: str) -> Iterator[Sample]:
    for raw in text.splitlines():
        sample = parse_line(raw)
        if sample is not None:
            yield sample


def parse_line(raw: str) -> Sample | None:
    """The sample of one line, or None for a comment, a blank line or a line that is not a sample."""
    line = raw.strip()
    if not line or line.startswith("#"):
        return None
    name = _NAME.match(line)
    if name is None:
        return None
    rest = line[name.end():]
    labels: dict[str, str] = {}
    if rest.startswith("{"):
        parsed = _labels(rest, 1)
        if parsed is None:
            return None
        labels, end = parsed
        rest = rest[end:]
    elif rest and not rest[0].isspace():
        return None  # a name glued to something else
    fields = rest.split()
    if len(fields) not in (1, 2):
        return None
    try:
        value = float(fields[0])
        if len(fields) == 2:
            int(fields[1])  # the timestamp: milliseconds since the epoch
    except ValueError:
        return None
    return Sample(name.group(0), labels, value)


def _labels(line: str, pos: int) -> tuple[dict[str, str], int] | None:
    """The label set that starts at ``pos`` (just after ``{``) and the position after its ``}``; None if broken."""
    labels: dict[str, str] = {}
    while True:
        while pos < len(line) and line[pos].isspace():
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        key = _LABEL_NAME.match(line, pos)
        if key is None:
            return None
        value, pos = _quoted(line, key.end())
        if value is None:
            return None
        labels[key.group(1)] = value
        while pos < len(line) and line[pos].isspace():
            pos += 1
        if pos < len(line) and line[pos] == ",":
            pos += 1
        elif pos >= len(line) or line[pos] != "}":
            return None


def _quoted(line: str, pos: int) -> tuple[str | None, int]:
    """A label value from ``pos`` (just after its opening quote) to its closing quote, unescaped."""
    out = []
    while pos < len(line):
        char = line[pos]
        if char == '"':
            return "".join(out), pos + 1
        if char == "\\" and pos + 1 < len(line):
            nxt = line[pos + 1]
            out.append(_ESCAPES.get(nxt, "\\" + nxt))  # an unknown escape is kept as written
            pos += 2
            continue
        out.append(char)
        pos += 1
    return None, pos
