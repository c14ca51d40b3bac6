"""Small checks a Slurm task runs on its node: ``python -m shadowline.slurm.node_tasks <check> ...``.

- ``model-status --local-dir D --model-id M --revision R``: this node's staged model, for the readiness gate.
  Prints one JSON line ``{"node": ..., "status": {...} | null, "problem": ...}``: the status file that
  staging (shadowline.gms.model_stage) wrote beside the model, after a fast verify of the directory against
  its manifest (one stat per file), so a file changed since staging turns the node's state to Failed.
- ``wait-files --pattern GLOB --count N --timeout S``: until N files match (e.g. the GMS server's sockets).
- ``wait-listening --port P [--port P ...] --timeout S``: until each port of 127.0.0.1 accepts a connection (the
  etcd proxy).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from typing import Any

from ..cluster.waits import files_check, listening_check, poll
from ..common import console
from ..model.errors import ModelError
from ..model.manifest import load_manifest
from ..model.spec import status_path_for
from ..model.status import FAILED, READY, read_status
from ..model.verify import verify_dir


def model_status(local_dir: str, model_id: str, revision: str) -> dict[str, Any]:
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    status = read_status(status_path_for(local_dir))
    if status is None:
        return {"node": node, "status": None,
                "problem": f"no model status beside {local_dir}: stage {model_id}@{revision} on this node "
                           "(shadowline.gms.model_stage) before submitting"}
    data = status.as_dict()
    if status.state == READY:
        try:
            manifest = load_manifest(local_dir)
        except ModelError as err:
            manifest, data["error"] = None, err.message
        if manifest is None:
            data.update(state=FAILED, error=data.get("error") or f"{local_dir} has no manifest")
        else:
            report = verify_dir(local_dir, manifest, "fast")
            if not report.clean:
                data.update(state=FAILED, error="changed since staging: " + "; ".join(report.problems(5)))
            elif manifest.digest != status.digest:
                data.update(state=FAILED, error="the manifest does not match the status file")
    return {"node": node, "status": data, "problem": None if data["state"] == READY else data.get("error")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shadowline.slurm.node_tasks")
    sub = p.add_subparsers(dest="check", required=True)
    model = sub.add_parser("model-status")
    model.add_argument("--local-dir", required=True)
    model.add_argument("--model-id", required=True)
    model.add_argument("--revision", required=True)
    wait = sub.add_parser("wait-files")
    wait.add_argument("--pattern", required=True)
    wait.add_argument("--count", type=int, default=1)
    wait.add_argument("--timeout", type=float, default=600)
    listening = sub.add_parser("wait-listening")
    listening.add_argument("--port", type=int, action="append", required=True)
    listening.add_argument("--timeout", type=float, default=600)
    args = p.parse_args(argv)
    if args.check == "model-status":
        console.out(json.dumps(model_status(args.local_dir, args.model_id, args.revision), sort_keys=True), flush=True)
        return 0
    check = listening_check("127.0.0.1", args.port) if args.check == "wait-listening" else files_check(args.pattern, args.count)
    ready, waited, seen = poll(check, args.timeout, 0.05)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    console.out(f"{node}: {'ready' if ready else 'NOT ready'} after {waited:.2f} s ({seen})", flush=True)
    return 0 if ready else 1


if __name__ == "__main__":
    raise SystemExit(main())
