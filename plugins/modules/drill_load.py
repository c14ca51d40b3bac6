#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin plugins/action/drill_load.py, on the controller; this file documents it.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: drill_load
short_description: Constant request load through the Dynamo frontend, from the controller, in the background
version_added: "0.1.0"
description:
  - I(state=started) starts a load generator on the controller (C(python -m shadowline.drill.load)) that sends
    I(rate) chat completions per second to the frontend, open loop (a request is sent on time whatever happened
    to the ones before), for at most I(duration_s) seconds and I(max_requests) requests, and returns at once.
  - I(state=stopped) waits until I(stop_at), stops it, waits for the requests in flight (each at most
    I(timeout_s)) and returns every request with its start, end, HTTP status and error.
  - Requests go through the official OpenAI Python SDK with its stock retry policy where the controller has it
    (every other request streaming), and each records its first attempt too, so the summary gives both
    C(failed_sdk) (what an application using the SDK saw) and C(failed_raw) (what a client without retries saw);
    without the SDK, one plain attempt per request (C(failed_sdk) then equals C(failed_raw)).
  - Runs on the controller (an action plugin); nothing is installed anywhere. Sends nothing in check mode.
options:
  state:
    description: C(started) or C(stopped).
    type: str
    default: started
    choices: [started, stopped]
  url:
    description: The frontend URL (C(gms_plan.infra.frontend_url)).
    type: str
  model:
    description: The served model name (C(gms_plan.model_id)).
    type: str
  tls:
    description:
      - An https:// frontend (C(gms_frontend_tls)) - C(ca), C(cert) and C(key), paths on the controller of the
        deployment's CA and of the client certificate to present; empty for plain HTTP.
      - The C(tls) of C(gms_plan | shadowline.gms.frontend_endpoint('controller')).
    type: dict
    default: {}
  rate:
    description: Requests per second.
    type: float
    default: 20
  duration_s:
    description: The load never runs longer than this.
    type: float
    default: 30
  max_requests:
    description: The load never sends more than this; default I(rate) x I(duration_s).
    type: int
  timeout_s:
    description: A request without an answer after this long counts as failed.
    type: float
    default: 5
  pid:
    description: With I(state=stopped), the C(pid) I(state=started) returned.
    type: int
  out:
    description: With I(state=stopped), the C(out) I(state=started) returned.
    type: str
  stop_at:
    description: With I(state=stopped), the unix time to stop sending at (at most 60 s from now).
    type: float
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - shadowline.gms.controller_action
author:
  - shadowline contributors (@shadowline)
"""

EXAMPLES = r"""
- name: Start 20 requests per second for at most 30 s
  shadowline.gms.drill_load:
    url: "{{ gms_plan.infra.frontend_url }}"
    model: "{{ gms_plan.model_id }}"
  run_once: true
  register: load

- name: Stop it two seconds from now and collect the requests
  shadowline.gms.drill_load:
    state: stopped
    pid: "{{ load.pid }}"
    out: "{{ load.out }}"
    stop_at: "{{ load.started_at + 2 }}"
  run_once: true
  register: requests
"""

RETURN = r"""
pid:
  description: The load generator's pid on the controller.
  returned: state=started
  type: int
out:
  description: The file it writes the requests to (removed by I(state=stopped)).
  returned: state=started
  type: str
started_at:
  description: Unix time it started.
  returned: state=started
  type: float
requests:
  description:
    - Every request - seq, start, end (unix time), status (0 without an HTTP answer), ok, error;
    - attempts, first_ok (the first attempt's outcome; null for a plain request), stream.
  returned: state=stopped
  type: list
  elements: dict
summary:
  description:
    - sent, ok, failed, first_start, last_end, median_latency_s;
    - "failed_sdk (failed after the OpenAI SDK's retries), failed_raw (failed at the first attempt, what a client
      without retries saw), streams (requests that streamed), retried (requests the SDK sent more than once)."
  returned: state=stopped
  type: dict
"""
