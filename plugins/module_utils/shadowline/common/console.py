"""What the library's programs (the agent, the Slurm supervisor and watchdog, the stand-in, the `shadowline`
command) write for a person or a log: whole lines to standard output or standard error.

One home for it, and not ``print``: the library is also Ansible ``module_utils``, where printing to standard output
would break a module's JSON answer; these functions are for the programs' own command lines only.
"""

from __future__ import annotations

import sys


def out(text: str, flush: bool = False) -> None:
    """A line on standard output."""
    sys.stdout.write(f"{text}\n")
    if flush:
        sys.stdout.flush()


def err(text: str) -> None:
    """A line on standard error (unbuffered in effect: flushed at once)."""
    sys.stderr.write(f"{text}\n")
    sys.stderr.flush()
