"""End-to-end tests on the multi-host testbed (root only): .venv/bin/pytest -q tests/e2e"""
