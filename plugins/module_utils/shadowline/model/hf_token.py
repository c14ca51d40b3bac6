"""Read the Hugging Face token from a root-only file. The token never leaves this process:
it is not logged, not put in a child's argv or environment, and not returned in results.
"""

from __future__ import annotations

import os
import socket
import stat

from .errors import SpecError

FIELD = "gms_model_hf_token_file"


def read_token_file(path: str) -> str:
    host = socket.gethostname()
    try:
        st = os.stat(path)
    except FileNotFoundError as exc:
        raise SpecError(
            f"{FIELD} {path} does not exist on {host}.",
            field=FIELD,
            fix="install it on every node (ansible.builtin.copy with mode 0600, owner root, no_log: true), or unset it.",
        ) from exc
    except OSError as exc:
        raise SpecError(
            f"{FIELD} {path} cannot be read: {exc.strerror}.", field=FIELD, fix="make it readable by root."
        ) from exc
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(
            f"{FIELD} {path} is not a regular file.", field=FIELD, fix="point it at a file holding only the token."
        )
    if st.st_mode & 0o077:
        raise SpecError(
            f"{FIELD} {path} is accessible by group/others (mode {stat.S_IMODE(st.st_mode):04o}).",
            field=FIELD,
            fix=f"chmod 0600 {path} (owner root).",
        )
    if st.st_uid not in (0, os.geteuid()):
        raise SpecError(
            f"{FIELD} {path} is owned by uid {st.st_uid}, not root.", field=FIELD, fix=f"chown root {path}."
        )
    with open(path, encoding="utf-8", errors="strict") as handle:
        token = handle.read().strip()
    if not token:
        raise SpecError(f"{FIELD} {path} is empty.", field=FIELD, fix="write the token (one line) into it.")
    if len(token) > 4096 or any(c.isspace() for c in token):
        raise SpecError(
            f"{FIELD} {path} does not hold a single token (whitespace or too long).",
            field=FIELD,
            fix="the file must contain only the token on one line.",
        )
    return token


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
