"""Slurm side of shadowline: the batch supervisor, the rendering of batch scripts, the helpers steps run.

Stdlib only, no Ansible: these modules run in the batch step (``python -m shadowline.slurm.supervisor``), in
tasks on the nodes (``python -m shadowline.slurm.node_task``), and on the login node (``slurm/render``,
``slurm/drill``).
"""
