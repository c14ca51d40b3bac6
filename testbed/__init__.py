"""The shadowline multi-host testbed: see testbed/testbed.py and docs/testbed.md."""
