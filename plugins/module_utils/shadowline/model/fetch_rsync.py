"""``rsync://host[:port]/module/path`` (rsync daemon) and ``rsync+ssh://[user@]host[:port]/abs/path``:
pull with the ``rsync`` command, for air-gapped clusters staging from a head node or a neighbour.

The listing (``rsync --list-only``) gives every file's size before anything moves, so policy and
free space are checked first. The transfer keeps partial files in ``.rsync-partial`` so an
interrupted pull resumes mid-file; rsync's own quick check (size, mtime) skips finished files.
Every transferred file is then hashed (in parallel) and, when the source directory carries a
``shadowline-manifest.json``, checked against it. ssh runs with ``BatchMode=yes`` (keys or agent,
never a prompt); nothing secret is put on a command line. Host and user are checked by spec.parse_source
(no leading '-', no spaces or control characters) and the positional arguments follow ``--``.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import typing

from .errors import MissingDependencyError, SourceError
from .hashing import FileDigest, default_workers, hash_file, map_files
from .manifest import load_manifest
from .plan import Plan, RemoteFile, apply_source_manifest, no_manifest_note
from .policy import MANIFEST_NAME
from .progress import ProgressTracker
from .spec import ModelSpec

NAME = "rsync"
REUSES_PARTIAL = True
PARTIAL_DIR = ".rsync-partial"
IO_TIMEOUT_S = 300
CONNECT_TIMEOUT_S = 30

DoneCallback = typing.Callable[[RemoteFile, FileDigest], None]

_LIST_RE = re.compile(r"^([-dlcbps])[-rwxsStTl+.]{9}\S*\s+([\d,.]+)\s+\d{4}/\d\d/\d\d\s+\d\d:\d\d:\d\d\s(.+)$")
_PROGRESS_RE = re.compile(rb"^\s*([\d,]+)\s+\d+%")

# rsync exit codes worth explaining
_RC = {
    5: "error starting client-server protocol (wrong module name or daemon refused)",
    10: "error in socket I/O (host/port unreachable)",
    12: "error in rsync protocol data stream",
    23: "partial transfer due to error (some source files unreadable or missing)",
    24: "partial transfer, source files vanished",
    30: "timeout in data send/receive",
    35: "timeout waiting for daemon connection",
    255: "ssh failed (host unreachable, or no key accepted in BatchMode)",
}


def _rsync_bin() -> str:
    path = shutil.which("rsync")
    if not path:
        raise MissingDependencyError(
            f"the rsync command is not installed on {socket.gethostname()}, and gms_model.source is {NAME}://.",
            field="gms_model.source",
            fix="install rsync on the nodes (apt-get install rsync / dnf install rsync).",
        )
    return path


def _base_cmd(spec: ModelSpec) -> list[str]:
    cmd = [_rsync_bin(), "--no-motd", "-8", "--copy-links", f"--timeout={IO_TIMEOUT_S}"]
    if spec.source.scheme == "rsync+ssh":
        ssh = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
        if spec.source.port:
            ssh += ["-p", str(spec.source.port)]
        cmd += ["-e", " ".join(ssh)]
    else:
        cmd.append(f"--contimeout={CONNECT_TIMEOUT_S}")
    return cmd


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "TOKEN" not in k.upper()}
    env["LC_ALL"] = "C"
    return env


def _explain(rc: int, stderr: str, spec: ModelSpec, what: str) -> SourceError:
    tail = " | ".join(line.strip() for line in stderr.strip().splitlines()[-3:])
    return SourceError(
        f"rsync {what} from {spec.source.uri} failed (exit {rc}: {_RC.get(rc, 'see rsync(1)')}): {tail}",
        field="gms_model.source",
        fix="check that the host is reachable from this node and the module/path exist "
        "(rsync daemon: rsync://host[:port]/module/path; ssh: rsync+ssh://host/abs/path); re-run to resume.",
    )


def transfer_root(spec: ModelSpec) -> tuple[str, str]:
    """(rsync URL of the transfer root, path of the model directory below it).

    ``--files-from`` entries are written ``<subdir>/./<file>``: with the implied ``--relative`` only
    the part after ``/./`` is created in the staging directory. Naming files relative to a
    subdirectory source instead is mishandled by some rsync daemons ("file has vanished").
    """
    src = spec.source
    path = (src.path or "").strip("/")
    userpart = f"{src.user}@" if src.user else ""
    if src.scheme == "rsync":
        module, _sep, sub = path.partition("/")
        port = f":{src.port}" if src.port else ""
        return f"rsync://{userpart}{src.host}{port}/{module}/", sub
    return f"{userpart}{src.host}:/", path


def parse_listing(text: str) -> list[RemoteFile]:
    files = []
    for line in text.splitlines():
        match = _LIST_RE.match(line)
        if not match or match.group(1) != "-":
            continue
        size = int(match.group(2).replace(",", "").replace(".", ""))
        files.append(RemoteFile(match.group(3), size))
    return files


def plan(spec: ModelSpec, token: str | None = None) -> Plan:
    url = spec.source.rsync_url
    proc = subprocess.run(
        _base_cmd(spec) + ["--list-only", "--recursive", "--", url],
        capture_output=True,
        text=True,
        env=_child_env(),
        check=False,
    )
    if proc.returncode != 0:
        raise _explain(proc.returncode, proc.stderr, spec, "listing")
    files = [f for f in parse_listing(proc.stdout) if not any(p.startswith(".") for p in f.path.split("/"))]
    result = Plan(revision=spec.revision, files=files)
    if any(f.path == MANIFEST_NAME for f in files):
        with tempfile.TemporaryDirectory(prefix="shadowline-srcmanifest-") as tmp:
            got = subprocess.run(
                _base_cmd(spec) + ["--", url + MANIFEST_NAME, tmp + "/"],
                capture_output=True,
                text=True,
                env=_child_env(),
                check=False,
            )
            if got.returncode != 0:
                raise _explain(got.returncode, got.stderr, spec, "manifest fetch")
            manifest = load_manifest(tmp)
        if manifest is not None:
            apply_source_manifest(spec, result, manifest, spec.source.uri)
    else:
        result.notes.append(no_manifest_note(spec.source.uri))
    return result


def fetch(
    spec: ModelSpec,
    token: str | None,
    source_plan: Plan,
    files: list[RemoteFile],
    staging_dir: str,
    tracker: ProgressTracker,
    done: DoneCallback,
) -> None:
    if not files:
        return
    root_url, sub = transfer_root(spec)
    cmd = _base_cmd(spec) + [
        "--times",
        f"--partial-dir={PARTIAL_DIR}",
        "--files-from=-",
        "--from0",
        "--no-inc-recursive",
        "--info=progress2",
        "--",
        root_url,
        staging_dir.rstrip("/") + "/",
    ]
    prefix = f"{sub}/./" if sub else ""
    listing = b"".join((prefix + f.path).encode("utf-8") + b"\0" for f in files)
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=_child_env())
        if proc.stdin is None or proc.stdout is None:
            raise RuntimeError("rsync pipes were not created")
        proc.stdin.write(listing)
        proc.stdin.close()
        pending = b""
        while True:
            chunk = proc.stdout.read1(65536) if hasattr(proc.stdout, "read1") else proc.stdout.read(4096)
            if not chunk:
                break
            pending += chunk
            *lines, pending = re.split(rb"[\r\n]", pending)
            for line in lines:
                match = _PROGRESS_RE.match(line)
                if match:
                    tracker.set_bytes(int(match.group(1).replace(b",", b"")))
        rc = proc.wait()
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    if rc != 0:
        raise _explain(rc, stderr, spec, "transfer")
    tracker.set_bytes(sum(f.size or 0 for f in files))

    by_path = {f.path: f for f in files}

    def hash_one(rel: str) -> None:
        done(by_path[rel], hash_file(os.path.join(staging_dir, rel)))

    map_files(
        hash_one, sorted(by_path, key=lambda p: by_path[p].size or 0, reverse=True), spec.workers or default_workers()
    )
