#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_facts
short_description: Gather the read-only node facts that shadowline's preflight checks need
version_added: "0.1.0"
description:
  - Reads, without changing anything, what the preflight of a shadowline deployment needs from one node
    listening TCP ports and whether each belongs to this deployment, the filesystem under the failover lock
    path, the GPUs C(nvidia-smi) lists, whether the runtime Python finds the backend's modules, and the
    total weight size from a staged model's manifest.
  - Returns them as the fact C(shadowline_node). The C(shadowline.gms.preflight) action reads that fact from
    every node and checks the whole deployment at once.
  - Every option is taken as given, even when invalid, so a broken inventory still yields facts and the
    preflight reports every problem in one run.
options:
  deployment:
    description: Value of C(gms_deployment); processes of this deployment do not count as port conflicts.
    type: raw
  socket_dir:
    description: Value of C(gms_socket_dir), when set.
    type: raw
  lock_path:
    description: Value of C(gms_lock_path), when set; defaults from I(socket_dir) or I(deployment).
    type: raw
  python:
    description: Value of C(gms_python), the runtime interpreter on the node.
    type: raw
  backend:
    description: Value of C(gms_engine.backend).
    type: raw
  model:
    description: Value of C(gms_model); the manifest in its local directory gives the weight size.
    type: raw
  service_user:
    description: Value of C(gms_service_user).
    type: raw
    default: shadowline
  runtime_mode:
    description: Value of C(python_env_mode) (C(venv), C(wheelhouse), C(external) or C(container)); how the runtime is delivered.
    type: raw
  wheelhouse:
    description: Value of C(python_env_wheelhouse); in C(wheelhouse) mode, which projects its wheels are of.
    type: raw
  container:
    description:
      - Value of C(gms_container). In C(container) mode, whether the node has the image (the backend's default
        when none is named) and, without an archive to load, whether its registry serves it (C(podman manifest
        inspect), read-only); nothing is asked before podman is installed.
    type: raw
  hf_token_file:
    description:
      - Value of C(gms_model_hf_token_file). Whether the model module could read it on this node (there, a regular
        file, 0600, owned by root, one token), by the module's own check; the token is never returned.
    type: raw
attributes:
  platform:
    platforms: posix
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
- name: Gather preflight facts on every node
  shadowline.gms.preflight_facts:
    deployment: "{{ gms_deployment | default(omit) }}"
    lock_path: "{{ gms_lock_path | default(omit) }}"
    python: "{{ gms_python | default(omit) }}"
    backend: "{{ (gms_engine | default({})).backend | default(omit) }}"
    model: "{{ gms_model | default(omit) }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts about the node.
  returned: always
  type: dict
  contains:
    shadowline_node:
      description: >-
        Listening ports, lock directory filesystem, GPUs, runtime Python, manifest size, and the model the node's
        engines run now (C(running_model), from the deployment's plan.json: revision, directory, tensor parallel
        size, weight bytes; null before a first deployment) and whether its control plane runs secured
        (C(running_secure), the plan's etcd authentication and NATS TLS; null before a first deployment), and the
        SHA-256 digests (never the content) of the CA certificate and etcd passwords it runs with
        (C(installed_secrets); null before a first deployment or with C(gms_insecure)), and who the module ran
        as (C(privilege): uid and user name, after become; preflight refuses anyone but root).
      type: dict
      sample:
        listening: [{port: 22, address: 0.0.0.0, pid: 301, process: sshd, ours: false}]
        lock_dir: {path: /run/shadowline/demo/gms, fstype: tmpfs, exists: false, read_only: false}
        gpus: null
        python: {path: /opt/shadowline/demo/venv/bin/python, exists: true, modules: {}}
        manifest_weight_bytes: null
        running_model: {revision: 5ad0f1e0c0ffee5ad0f1e0c0ffee5ad0f1e0c0ff, model_dir: /var/lib/shadowline/models/m/5ad0f1e0c0ffee5ad0f1e0c0ffee5ad0f1e0c0ff,
                        tensor_parallel_size: 2, weight_bytes: 6291456}
        running_secure: true
        installed_secrets: {ca.crt: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08,
                            etcd-agent.password: 60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752,
                            etcd-root.password: null}
        image: null
        privilege: {uid: 0, user: root}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.contract import (
    effective_local_dir,
    effective_paths,
    effective_python,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.node_facts import gather


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "deployment": {"type": "raw"},
            "socket_dir": {"type": "raw"},
            "lock_path": {"type": "raw"},
            "python": {"type": "raw"},
            "backend": {"type": "raw"},
            "model": {"type": "raw"},
            "service_user": {"type": "raw", "default": "shadowline"},
            "runtime_mode": {"type": "raw"},
            "wheelhouse": {"type": "raw"},
            "container": {"type": "raw"},
            "hf_token_file": {"type": "raw"},
        },
        supports_check_mode=True,
    )
    p = module.params
    _socket_dir, lock_path = effective_paths(p["deployment"], p["socket_dir"], p["lock_path"])
    text = {k: v if isinstance(v, str) and v else None for k, v in p.items()}
    facts = gather(deployment=text["deployment"], lock_path=lock_path,
                   python=effective_python(p["deployment"], p["python"]), backend=text["backend"],
                   model_dir=effective_local_dir(p["model"]), service_user=text["service_user"],
                   runtime_mode=text["runtime_mode"], wheelhouse=text["wheelhouse"],
                   container=p["container"] if isinstance(p["container"], dict) else None,
                   hf_token_file=text["hf_token_file"])
    module.exit_json(changed=False, ansible_facts={"shadowline_node": facts})


if __name__ == "__main__":
    main()
