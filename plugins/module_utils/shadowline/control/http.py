"""The one HTTP GET of the library: a status and a body, or None when nothing answered in time."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def fetch(url: str, timeout: float) -> Answer | None:
    """GET ``url``: the answer (an HTTP error status is an answer too), None when nothing answers in time."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (plan URLs only)
            return Answer(response.status, response.read(), dict(response.headers))
    except urllib.error.HTTPError as err:
        try:
            body = err.read()
        except OSError:
            body = b""
        return Answer(err.code, body, dict(err.headers or {}))
    except (OSError, ValueError):
        return None


def http_get(url: str, timeout: float) -> tuple[int, str] | None:
    """(status, body text) or None when nothing answers within the timeout."""
    answer = fetch(url, timeout)
    return None if answer is None else (answer.status, answer.text)
