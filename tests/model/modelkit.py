"""Helpers for the model-lifecycle tests: small safetensors models, a fake Hugging Face Hub on
127.0.0.1, and constants. Fixtures live in conftest.py. Nothing here leaves the loopback interface.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np
from safetensors.numpy import save_file

REPO_ROOT = Path(__file__).resolve().parents[2]
MODULE_UTILS = REPO_ROOT / "plugins" / "module_utils"
if str(MODULE_UTILS) not in sys.path:
    sys.path.insert(0, str(MODULE_UTILS))

VENV_BIN = Path(sys.executable).parent
REV = "0123456789abcdef0123456789abcdef01234567"
REV2 = "89abcdef0123456789abcdef0123456789abcdef"
MODEL_ID = "acme/tiny-llm"


def make_model(
    root: Path, *, shards: int = 3, shard_kib: int = 512, seed: int = 0, extra: dict[str, bytes] | None = None
) -> Path:
    """A small sharded safetensors model with config, tokenizer files and an index."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    weight_map = {}
    cols = 256
    rows = max(1, shard_kib * 1024 // (cols * 4))
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {f"layers.{i}.w": rng.standard_normal((rows, cols), dtype=np.float32)}
        save_file(tensors, str(root / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "seed": seed}))
    (root / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    (root / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}))
    (root / "README.md").write_text("# tiny model\n")
    for name, data in (extra or {}).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def model_files(root: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeHub:
    """Answers the endpoints huggingface_hub (2.x) uses for model_info + hf_hub_download.

    GET  /api/models/<repo>/revision/<rev>?blobs=True  -> id, sha, siblings (size, blobId, lfs)
    HEAD /<repo>/resolve/<rev>/<path>                   -> ETag, X-Repo-Commit, Content-Length (+ X-Linked-*)
    GET  /<repo>/resolve/<rev>/<path>                   -> body (Range supported)
    Files larger than ``lfs_threshold`` are presented as LFS (ETag = sha256), smaller as git blobs.
    """

    repo: str
    commits: dict[str, dict[str, bytes]]
    branches: dict[str, str] = field(default_factory=dict)
    token: str | None = None
    lfs_threshold: int = 1024
    corrupt: dict[str, bytes] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    port: int = 0
    _server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def downloads(self) -> list[str]:
        return [path for method, path, _unused in self.requests if method == "GET" and "/resolve/" in path]

    def _resolve(self, rev: str) -> str | None:
        rev = self.branches.get(rev, rev)
        return rev if rev in self.commits else None

    def start(self) -> FakeHub:  # noqa: C901 (over the size limits of pyproject.toml; split it when it changes next)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return

            def _send(self, code: int, headers: dict[str, str], body: bytes = b"", head: bool = False) -> None:
                self.send_response(code)
                for key, value in headers.items():
                    self.send_header(key, value)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head and body:
                    self.wfile.write(body)

            def _error(self, code: int, error_code: str, head: bool = False) -> None:
                body = json.dumps({"error": error_code}).encode()
                self._send(code, {"X-Error-Code": error_code, "Content-Type": "application/json"}, body, head)

            def _auth_ok(self) -> bool:
                auth = self.headers.get("Authorization")
                hub.requests.append((self.command, self.path, auth))
                return hub.token is None or auth == f"Bearer {hub.token}"

            def do_GET(self) -> None:
                self._handle(head=False)

            def do_HEAD(self) -> None:
                self._handle(head=True)

            def _handle(self, head: bool) -> None:
                if not self._auth_ok():
                    self._error(401, "RepoNotFound", head)
                    return
                parts = urlsplit(self.path)
                path = unquote(parts.path)
                api = re.fullmatch(r"/api/models/(.+)/revision/([^/]+)", path)
                if api:
                    repo, rev = api.group(1), api.group(2)
                    if repo != hub.repo:
                        self._error(404, "RepoNotFound", head)
                        return
                    sha = hub._resolve(rev)
                    if sha is None:
                        self._error(404, "RevisionNotFound", head)
                        return
                    blobs = parse_qs(parts.query).get("blobs", ["false"])[0].lower() == "true"
                    siblings = []
                    for name, data in sorted(hub.commits[sha].items()):
                        sib: dict[str, Any] = {"rfilename": name}
                        if blobs:
                            sib["size"] = len(data)
                            sib["blobId"] = git_blob_sha1(data)
                            if len(data) > hub.lfs_threshold:
                                sib["lfs"] = {
                                    "size": len(data),
                                    "sha256": hashlib.sha256(data).hexdigest(),
                                    "pointerSize": 134,
                                }
                        siblings.append(sib)
                    body = json.dumps(
                        {"id": hub.repo, "modelId": hub.repo, "sha": sha, "private": False, "siblings": siblings}
                    ).encode()
                    self._send(200, {"Content-Type": "application/json"}, body, head)
                    return
                res = re.fullmatch(r"/(.+?/.+?)/resolve/([^/]+)/(.+)", path)
                if not res or res.group(1) != hub.repo:
                    self._error(404, "RepoNotFound", head)
                    return
                sha = hub._resolve(res.group(2))
                if sha is None:
                    self._error(404, "RevisionNotFound", head)
                    return
                name = res.group(3)
                files = hub.commits[sha]
                if name not in files:
                    self._send(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": sha}, b"", head)
                    return
                data = files[name]
                served = hub.corrupt.get(name, data)
                is_lfs = len(data) > hub.lfs_threshold
                etag = hashlib.sha256(data).hexdigest() if is_lfs else git_blob_sha1(data)
                headers = {
                    "ETag": f'"{etag}"',
                    "X-Repo-Commit": sha,
                    "Accept-Ranges": "bytes",
                    "Content-Type": "application/octet-stream",
                }
                if is_lfs:
                    headers["X-Linked-Etag"] = f'"{etag}"'
                    headers["X-Linked-Size"] = str(len(data))
                start = 0
                rng = self.headers.get("Range")
                if rng and not head:
                    match = re.fullmatch(r"bytes=(\d+)-", rng.strip())
                    if match:
                        start = int(match.group(1))
                body = served[start:]
                headers["Content-Length"] = str(len(body))
                if start:
                    headers["Content-Range"] = f"bytes {start}-{len(served) - 1}/{len(served)}"
                self._send(206 if start else 200, headers, body, head)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
