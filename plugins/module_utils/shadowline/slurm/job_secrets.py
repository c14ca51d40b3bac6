"""A Slurm job's own credentials (issue #13), made by the supervisor when the job starts; never in the script.

A deployment made with ``playbooks/site.yml`` gets its credentials from the controller (deployment/secrets.py);
a Slurm job gets the same set, made by the same code, for the job alone: ``make_bundle`` runs ``ensure_secrets``
on a plan whose controller directory is a private scratch directory of the batch node, for the allocation's
addresses: etcd passwords for root, agent and dynamo, the engines' environment file (ETCD_AUTH_USERNAME and
ETCD_AUTH_PASSWORD), a CA of the job's own, and each node's client and server certificates naming its address.

The bundle is a tar with one directory per node, ``node-<rank>/`` holding what ``host_files`` gives that node
(but root's etcd password); the supervisor copies it to every node's node directory (0700) with sbcast, and each
node's ``secrets`` task keeps its own directory in ``<node_dir>/config/secrets`` (umask 077: readable by the
job's user only) and deletes the bundle. The scratch directory, the CA's key with it, is removed once the
bundle is written: nothing can issue another certificate of the job's CA, and the job's credentials end with
its node directories (the cleanup step). root's password stays in the supervisor's memory, which turns etcd's
authentication on with it (cluster/access.py ``ensure_etcd_auth``, the etcd role's code).

Needs the ``cryptography`` package in the supervisor's interpreter (``gms_slurm.python``, else ``gms_python``:
the runtime's requirements list it).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tarfile
import tempfile

from ..cluster.access import read_secret
from ..deployment.plan import ETCD_USERS, Plan
from ..deployment.secrets import ensure_secrets, host_files

BUNDLE = "secrets.tar"  # in the node directory, from the supervisor's sbcast until the node's secrets task
KEPT_BY_THE_SUPERVISOR = ("etcd-root.password",)


def make_bundle(plan: Plan, bundle: str) -> dict[str, str]:
    """Write the job's credentials for every node of ``plan`` (the concrete plan: the allocation's addresses) into
    the tar ``bundle``; return the etcd passwords by user, which the caller must never print."""
    if not plan.secure or plan.security is None:
        raise ValueError("the plan is insecure (gms_insecure: true): a job without credentials has no bundle")
    scratch = tempfile.mkdtemp(prefix="shadowline-job-secrets-")  # 0700
    try:
        job_plan = dataclasses.replace(plan, security=dataclasses.replace(plan.security, controller_dir=scratch))
        ensure_secrets(job_plan)
        passwords = {user: read_secret(os.path.join(scratch, f"etcd-{user}.password")) for user in ETCD_USERS}
        fd = os.open(bundle, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle, tarfile.open(fileobj=handle, mode="w") as tar:
            for node in plan.nodes:
                for entry in host_files(job_plan, node.host):
                    name = os.path.basename(entry["dest"])
                    if name in KEPT_BY_THE_SUPERVISOR:
                        continue
                    info = tar.gettarinfo(entry["src"], arcname=f"node-{node.rank}/{name}")
                    info.mode = int(entry["mode"], 8)
                    info.uid, info.gid, info.uname, info.gname = os.getuid(), os.getgid(), "", ""
                    with open(entry["src"], "rb") as source:
                        tar.addfile(info, source)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return passwords
