"""Attributes shared by the modules that run on the controller as action plugins (cohort_plan, drill_load,
drill_report, preflight, readiness_gate): ``extends_documentation_fragment: shadowline.gms.controller_action``
after ansible-core's ``action_common_attributes`` and ``action_common_attributes.flow``, which describe them."""


class ModuleDocFragment:
    DOCUMENTATION = r"""
options: {}
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""
