"""Is the runtime environment able to run the deployment? Run by the runtime's own interpreter after python_env
built (or found) it: ``python -m shadowline.deployment.runtime_check --backend NAME --gpus N``.

Imports (not only finds) every module the backend runs, so a wheel built for another CUDA or Python fails here
rather than in the first engine; for a backend on GPUs, asks torch how many CUDA devices it sees. Prints one JSON
line and exits 1 naming what is missing, 0 when nothing is. Standard library only: it must run before anything
else works in that environment.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any, Dict, List, Optional

from ..backends import backend

ALWAYS = ("shadowline", "dynamo")  # the agent, the stand-in and the frontend's runtime


def check(backend_name: str, gpus: int) -> Dict[str, Any]:
    strategy = backend(backend_name)
    missing: List[str] = []
    for name in dict.fromkeys(ALWAYS + tuple(strategy.runtime_modules)):
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 (any failure to import is the finding: a missing .so, a wrong CUDA)
            missing.append(f"{name} ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})")
    seen: Optional[int] = None
    if strategy.uses_gpus and gpus > 0 and not missing:
        try:
            import torch  # noqa: PLC0415 (vLLM's; only on GPU backends)
            seen = int(torch.cuda.device_count())
        except Exception as err:  # noqa: BLE001
            missing.append(f"CUDA devices (torch: {type(err).__name__}: {err})")
        else:
            if seen < gpus:
                missing.append(f"CUDA devices: torch sees {seen}, the deployment needs {gpus} per node "
                               "(driver, CUDA_VISIBLE_DEVICES, or a container without GPU access)")
    return {"backend": backend_name, "python": sys.version.split()[0], "missing": missing, "cuda_devices": seen}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shadowline.deployment.runtime_check")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--gpus", type=int, default=0, help="GPUs per node the deployment uses")
    args = parser.parse_args(argv)
    result = check(args.backend, args.gpus)
    sys.stdout.write(json.dumps(result) + "\n")
    return 1 if result["missing"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
