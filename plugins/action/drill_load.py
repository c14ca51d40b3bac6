# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of shadowline.gms.drill_load: constant request load through the frontend, in the background.

``state: started`` starts ``python -m shadowline.drill.load`` on the controller (the machine running the
playbook) and returns at once; ``state: stopped`` waits until ``stop_at``, stops it, and returns every request.
The load is bounded by itself (``rate`` x ``duration_s`` and ``max_requests``), so a playbook that dies between
the two leaves nothing running for long.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.drill import load as load_lib

LIBRARY = Path(load_lib.__file__).resolve().parents[2]  # plugins/module_utils: ``shadowline`` is importable


def _is_ours(pid: int, out: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read().split(b"\0")
    except OSError:
        return False
    return b"shadowline.drill.load" in cmdline and out.encode() in cmdline


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("state", "url", "model", "rate", "duration_s", "max_requests", "timeout_s", "pid",
                             "out", "stop_at", "tls"))
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = self._task.args
        state = args.get("state", "started")
        if state == "started":
            return self._start(result, args)
        if state == "stopped":
            return self._stop(result, args)
        result.update(failed=True, msg=f"state: {state!r} is not started or stopped")
        return result

    def _start(self, result: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
        missing = [k for k in ("url", "model") if not args.get(k)]
        if missing:
            result.update(failed=True, msg=f"state=started needs {', '.join(missing)}")
            return result
        rate = float(args.get("rate", 20))
        duration = float(args.get("duration_s", 30))
        max_requests = int(args.get("max_requests", int(rate * duration)))
        if self._play_context.check_mode:
            result.update(changed=False, skipped=True, msg="check mode: no load sent")
            return result
        workdir = tempfile.mkdtemp(prefix="shadowline-drill-load-")
        out = os.path.join(workdir, "requests.jsonl")
        env = {**os.environ, "PYTHONPATH": str(LIBRARY)}
        argv = [sys.executable, "-m", "shadowline.drill.load", "--url", str(args["url"]), "--model",
                str(args["model"]), "--rate", str(rate), "--duration", str(duration), "--max-requests",
                str(max_requests), "--timeout", str(float(args.get("timeout_s", 5))), "--out", out]
        tls = args.get("tls") or {}
        if tls:
            if not isinstance(tls, dict) or sorted(tls) != ["ca", "cert", "key"]:
                result.update(failed=True, msg="tls must be empty or have exactly ca, cert and key (the "
                                               "shadowline.gms.frontend_endpoint filter's tls)")
                return result
            argv += ["--ca", str(tls["ca"]), "--cert", str(tls["cert"]), "--key", str(tls["key"])]
        with open(os.path.join(workdir, "load.log"), "wb") as log:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,  # noqa: S603
                                    start_new_session=True, cwd=workdir)
        started = time.time()
        time.sleep(0.2)
        if proc.poll() is not None:
            text = Path(workdir, "load.log").read_text(errors="replace")[-800:]
            shutil.rmtree(workdir, ignore_errors=True)
            result.update(failed=True, msg=f"the load generator exited at once ({proc.returncode}): {text}")
            return result
        result.update(changed=False, pid=proc.pid, out=out, started_at=started, rate=rate, duration_s=duration,
                      max_requests=max_requests)
        return result

    def _stop(self, result: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
        if self._play_context.check_mode or not args.get("pid"):
            result.update(changed=False, skipped=True, msg="no load ran", requests=[], summary=None)
            return result
        pid, out = int(args["pid"]), str(args["out"])
        stop_at = float(args.get("stop_at") or 0)
        delay = min(max(0.0, stop_at - time.time()), 60.0)
        time.sleep(delay)
        if _is_ours(pid, out):
            os.kill(pid, signal.SIGTERM)
        deadline = time.time() + float(args.get("timeout_s", 5)) + 10
        while _is_ours(pid, out) and time.time() < deadline:
            try:  # our child only when started by this process; otherwise init reaps it
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.05)
        if _is_ours(pid, out):
            os.kill(pid, signal.SIGKILL)
        requests, summary = load_lib.read_results(out)
        workdir = Path(out).parent
        if workdir.name.startswith("shadowline-drill-load-") and workdir.parent == Path(tempfile.gettempdir()):
            shutil.rmtree(workdir, ignore_errors=True)
        if summary is None:
            summary = load_lib.summarize([load_lib.Request(**r) for r in requests])
        result.update(changed=False, requests=requests, summary=summary)
        return result
