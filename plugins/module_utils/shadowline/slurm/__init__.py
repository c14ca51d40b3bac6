"""Slurm side of shadowline: rendering batch scripts, the batch supervisor, and the helpers steps and drills run.

Stdlib only, no Ansible. ``job``/``options`` build what slurm/render lays out (login node); ``supervisor`` runs in
the batch step (``python -m shadowline.slurm.supervisor SCRIPT``); ``node_tasks`` and ``fault`` run as tasks on
the nodes; ``drill`` and ``load`` measure a failover from outside (slurm/drill).
"""
