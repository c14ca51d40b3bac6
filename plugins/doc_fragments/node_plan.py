"""Options shared by the modules that run on a node against the cohort plan (cohort_info, drill_probe,
fault_inject): ``extends_documentation_fragment: shadowline.gms.node_plan``."""


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  plan:
    description: The cohort plan (the C(gms_plan) fact set by C(playbooks/preflight.yml)).
    type: dict
    required: true
  host:
    description: This node's name in the plan (its inventory name).
    type: str
    required: true
"""
