#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_stage
short_description: Stage the pinned model onto this node's local disk, verified
version_added: "0.1.0"
description:
  - Makes the O(model) C(local_dir) hold exactly the model C(id) at C(revision), fetched from
    C(source), with a C(shadowline-manifest.json) recording every file's size and sha256 and a
    manifest digest that is equal on every node holding the same content.
  - Staging happens in a hidden sibling directory C(.<name>.staging-<revision>) on the same filesystem
    and is renamed into place only after every file is verified, so an interrupted run never leaves a
    directory that looks complete; a re-run resumes and keeps the files already fetched and verified.
  - An unchanged model re-verifies without hashing (stat keys recorded in the manifest);
    O(verify=full) rehashes every file. A damaged file is detected and fetched again.
  - Refuses pickle weights (C(.bin), C(.pt), C(.pth), C(.pkl), C(.ckpt), ...) unless O(allow_pickle),
    unpinned revisions unless O(allow_unpinned), and checks free space before fetching anything.
  - Writes the node's status (C(Pending), C(Downloading) with progress, C(Ready), C(Failed)) to
    C(<parent of local_dir>/.shadowline-model-<name>.status.json) so a controller can poll it and gate
    engine start on every node being Ready with the same digest.
  - Thin wrapper over the C(shadowline.model) library (C(plugins/module_utils/shadowline/model));
    C(docs/model.md) in the collection describes the layout, the status file, progress polling and the readiness gate.
