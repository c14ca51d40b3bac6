"""Errors of model staging: each names the inventory field at fault and the fix.

Callers (the Ansible module, daemons) show ``str(error)``; the module also returns ``field`` so a
role can point at the variable to edit.
"""

from __future__ import annotations


class ModelError(Exception):
    """A refusal or failure an operator can act on."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.fix = fix

    def __str__(self) -> str:
        text = self.message
        if self.fix:
            text = f"{text} Fix: {self.fix}"
        return text


class SpecError(ModelError):
    """The model spec (gms_model and friends) is malformed."""


class PolicyError(ModelError):
    """The spec is well-formed but refused by policy (pickle, unpinned revision, format)."""


class SourceError(ModelError):
    """The source could not be listed or fetched."""


class SpaceError(ModelError):
    """Not enough free space for the files still to fetch."""


class VerifyError(ModelError):
    """Staged files do not match what the source says they must be."""


class BusyError(ModelError):
    """Another staging of the same local_dir holds the lock."""


class MissingDependencyError(ModelError):
    """A Python package or command needed for the chosen source is not installed on the node."""
