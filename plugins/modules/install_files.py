#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: install_files
short_description: Remove paths, create directories and write files with given contents, owners and modes, in one task
version_added: "0.1.0"
description:
  - Removes each of I(absent) (a file, a link or a whole directory tree), then makes sure each of I(directories)
    exists and that each of I(files) holds exactly its I(content), with the given owner, group and mode; a file
    is replaced (atomically) only when its content differs.
  - What C(ansible.builtin.file) with C(state=absent) or C(state=directory) and C(ansible.builtin.copy) with
    C(content) do, for many paths at once - one module run on the host instead of two or three per path, which is what a role's
    cost is made of when it installs a unit and a drop-in per cohort.
  - Reports which paths changed (C(changed_paths)), so that a role restarts only what uses them.
options:
  absent:
    description: Paths to remove, first; one that does not exist is no change.
    type: list
    elements: path
    default: []
  directories:
    description:
      - Directories to create, in order; missing parents are created too (root, mode 0755 under the usual
        umask), as C(ansible.builtin.file) with C(state=directory) does.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The directory.
        type: path
        required: true
      owner:
        description: Its owner; unchanged when unset.
        type: str
      group:
        description: Its group; unchanged when unset.
        type: str
      mode:
        description: Its mode, e.g. C("0750"); unchanged when unset.
        type: raw
  files:
    description: Files to write, after the directories, in order. Their directories must exist (or be listed in
      I(directories)).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The file.
        type: path
        required: true
      content:
        description: Its whole content (text, written as UTF-8).
        type: str
        required: true
      owner:
        description: Its owner; unchanged when unset (root for a new file written by root).
        type: str
      group:
        description: Its group; unchanged when unset.
        type: str
      mode:
        description: Its mode, e.g. C("0644"); unchanged when unset.
        type: raw
attributes:
  platform:
    platforms: posix
  check_mode:
    support: full
  diff_mode:
    support: full
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
- name: Install a template unit and one drop-in per cohort
  shadowline.gms.install_files:
    directories:
      - {path: /etc/systemd/system/demo@0.service.d, owner: root, group: root, mode: "0755"}
    files:
      - {path: /etc/systemd/system/demo@.service, content: "[Unit]\n", owner: root, group: root, mode: "0644"}
      - {path: /etc/systemd/system/demo@0.service.d/plan.conf, content: "[Service]\n", mode: "0644"}
  register: installed
"""

RETURN = r"""
changed_paths:
  description: Every path that was removed, and every directory and file that was created or changed (content,
    owner, group or mode), in order.
  returned: always
  type: list
  elements: str
"""

import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_native

ATTRIBUTES = {"path": {"type": "path", "required": True}, "owner": {"type": "str"}, "group": {"type": "str"},
              "mode": {"type": "raw"}}


def fs_attributes(module: AnsibleModule, entry: dict) -> dict:
    """The file arguments AnsibleModule.set_fs_attributes_if_different expects (owner, group, mode; no SELinux
    context or attributes of its own)."""
    return module.load_file_common_arguments({k: entry.get(k) for k in ("owner", "group", "mode")}, entry["path"])


def ensure_absent(module: AnsibleModule, path: str, diffs: list[dict]) -> bool:
    if not os.path.lexists(path):
        return False
    diffs.append({"before_header": path, "after_header": path, "before": {"state": "present"},
                  "after": {"state": "absent"}})
    if not module.check_mode:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    return True


def ensure_directory(module: AnsibleModule, entry: dict, diffs: list[dict]) -> bool:
    path = entry["path"]
    if os.path.isdir(path):
        return module.set_fs_attributes_if_different(fs_attributes(module, entry), False)
    if os.path.lexists(path):
        module.fail_json(msg=f"{path} exists and is not a directory")
    diffs.append({"before_header": path, "after_header": path, "before": {"state": "absent"},
                  "after": {"state": "directory"}})
    if not module.check_mode:
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        os.mkdir(path, 0o700)  # attributes follow, before anything is put into it
        module.set_fs_attributes_if_different(fs_attributes(module, entry), True)
    return True


def ensure_file(module: AnsibleModule, entry: dict, diffs: list[dict]) -> bool:
    path = entry["path"]
    wanted = to_bytes(entry["content"], errors="surrogate_or_strict")
    directory = os.path.dirname(path) or "/"
    if os.path.lexists(path) and not os.path.isfile(path):
        module.fail_json(msg=f"{path} exists and is not a regular file")
    current = None
    if os.path.isfile(path):
        with open(path, "rb") as handle:
            current = handle.read()
    elif not os.path.isdir(directory) and not module.check_mode:
        module.fail_json(msg=f"the directory of {path} does not exist")
    changed = current != wanted
    if changed:
        diffs.append({"before_header": path, "after_header": path,
                      "before": "" if current is None else to_native(current, errors="surrogate_or_replace"),
                      "after": entry["content"]})
        if not module.check_mode:
            fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(wanted)
                module.atomic_move(tmp, path, unsafe_writes=False)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    if module.check_mode and current is None:
        return True
    return module.set_fs_attributes_if_different(fs_attributes(module, entry), changed)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "absent": {"type": "list", "elements": "path", "default": []},
            "directories": {"type": "list", "elements": "dict", "default": [], "options": ATTRIBUTES},
            "files": {"type": "list", "elements": "dict", "default": [],
                      "options": {**ATTRIBUTES, "content": {"type": "str", "required": True}}},
        },
        supports_check_mode=True,
    )
    changed_paths: list[str] = []
    diffs: list[dict] = []
    for path in module.params["absent"]:
        if ensure_absent(module, path, diffs):
            changed_paths.append(path)
    for entry in module.params["directories"]:
        if ensure_directory(module, entry, diffs):
            changed_paths.append(entry["path"])
    for entry in module.params["files"]:
        if ensure_file(module, entry, diffs):
            changed_paths.append(entry["path"])
    result = {"changed": bool(changed_paths), "changed_paths": changed_paths}
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
