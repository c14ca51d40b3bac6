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
  - Ownership - a directory of I(directories) with C(mark=true) that this module creates gets a marker file
    (I(marker), holding I(owner), the deployment's name); a directory that was already there gets none, since
    the deployment did not create it. I(owned_absent) removes a directory only when it holds such a marker naming
    its owner, so that teardown removes what the deployment created and nothing else; every directory kept is
    returned in C(kept) with the reason, and said in a warning.
options:
  absent:
    description:
      - Paths to remove, first; one that does not exist is no change. Only for paths whose names the deployment
        made (its unit files, drop-ins and tmpfiles.d entry); a directory a user may have named goes in
        I(owned_absent).
    type: list
    elements: path
    default: []
  owned_absent:
    description:
      - Directories to remove (the whole tree) only when they prove that their owner created them. A directory
        is removed when it holds the marker file (a regular file, not a link) and the marker names the owner -
        its whole text (trimmed) is I(owner), or, with I(key), it is a JSON object whose I(key) is I(owner).
      - Anything else is kept and returned in C(kept) with the reason (no marker, another owner, a link, not a
        directory); a path that does not exist is no change. Never the root.
      - Removed after I(absent), before I(directories) are made.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The directory.
        type: path
        required: true
      marker:
        description: The marker file's name in the directory; the module's I(marker) when unset.
        type: str
      owner:
        description: What the marker must name; the module's I(owner) when unset.
        type: str
      key:
        description:
          - The marker is a JSON object and its value at I(key) must be the owner (e.g. C(model_id) of the model
            staging manifest C(shadowline-manifest.json)); unset, the marker's whole text is the owner.
        type: str
  owner:
    description:
      - The owner that markers name (the deployment's name). Required with C(mark=true) in I(directories) and
        with an I(owned_absent) entry that has no owner of its own.
    type: str
  marker:
    description: The name of the marker file that I(directories) write and I(owned_absent) look for.
    type: str
    default: .shadowline-deployment
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
      mark:
        description:
          - Write the marker file (I(marker), holding I(owner), root 0644) into the directory when this module
            creates it, so that I(owned_absent) may later remove it. A directory that exists already is not
            marked (C(owned) does not list it), and one whose marker names another owner fails the task (two
            deployments cannot share a directory).
        type: bool
        default: false
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

- name: Create a deployment's state directory, marked as the deployment's own when created here
  shadowline.gms.install_files:
    owner: demo
    directories:
      - {path: /var/lib/shadowline/demo, owner: shadowline, group: shadowline, mode: "0750", mark: true}

- name: Remove the deployment's directories, and its model only if shadowline staged that model there
  shadowline.gms.install_files:
    owner: demo
    absent: [/etc/tmpfiles.d/shadowline-demo.conf]
    owned_absent:
      - {path: /var/lib/shadowline/demo}
      - {path: /run/shadowline/demo/gms}
      - {path: /srv/models/llama/rev, marker: shadowline-manifest.json, key: model_id, owner: meta-llama/Llama-3.3-70B}
  register: removed
"""

RETURN = r"""
changed_paths:
  description: Every path that was removed, and every directory and file that was created or changed (content,
    owner, group or mode), in order.
  returned: always
  type: list
  elements: str
owned:
  description: The directories of I(directories) with C(mark=true) that hold the marker naming I(owner) after the
    run (in check mode, also those the run would create), in order; those that existed before without it are not.
  returned: always
  type: list
  elements: str
kept:
  description: The directories of I(owned_absent) that exist but were not removed, each with the reason.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The directory.
      type: str
    reason:
      description: Why it was kept (no marker, another owner, a link, not a directory).
      type: str
  sample: [{path: /tmp/victim/gms, reason: "holds no .shadowline-deployment (demo did not create it)"}]
"""

import json
import os
import shutil
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_native

MARKER = ".shadowline-deployment"  # a deployment's directory made by this module: the file holds its name
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


def read_marker(directory: str, marker: str) -> str | None:
    """The text of ``directory``'s marker file; None when there is none or it is not a regular file (a link is
    never followed)."""
    try:
        fd = os.open(os.path.join(directory, marker), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return handle.read().decode("utf-8", errors="replace")


def not_owned(path: str, marker: str, owner: str, key: str | None) -> str | None:
    """Why ``path`` cannot be proven to be ``owner``'s (its marker file does not name it); None when it can."""
    if os.path.islink(path):
        return "is a symbolic link"
    if not os.path.isdir(path):
        return "is not a directory"
    text = read_marker(path, marker)
    if text is None:
        return f"holds no {marker} ({owner} did not create it)"
    if key is None:
        named = text.strip()
    else:
        try:
            data = json.loads(text)
        except ValueError:
            return f"has a {marker} that is not JSON"
        named = data.get(key) if isinstance(data, dict) else None
    if named != owner:
        return f"has a {marker} naming {named!r}, not {owner}"
    return None


def ensure_owned_absent(module: AnsibleModule, entry: dict, diffs: list[dict], kept: list[dict]) -> bool:
    path = os.path.normpath(entry["path"])
    owner = entry.get("owner") or module.params["owner"]
    if not owner:
        module.fail_json(msg=f"owned_absent {path}: no owner (set owner, or the entry's owner)")
    if path == "/":
        module.fail_json(msg="owned_absent: refusing to remove /")
    if not os.path.lexists(path):
        return False
    reason = not_owned(path, entry.get("marker") or module.params["marker"], owner, entry.get("key"))
    if reason is not None:
        kept.append({"path": path, "reason": reason})
        module.warn(f"kept {path}: it {reason}. Remove it by hand if nothing uses it.")
        return False
    diffs.append({"before_header": path, "after_header": path, "before": {"state": "directory", "owner": owner},
                  "after": {"state": "absent"}})
    if not module.check_mode:
        shutil.rmtree(path)
    return True


def ensure_directory(module: AnsibleModule, entry: dict, diffs: list[dict], owned: list[str]) -> bool:
    path = entry["path"]
    marker, owner = module.params["marker"], module.params["owner"]
    if entry.get("mark") and not owner:
        module.fail_json(msg=f"{path}: mark needs the module's owner")
    if os.path.isdir(path):
        if entry.get("mark"):
            text = read_marker(path, marker)
            if text is not None and text.strip() != owner:
                module.fail_json(msg=f"{path} holds the marker of {text.strip()!r}, not {owner}: two deployments "
                                     "cannot share a directory")
            if text is not None:
                owned.append(path)
        return module.set_fs_attributes_if_different(fs_attributes(module, entry), False)
    if os.path.lexists(path):
        module.fail_json(msg=f"{path} exists and is not a directory")
    diffs.append({"before_header": path, "after_header": path, "before": {"state": "absent"},
                  "after": {"state": "directory", **({"marker": owner} if entry.get("mark") else {})}})
    if entry.get("mark"):
        owned.append(path)
    if not module.check_mode:
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        os.mkdir(path, 0o700)  # attributes follow, before anything is put into it
        if entry.get("mark"):  # made here: the deployment's own, which teardown may remove
            fd = os.open(os.path.join(path, marker), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w") as handle:
                handle.write(f"{owner}\n")
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
            "owned_absent": {"type": "list", "elements": "dict", "default": [],
                             "options": {"path": {"type": "path", "required": True}, "marker": {"type": "str"},
                                         "owner": {"type": "str"}, "key": {"type": "str", "no_log": False}}},
            "owner": {"type": "str"},
            "marker": {"type": "str", "default": MARKER},
            "directories": {"type": "list", "elements": "dict", "default": [],
                            "options": {**ATTRIBUTES, "mark": {"type": "bool", "default": False}}},
            "files": {"type": "list", "elements": "dict", "default": [],
                      "options": {**ATTRIBUTES, "content": {"type": "str", "required": True}}},
        },
        supports_check_mode=True,
    )
    changed_paths: list[str] = []
    diffs: list[dict] = []
    owned: list[str] = []
    kept: list[dict] = []
    for path in module.params["absent"]:
        if ensure_absent(module, path, diffs):
            changed_paths.append(path)
    for entry in module.params["owned_absent"]:
        if ensure_owned_absent(module, entry, diffs, kept):
            changed_paths.append(os.path.normpath(entry["path"]))
    for entry in module.params["directories"]:
        if ensure_directory(module, entry, diffs, owned):
            changed_paths.append(entry["path"])
    for entry in module.params["files"]:
        if ensure_file(module, entry, diffs):
            changed_paths.append(entry["path"])
    result = {"changed": bool(changed_paths), "changed_paths": changed_paths, "owned": owned, "kept": kept}
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
