"""Builders of inventory variables for library tests."""

from __future__ import annotations

import copy
from typing import Any

REVISION = "0123456789abcdef0123456789abcdef01234567"

BASE: dict[str, Any] = {
    "gms_deployment": "llama",
    "gms_model": {"id": "meta-llama/Llama-3.3-70B-Instruct", "revision": REVISION},
    "gms_engine": {"backend": "dynamo_vllm", "tensor_parallel_size": 8, "gpus_per_node": 8},
}


def hostvars(nodes: int, **shared: Any) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """hostvars for `nodes` hosts node0..nodeN-1 at 198.18.0.(10+i) (strings only), with shared overrides."""
    values = copy.deepcopy(BASE)
    for key, value in shared.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    hosts = [f"node{i}" for i in range(nodes)]
    result = {h: {**copy.deepcopy(values), "gms_node_rank": i, "ansible_host": f"198.18.0.{10 + i}"}
              for i, h in enumerate(hosts)}
    return result, hosts
