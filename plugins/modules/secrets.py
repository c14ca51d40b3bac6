# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of shadowline.gms.secrets (an action plugin: it runs on the controller)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: secrets
short_description: Create a deployment's credentials on the controller and install this host's share
version_added: 0.2.0
description:
  - Creates, once, in the plan's controller directory (C(gms_secrets_dir), default C(~/.shadowline/secrets/<deployment>))
    the etcd passwords of the identities C(root), C(agent) and C(dynamo), the engines' environment file, and a
    certificate authority of the deployment with a NATS client certificate for every host and a server certificate
    for every infra host. Files are 0600 (certificates 0644) in 0700 directories. Existing files are kept; a
    certificate is issued again when its host's address changed or it expires within 30 days.
  - Installs on the host what runs there needs, under the plan's C(security.dir) (root:<service user> 0750) - the
    etcd passwords, the engines' environment file, the CA certificate and the host's certificates and keys -
    each 0600 (certificates 0644) and owned by the user that reads it, in one run of M(shadowline.gms.install_files).
  - Returns paths only. Never returns or prints a password or a key; use it with C(no_log=true) all the same.
  - Does nothing for a plan with C(gms_insecure=true).
options:
  plan:
    description: The cohort plan (C(gms_plan)) from M(shadowline.gms.preflight).
    type: dict
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - shadowline.gms.controller_action
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
- name: Install this host's credentials
  shadowline.gms.secrets:
    plan: "{{ gms_plan }}"
  no_log: true
"""

RETURN = r"""
paths:
  description: The credential files on the host.
  returned: success
  type: list
  elements: str
  sample: ["/etc/shadowline/llama/secrets/ca.crt", "/etc/shadowline/llama/secrets/client.key"]
controller_dir:
  description: The controller directory that holds the deployment's secrets.
  returned: success
  type: str
  sample: /root/.shadowline/secrets/llama
created_on_controller:
  description: The files this run created on the controller.
  returned: success
  type: list
  elements: str
"""
