"""Typed reads of user values that collect problems instead of raising.

Inventory values arrive as YAML scalars, strings from `-e key=value`, or Jinja results. A number given
as the string "8" is accepted (that is what `-e` produces); "eight" is a problem that names the field.
"""

from __future__ import annotations

import difflib
import math
import posixpath
from typing import Any

from .problems import Problem


class Reader:
    """Reads fields of one mapping, recording a Problem for each bad value."""

    def __init__(self, problems: list[Problem], host: str | None = None) -> None:
        self.problems = problems
        self.host = host

    def problem(self, field: str, message: str, fix: str) -> None:
        self.problems.append(Problem(field=field, message=message, fix=fix, host=self.host))

    def mapping(self, field: str, value: Any, known: dict[str, Any]) -> dict[str, Any]:
        """A dict of known keys merged over defaults; unknown keys are reported with a suggestion."""
        if value is None:
            return dict(known)
        if not isinstance(value, dict):
            self.problem(field, f"must be a mapping, got {describe(value)}.",
                         f"write {field} as a YAML mapping with the keys {', '.join(sorted(known))}.")
            return dict(known)
        for key in value:
            if key not in known:
                self.problem(f"{field}.{key}", "is not a known key.", suggest(str(key), list(known), field))
        merged = dict(known)
        merged.update({k: v for k, v in value.items() if k in known and v is not None})
        return merged

    def integer(self, field: str, value: Any, minimum: int | None = None, maximum: int | None = None,
                example: int | None = None) -> int | None:
        number = as_int(value)
        if number is None:
            hint = f" such as {example}" if example is not None else ""
            self.problem(field, f"must be a whole number, got {describe(value)}.",
                         f"set {field} to a whole number{hint}.")
            return None
        if minimum is not None and number < minimum or maximum is not None and number > maximum:
            bounds = range_text(minimum, maximum)
            self.problem(field, f"is {number}, outside {bounds}.", f"set {field} to a value in {bounds}.")
            return None
        return number

    def number(self, field: str, value: Any, minimum: float = 0.0, maximum: float | None = None,
               positive: bool = False, example: float = 1.5) -> float | None:
        """A finite number (never nan or infinity) of at least ``minimum`` (above 0 when ``positive``), at most
        ``maximum``; a problem naming the field and the fix otherwise."""
        parsed = as_number(value)
        if parsed is None:
            self.problem(field, f"must be a number, got {describe(value)}.", f"set {field} to a number such as {example:g}.")
            return None
        if positive and parsed <= 0 or parsed < minimum or maximum is not None and parsed > maximum:
            low = "above 0" if positive and minimum <= 0 else f"at least {minimum:g}"
            bounds = low + (f" and at most {maximum:g}" if maximum is not None else "")
            self.problem(field, f"is {parsed:g}, but must be {bounds}.", f"set {field} to a number {bounds}, e.g. {example:g}.")
            return None
        return parsed

    def boolean(self, field: str, value: Any) -> bool | None:
        parsed = as_bool(value)
        if parsed is None:
            self.problem(field, f"must be true or false, got {describe(value)}.", f"set {field} to true or false.")
        return parsed

    def string(self, field: str, value: Any, example: str) -> str | None:
        if isinstance(value, str) and value.strip():
            return value.strip()
        self.problem(field, f"must be a non-empty string, got {describe(value)}.", f"set {field}, for example {example}.")
        return None

    def path(self, field: str, value: Any, example: str, home_ok: bool = False) -> str | None:
        """A path of the deployment (path_problem's rules): absolute (or ~/... where ``home_ok``: a controller
        path), without spaces, normalised, neither the root nor a system directory, at least two levels deep."""
        if not (isinstance(value, str) and value.startswith(("/", "~/") if home_ok else "/")
                and not any(c.isspace() for c in value)):
            where = " (or ~/...)" if home_ok else ""
            self.problem(field, f"must be an absolute path{where} without spaces, got {describe(value)}.",
                         f"set {field} to an absolute path such as {example}.")
            return None
        wrong = path_problem(value)
        if wrong is not None:
            self.problem(field, wrong[0], wrong[1].format(field=field, example=example))
            return None
        return value

    def choice(self, field: str, value: Any, choices: list[str]) -> str | None:
        if isinstance(value, str) and value in choices:
            return value
        self.problem(field, f"is {describe(value)}, not one of {', '.join(choices)}.",
                     f"set {field} to one of {', '.join(choices)}.")
        return None

    def string_list(self, field: str, value: Any, example: str) -> list[str] | None:
        if value is None:
            return []
        if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                                                    for v in value):
            return [str(v) for v in value]
        if isinstance(value, str):
            self.problem(field, f"must be a list of strings, got the single string {value!r}.",
                         f"write it as a YAML list, one argument per item: {example}.")
        else:
            self.problem(field, f"must be a list of strings, got {describe(value)}.",
                         f"write it as a YAML list, one argument per item: {example}.")
        return None


