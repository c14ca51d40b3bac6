# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of shadowline.gms.show: print text as lines a person reads (a table stays a table), not as a
JSON-quoted list the way ansible.builtin.debug shows a multi-line message."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        _unused, args = self.validate_argument_spec(argument_spec={"text": {"type": "str", "required": True}})
        lines = str(args["text"]).rstrip("\n").split("\n")
        display.display("\n".join(lines))
        result.update(changed=False, lines=lines)
        return result