options:
  model:
    description:
      - The model, as in the inventory variable C(gms_model) (pass it whole).
      - C(id) (required) repo id such as C(meta-llama/Llama-3.3-70B-Instruct).
      - C(revision) (required) the 40-hex commit id to pin.
      - C(local_dir) (required) absolute node-local directory to stage into.
      - C(source) URI, default C(hf://<id>). One of C(hf://<repo>) (Hugging Face Hub or a mirror),
        C(file:///<path>) (a directory every node sees, copied),
        C(rsync://<host>[:<port>]/<module>/<path>) (pull from an rsync daemon) or
        C(rsync+ssh://[<user>@]<host>[:<port>]/<absolute path>) (pull over ssh with keys).
      - C(format) C(safetensors) (default) or C(pytorch) (pickle; needs O(allow_pickle)).
      - Other keys are ignored, so the whole C(gms_model) can be passed.
    type: dict
    required: true
  allow_pickle:
    description:
      - Allow pickle weight files and O(model) C(format=pytorch) (C(gms_model_allow_pickle)).
      - Loading pickle runs arbitrary code; leave false unless the model exists only as pickle.
    type: bool
    default: false
  allow_unpinned:
    description:
      - Allow a O(model) C(revision) that is not a 40-hex commit (a branch or tag; C(gms_model_allow_unpinned)).
      - For C(hf://) the branch is resolved to a commit and that commit is recorded; nodes staged at
        different times may differ, which the readiness gate then refuses.
    type: bool
    default: false
  verify:
    description:
      - How an existing copy is re-verified (C(gms_model_verify)).
      - C(fast) compares size, mtime, ctime and inode with the manifest and rehashes only files whose
        keys changed. C(full) rehashes every file and checks every safetensors header.
      - With C(full) a fresh staging also reads every staged file back.
    type: str
    choices: [fast, full]
    default: fast
  hf_token_file:
    description:
      - Path on the node of a root-only file (mode 0600) holding the Hugging Face token
        (C(gms_model_hf_token_file)). Only used for C(hf://) sources.
      - The token is never logged, never put on a command line and never returned. The path itself is
        treated as secret too (C(no_log)), so Ansible masks it in results, logs and messages.
      - When unset, huggingface_hub's defaults apply (C(HF_TOKEN) or a stored login, else anonymous).
    type: path
  hf_endpoint:
    description:
      - Hub endpoint for C(hf://) sources, for an on-premises mirror. Defaults to C(HF_ENDPOINT) or the public Hub.
    type: str
  allow_patterns:
    description:
      - Glob patterns of the files to stage, replacing the default set.
      - Default for C(safetensors) is C(*.safetensors), C(*.json), C(tokenizer.model), C(*.tiktoken),
        C(*.model), C(merges.txt), C(vocab.txt), C(*.jinja); C(pytorch) adds C(*.bin), C(*.pt), C(*.pth).
    type: list
    elements: str
  workers:
    description:
      - Parallel copy/hash/download threads; 0 picks a default from the CPU count (8 for Hub downloads).
    type: int
    default: 0
  progress_interval:
    description:
      - Seconds between progress writes to the status file while downloading.
    type: float
    default: 2.0
  state:
    description:
      - C(present) stages and verifies. C(absent) removes O(model) C(local_dir) (only if it has a shadowline
        manifest), staging leftovers and the status file.
    type: str
    choices: [present, absent]
    default: present
requirements:
  - Python 3.11 on the node.
  - C(huggingface_hub>=0.23) on the node for C(hf://) sources.
  - The C(rsync) command on the node for C(rsync://) and C(rsync+ssh://) sources.
attributes:
  platform:
    platforms: posix
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Lists the source (metadata only) and reports what would be fetched; downloads and writes nothing.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details: Before/after manifest digest, revision and a file list summary.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
author:
  - shadowline contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Stage the pinned model (the whole inventory contract in one call)
  shadowline.gms.model_stage:
    model: "{{ gms_model }}"
    allow_pickle: "{{ gms_model_allow_pickle | default(false) }}"
    allow_unpinned: "{{ gms_model_allow_unpinned | default(false) }}"
    verify: "{{ gms_model_verify | default('fast') }}"
    hf_token_file: "{{ gms_model_hf_token_file | default(omit) }}"
  register: model_staged

- name: Stage from a shared filesystem
  shadowline.gms.model_stage:
    model:
      id: meta-llama/Llama-3.3-70B-Instruct
      revision: 6f6073b423013f6a7d4d9f39144961bfbfbc386b
      source: file:///shared/models/llama-3.3-70b
      local_dir: /var/lib/shadowline/models/llama-3.3-70b

- name: Pull from the head node's rsync daemon (air-gapped)
  shadowline.gms.model_stage:
    model:
      id: meta-llama/Llama-3.3-70B-Instruct
      revision: 6f6073b423013f6a7d4d9f39144961bfbfbc386b
      source: rsync://head-0:873/models/llama-3.3-70b
      local_dir: /var/lib/shadowline/models/llama-3.3-70b
    verify: full

- name: Stage in the background and poll the status file for progress
  shadowline.gms.model_stage:
    model: "{{ gms_model }}"
  async: 86400
  poll: 0
  register: model_job

- name: Wait for the model (its status file holds bytes done, rate and time left)
  ansible.builtin.slurp:
    src: "{{ gms_model.local_dir | dirname }}/.shadowline-model-{{ gms_model.local_dir | basename }}.status.json"
  register: model_status
  until: (model_status.content | b64decode | from_json).state in ['Ready', 'Failed']
  retries: 2880
  delay: 30

- name: Remove the model from the node
  shadowline.gms.model_stage:
    model: "{{ gms_model }}"
    state: absent
"""

RETURN = r"""
status:
  description: Node state of the model after the run (C(Ready)); C(Pending) in check mode when staging is needed; C(Absent) for O(state=absent).
  returned: always
  type: str
  sample: Ready
digest:
  description: Manifest digest, C(sha256:) over the sorted C(<sha256> <size> <path>) lines; equal on every node with the same content.
  returned: success, when the model is staged
  type: str
  sample: sha256:2e192a874aed050515bbe4db258b91cd10cff22180eb918e0187ee5d5ab85df6
revision:
  description: The commit staged (an unpinned branch resolved to its commit for hf:// sources).
  returned: always
  type: str
  sample: 6f6073b423013f6a7d4d9f39144961bfbfbc386b
model_id:
  description: The model id.
  returned: always
  type: str
  sample: meta-llama/Llama-3.3-70B-Instruct
total_bytes:
  description: Bytes of all staged files (planned files in check mode).
  returned: always
  type: int
  sample: 141107650560
weight_bytes:
  description: Bytes of the weight files only.
  returned: always
  type: int
  sample: 141107400000
files:
  description: Number of staged files (planned files in check mode).
  returned: always
  type: int
  sample: 37
local_dir:
  description: The staged directory.
  returned: always
  type: str
  sample: /var/lib/shadowline/models/llama-3.3-70b
manifest_path:
  description: Path of C(shadowline-manifest.json).
  returned: always
  type: str
  sample: /var/lib/shadowline/models/llama-3.3-70b/shadowline-manifest.json
status_path:
  description: Path of the node's status file (poll it for progress).
  returned: always
  type: str
  sample: /var/lib/shadowline/models/.shadowline-model-llama-3.3-70b.status.json
actions:
  description: What was done (or would be done in check mode).
  returned: always
  type: list
  elements: str
notes:
  description: Remarks, e.g. a source without manifest whose revision is taken on trust.
  returned: always
  type: list
  elements: str
repaired:
  description: Files found damaged, extra or missing and fetched again (or removed).
  returned: always
  type: list
  elements: str
fetched_bytes:
  description: Bytes fetched in this run (in check mode, the bytes a run would fetch).
  returned: always
  type: int
fetch_seconds:
  description: Time spent fetching.
  returned: always
  type: float
verify_seconds:
  description: Time spent verifying.
  returned: always
  type: float
hashed_bytes:
  description: Bytes hashed in this run (0 for a fast re-verify of an unchanged model).
  returned: always
  type: int
field:
  description: On failure, the inventory field at fault (for example C(gms_model.revision)).
  returned: failure
  type: str
  sample: gms_model.revision
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.model.errors import ModelError
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.model.spec import (
    spec_from_inventory,
    status_path_for,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.model.stage import (
    ensure_model,
    remove_model,
)


def _diff_text(view):
    if not view:
        return "(no model staged)\n"
    lines = [
        "model: %s" % view.get("model_id"),
        "revision: %s" % view.get("revision"),
        "digest: %s" % (view.get("digest") or "(computed after staging)"),
        "files: %s, total_bytes: %s" % (view.get("files"), view.get("total_bytes")),
    ]
    lines += ["  " + line for line in view.get("file_list", [])]
    return "\n".join(lines) + "\n"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            model=dict(type="dict", required=True),
            allow_pickle=dict(type="bool", default=False),
            allow_unpinned=dict(type="bool", default=False),
            verify=dict(type="str", default="fast", choices=["fast", "full"]),
            hf_token_file=dict(type="path", no_log=True),
            hf_endpoint=dict(type="str"),
            allow_patterns=dict(type="list", elements="str"),
            workers=dict(type="int", default=0),
            progress_interval=dict(type="float", default=2.0),
            state=dict(type="str", default="present", choices=["present", "absent"]),
        ),
        supports_check_mode=True,
    )
    params = module.params
    local_dir = (params["model"] or {}).get("local_dir") or ""
    try:
        spec = spec_from_inventory(
            params["model"],
            allow_pickle=params["allow_pickle"],
            allow_unpinned=params["allow_unpinned"],
            verify=params["verify"],
            hf_token_file=params["hf_token_file"],
            allow_patterns=params["allow_patterns"],
            hf_endpoint=params["hf_endpoint"],
            workers=params["workers"],
        )
        if params["state"] == "absent":
            result = remove_model(spec, check_mode=module.check_mode)
        else:
            result = ensure_model(
                spec,
                check_mode=module.check_mode,
                progress_interval=params["progress_interval"],
            )
    except ModelError as exc:
        module.fail_json(
            msg=str(exc),
            field=exc.field,
            fix=exc.fix,
            status="Failed",
            status_path=status_path_for(local_dir) if local_dir else None,
        )
    except Exception as exc:  # pylint: disable=broad-except
        module.fail_json(msg="model_stage failed unexpectedly: %s: %s" % (type(exc).__name__, exc), status="Failed")
    out = result.as_dict()
    if module._diff:
        out["diff"] = dict(
            before_header="%s (before)" % result.local_dir,
            after_header="%s (after)" % result.local_dir,
            before=_diff_text(result.before),
            after=_diff_text(result.after),
        )
    module.exit_json(**out)


if __name__ == "__main__":
    main()
