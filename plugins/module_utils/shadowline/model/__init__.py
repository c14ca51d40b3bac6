"""Model lifecycle: stage the exact pinned model onto every node's local disk, verified.

Modules (each small, named for what it does):

- ``spec``: ``ModelSpec`` and source URIs (``hf://``, ``file://``, ``rsync://``, ``rsync+ssh://``).
- ``policy``: refusals (pickle weights, unpinned revisions, formats), file selection, free space.
- ``hashing``: sha256 of files in a thread pool with large buffers; copy-while-hashing.
- ``safetensors_header``: cheap structural check of ``*.safetensors`` files.
- ``manifest``: ``shadowline-manifest.json`` (files, sizes, sha256, stat keys, digest).
- ``verify``: fast (stat keys) and full (rehash) verification of a staged directory.
- ``journal``: the staging journal that lets an interrupted staging resume.
- ``progress``: byte progress, rate and time left, reported through a callback.
- ``status``: the per-node status file (Pending, Downloading, Ready, Failed).
- ``readiness``: ``readiness_gate`` over all nodes' statuses.
- ``report``: the controller's table of every node's model and the progress line of a running staging.
- ``fetch_file``, ``fetch_hf``, ``fetch_rsync``: the sources.
- ``stage``: ``ensure_model`` / ``remove_model``, the one entry point callers need; ``stage_result``: what a run reports.

Nothing here imports Ansible; imports inside the package are relative.
"""
