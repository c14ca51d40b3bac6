"""Slurm side of shadowline: rendering batch scripts, the batch supervisor, and the helpers its steps run.

Stdlib only, no Ansible. ``job``/``options``/``allocation`` build what slurm/render lays out (login node). The
batch step runs ``python -m shadowline.slurm.supervisor SCRIPT``: ``supervisor`` (the loop) over ``job_start``
(allocation, secrets, infra, cohorts), ``steps`` (srun steps), ``watch`` (states, leases, ended steps and
relaunches, decided by ``slots.relaunch_decision`` with the agent's own RelaunchPolicy), ``leases`` and
``shutdown``, sharing ``job_state``. ``watchdog`` wraps each rank, ``keeper`` each node's GMS server;
``node_tasks`` run as tasks on the nodes. The drills that measure a job from outside are drill/slurm.py
(slurm/drill).
"""