# The directories of the system no path of a deployment may be: the roles create a deployment's directories and
# give them to its service user, and teardown removes what the deployment created (docs/roles.md, Teardown).
# The one home of this list (common/values.py): the contract's paths, gms_slurm's and the docs use it.
SYSTEM_DIRECTORIES = frozenset({
    "/", "/bin", "/boot", "/dev", "/dev/shm", "/dev/mqueue", "/dev/hugepages", "/etc", "/etc/systemd",
    "/etc/systemd/system", "/etc/tmpfiles.d", "/etc/default", "/etc/ssl", "/home", "/lib", "/lib32", "/lib64",
    "/libx32", "/lost+found", "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/run/lock", "/run/user",
    "/run/systemd", "/sbin", "/snap", "/srv", "/sys", "/sys/fs/cgroup", "/tmp", "/usr", "/usr/bin", "/usr/include",
    "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/local", "/usr/local/bin", "/usr/local/etc",
    "/usr/local/lib", "/usr/local/sbin", "/usr/local/share", "/usr/sbin", "/usr/share", "/usr/src", "/var",
    "/var/backups", "/var/cache", "/var/lib", "/var/local", "/var/lock", "/var/log", "/var/mail", "/var/opt",
    "/var/run", "/var/spool", "/var/tmp",
})
MIN_PATH_DEPTH = 2  # /<a>/<b> at least: a path one level below the root is the root's own entry


def path_problem(path: str) -> tuple[str, str] | None:
    """What is wrong with an absolute path (or ~/... of the controller) of a deployment, and the fix (with
    {field} and {example} to fill in); None when it is fine. A path must be written as itself (no '.', '..',
    '//' or trailing '/', which would make it another path than it looks), must not be the root or a system
    directory (SYSTEM_DIRECTORIES), and must be at least MIN_PATH_DEPTH levels deep."""
    home = path.startswith("~/")
    body = path[1:] if home else path
    parts = body.split("/")[1:]
    if any(part in ("", ".", "..") for part in parts) and path != "/":
        means = posixpath.normpath("/" + "/".join(parts)) if not home else "~" + posixpath.normpath(body)
        return (f"{path!r} is not written as the path itself ('.', '..', '//' or a trailing '/'); it means {means}.",
                "write {field} as a plain absolute path, without '.', '..', '//' or a trailing '/', "
                "such as {example}.")
    if not home and path in SYSTEM_DIRECTORIES:
        what = "the root directory" if path == "/" else "a system directory"
        return (f"is {path}, {what}: a deployment's directories are its own (the roles give them to the service "
                "user, and teardown removes what the deployment created).",
                "set {field} to a path of the deployment's own below it, such as {example}.")
    if not home and len(parts) < MIN_PATH_DEPTH:
        return (f"is {path}, directly below /: a deployment's path must be at least {MIN_PATH_DEPTH} levels deep.",
                "set {field} to a path at least two levels deep, such as {example}.")
    return None


def as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("+-").isdigit():
            return int(text)
    return None


def as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "yes", "on", "1"):
            return True
        if lowered in ("false", "no", "off", "0"):
            return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    return None


def as_number(value: Any) -> float | None:
    """A finite float from a number or a numeric string; None for anything else (booleans, nan, infinity)."""
    if isinstance(value, bool):
        return None
    try:
        parsed = float(value) if isinstance(value, (int, float)) else float(str(value).strip())
    except (ValueError, OverflowError):
        return None
    return parsed if math.isfinite(parsed) else None


def describe(value: Any) -> str:
    """A value as the user wrote it, with its type when that is the point."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, (list, tuple)):
        return f"a list ({len(value)} items)"
    if isinstance(value, dict):
        return "a mapping"
    return repr(value)


def range_text(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"{minimum}..{maximum}"
    if minimum is not None:
        return f"{minimum} or more"
    return f"at most {maximum}"


def close_match(name: str, known: list[str]) -> str | None:
    """The one of ``known`` that ``name`` is most likely a misspelling of, if any (the one fuzzy match of names)."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return close[0] if close else None


def suggest(name: str, known: list[str], where: str) -> str:
    close = close_match(name, known)
    if close:
        return f"did you mean {close!r}? Rename it, or remove it."
    return f"remove it; {where} takes {', '.join(sorted(known))}."
